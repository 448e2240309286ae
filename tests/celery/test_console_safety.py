"""The lock console as a web page's visitor meets it, over plain HTTP against a real Redis:
``locks serve`` answers only its own host names (DNS rebinding), a refusal says nothing of a
command-line ``--force``, and a holder whose worker node answers a ping is not offered for
release (the in-process worker answers it for real)."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import pytest
from celery import Celery

from celery_singleton_lock.celery.cli.console import LockConsole, make_console, served_names
from celery_singleton_lock.celery.config.lockers import locker_for
from celery_singleton_lock.celery.observe.serving import quiet_server
from celery_singleton_lock.engine import Owner, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer, free_port
from tests.celery.test_celery_locks import REPO, entry_points_dir  # noqa: F401 - the fixture
from tests.support import wait_until

#: a lock taken outside a worker: its host is no worker node, so it cannot be asked
OUTSIDE = Owner(task_id="t-outside", host="build-box", pid=4242)

Serve = Callable[..., int]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """``serve(app, **options)``: a console on a free loopback port; its port."""
    started: list[tuple[Any, LockConsole]] = []

    def start(app: Celery, **options: Any) -> int:
        console = make_console(app, ping_timeout=2.0, **options)
        server = quiet_server("127.0.0.1", 0, console)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append((server, console))
        return int(server.server_port)

    yield start
    for server, console in started:
        server.shutdown()
        server.server_close()
        console.close()


def request(
    port: int, path: str, *, host: Optional[str] = None, form: Optional[dict[str, str]] = None
) -> tuple[int, str]:
    """Status and body of a GET (a form POST with ``form``), sent with ``host`` as Host."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        headers = {"Host": host or f"127.0.0.1:{port}"}
        body = None
        if form is not None:
            body = urllib.parse.urlencode(form)
            headers["Content-Type"] = "application/x-www-form-urlencoded"
        connection.request("POST" if form is not None else "GET", path, body, headers)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def csrf_of(port: int) -> str:
    _, page = request(port, "/")
    found = re.search(r'name="csrf" content="([^"]+)"', page)
    assert found is not None, page
    return found.group(1)


# -- Host ------------------------------------------------------------------------------------


@pytest.fixture
def held_outside(redis_server: RedisServer) -> Iterator[str]:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    locker.try_acquire("proj.job:abc", 300, owner=OUTSIDE, renew=False)
    yield "singleton-lock:{proj.job:abc}"
    locker.close()


def test_a_rebound_host_name_gets_no_lock_list(
    serve: Serve, own_app: Celery, held_outside: str
) -> None:
    port = serve(own_app, allowed_hosts=served_names("127.0.0.1"))
    status, body = request(port, "/locks.json", host=f"attacker.example:{port}")
    assert status == 421
    assert held_outside not in body


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST", "[::1]"])
def test_loopback_names_and_addresses_get_the_lock_list(
    serve: Serve, own_app: Celery, held_outside: str, host: str
) -> None:
    port = serve(own_app, allowed_hosts=served_names("127.0.0.1"))
    status, body = request(port, "/locks.json", host=f"{host}:{port}")
    assert status == 200 and held_outside in body


def test_a_name_given_with_allow_host_is_answered(
    serve: Serve, own_app: Celery, held_outside: str
) -> None:
    port = serve(own_app, allowed_hosts=served_names("127.0.0.1", ["locks.internal"]))
    assert request(port, "/locks.json", host=f"locks.internal:{port}")[0] == 200


def answers(port: int) -> bool:
    try:
        return request(port, "/locks.json")[0] == 200
    except OSError:
        return False


def test_locks_serve_refuses_a_rebound_host_name(
    entry_points_dir: Path,  # noqa: F811 - the fixture imported above
    redis_server: RedisServer,
    held_outside: str,
) -> None:
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("CSL_", "CELERY_"))}
    environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(entry_points_dir), str(REPO), environ.get("PYTHONPATH")])
    )
    command = ["locks", "--url", redis_server.url, "serve", "--port", str(port)]
    served = subprocess.Popen(
        [sys.executable, "-m", "celery", *command],
        cwd=REPO,
        env=environ,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: answers(port), timeout=30, interval=0.2)
        status, body = request(port, "/locks.json", host=f"attacker.example:{port}")
        assert status == 421 and held_outside not in body
        assert request(port, "/locks.json", host=f"localhost:{port}")[0] == 200
    finally:
        os.killpg(served.pid, signal.SIGTERM)
        served.wait(timeout=30)


def test_bound_to_every_interface_the_machines_own_name_is_answered() -> None:
    names = served_names("0.0.0.0")
    assert socket.gethostname().lower() in names and "attacker.example" not in names


def test_a_mounted_console_checks_no_host_unless_told(
    serve: Serve, own_app: Celery, held_outside: str
) -> None:
    port = serve(own_app)
    assert request(port, "/locks.json", host="intranet.example")[0] == 200


# -- releases --------------------------------------------------------------------------------


def test_a_refused_release_does_not_tell_a_web_user_to_use_force(
    serve: Serve, own_app: Celery, held_outside: str
) -> None:
    port = serve(own_app, allow_release=True, allowed_hosts=served_names("127.0.0.1"))
    form = {
        "name": held_outside,
        "csrf": csrf_of(port),
        "confirm": "yes",
        "task_id": OUTSIDE.task_id,
    }
    status, body = request(port, "/release", form=form)
    assert status == 409 and "cannot be asked whether it is alive" in body
    assert "--force" not in body


@pytest.fixture
def held_by_the_worker(worker: Any, celery_app: Celery) -> Iterator[str]:
    """A lock whose holder names the in-process worker's node, which answers a ping."""
    locker = locker_for(celery_app)
    name = "proj.alive:abc"
    lease = locker.try_acquire(
        name, 300, owner=Owner(task_id="t-alive", host=worker.hostname, pid=7), renew=False
    )
    yield locker.keys(name).lock
    locker.release(lease)  # type: ignore[arg-type]


def test_a_holder_whose_node_answers_is_not_offered_for_release(
    serve: Serve, celery_app: Celery, held_by_the_worker: str
) -> None:
    port = serve(celery_app, allow_release=True)
    form = {"name": held_by_the_worker, "csrf": csrf_of(port)}
    status, body = request(port, "/release/confirm", form=form)
    assert status == 200 and "whose node answers a ping" in body
    assert "Release it" not in body and 'name="confirm"' not in body
