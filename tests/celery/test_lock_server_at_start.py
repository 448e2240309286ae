"""A lock server the worker cannot use is named, by its real cause, as the worker starts.

Real ``celery worker`` processes (tests/celery/test_worker_start.py's harness) against real
servers: a server with ``requirepass`` given a wrong or no password, a plain server addressed
with ``rediss://``, a host name that does not exist (``.invalid`` never resolves), a closed
port. A wrong password, a TLS mismatch or a misspelt host does not heal by retrying: the
worker refuses to start (exit 78, one CRITICAL line). A closed port may open:
the worker starts with one WARNING naming host and port and what the tasks do meanwhile.
tests/celery/test_tls.py has the TLS-only server addressed with ``redis://``.
"""

from __future__ import annotations

from typing import Callable, Iterator

import pytest
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.celery.worker.start_checks import meanwhile
from celery_singleton_lock.testing import RedisServer, free_port
from tests.celery.test_worker_start import EX_CONFIG, Outcome, run_worker

REFUSED = ["wrong password", "no password", "rediss to a plain server", "unresolvable host"]


class LockServers:
    """This module's servers, and the lock URL and port each case names."""

    def __init__(self, broker: RedisServer, guarded: RedisServer, plain: RedisServer) -> None:
        self.broker, self.guarded, self.plain = broker, guarded, plain
        self.closed_port = free_port()

    def url_of(self, case: str) -> str:
        return {
            "wrong password": f"redis://:wrong@127.0.0.1:{self.guarded.port}/0",
            "no password": f"redis://127.0.0.1:{self.guarded.port}/0",
            "rediss to a plain server": f"rediss://127.0.0.1:{self.plain.port}/0",
            "closed port": f"redis://127.0.0.1:{self.closed_port}/0",
            "unresolvable host": "redis://no-such-host.invalid:6379/0",
        }[case]

    def server_of(self, case: str) -> str:
        """``host:port`` as the worker names the server."""
        return self.url_of(case).split("@")[-1].split("//")[-1].split("/")[0]


@pytest.fixture(scope="module")
def servers() -> Iterator[LockServers]:
    with (
        RedisServer.running() as broker,
        RedisServer.running(password="right") as guarded,
        RedisServer.running() as plain,
    ):
        yield LockServers(broker, guarded, plain)


@pytest.fixture(scope="module")
def started(
    tmp_path_factory: pytest.TempPathFactory, servers: LockServers
) -> Callable[[str], tuple[Outcome, int]]:
    """``started(case)``: the outcome of a worker (solo, prefork for the closed port) on the
    lock URL of ``case``, and the connections its lock server received meanwhile."""
    outcomes: dict[str, tuple[Outcome, int]] = {}

    def outcome(case: str) -> tuple[Outcome, int]:
        if case not in outcomes:
            url = servers.url_of(case)
            watched = servers.plain if case == "rediss to a plain server" else servers.guarded
            client = watched.client()
            before = int(client.info("stats")["total_connections_received"])
            run = run_worker(
                tmp_path_factory.mktemp("server"),
                servers.broker,
                "prefork" if case == "closed port" else "solo",
                before=f"app.conf.singleton_lock_url = {url!r}",
            )
            after = int(client.info("stats")["total_connections_received"])
            client.close()
            outcomes[case] = run, after - before
        return outcomes[case]

    return outcome


def ours(output: str, text: str) -> list[str]:
    return [line for line in output.splitlines() if text in line]


@pytest.mark.parametrize("case", REFUSED)
def test_lock_server_that_will_not_heal_refuses_the_start_with_ex_config(
    started: Callable[[str], tuple[Outcome, int]], case: str
) -> None:
    outcome, _ = started(case)
    assert outcome.returncode == EX_CONFIG and not outcome.said_ready, outcome.output


@pytest.mark.parametrize(
    ("case", "cause"),
    [
        ("wrong password", "authentication failed"),
        ("no password", "authentication failed"),
        ("rediss to a plain server", "speaks plain Redis, not TLS"),
        ("unresolvable host", "the host name does not resolve"),
    ],
)
def test_lock_server_that_will_not_heal_is_one_critical_line_naming_server_and_cause(
    started: Callable[[str], tuple[Outcome, int]], servers: LockServers, case: str, cause: str
) -> None:
    outcome, _ = started(case)
    lines = ours(outcome.output, "worker not started")
    assert len(lines) == 1 and "CRITICAL" in lines[0], outcome.output
    assert f"lock server {servers.server_of(case)}" in lines[0]
    assert cause in lines[0] and "singleton_lock_url" in lines[0]
    assert "Traceback" not in outcome.output


@pytest.mark.parametrize("case", [*REFUSED, "closed port"])
def test_lock_server_problem_is_not_blamed_on_cluster_detection(
    started: Callable[[str], tuple[Outcome, int]], case: str
) -> None:
    outcome, _ = started(case)
    assert "singleton_lock_cluster" not in outcome.output
    assert "Redis Cluster" not in outcome.output


def test_rediss_to_a_plain_server_is_tried_once_each_way(
    started: Callable[[str], tuple[Outcome, int]],
) -> None:
    # one TLS handshake that hangs (up to the probe's timeout), one plain PING that answers:
    # not a TLS handshake per retry and per caller, each waiting out its socket timeout
    _, connections = started("rediss to a plain server")
    assert connections == 2


def test_closed_port_starts_the_worker(started: Callable[[str], tuple[Outcome, int]]) -> None:
    outcome, _ = started("closed port")
    assert outcome.said_ready, outcome.output


def test_closed_port_is_one_warning_naming_host_port_and_what_tasks_do(
    started: Callable[[str], tuple[Outcome, int]], servers: LockServers
) -> None:
    outcome, _ = started("closed port")
    lines = [line for line in outcome.output.splitlines() if "WARNING" in line]
    assert len(lines) == 1, outcome.output
    assert f"lock server 127.0.0.1:{servers.closed_port} refused the connection" in lines[0]
    assert "its locked tasks are retried (lock_on_backend_error='retry')" in lines[0]


# -- what the tasks do meanwhile (pure) -----------------------------------------------------


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("meanwhile", set_as_current=False, broker="memory://")
    app.finalize()
    yield app
    app.close()


def locked(app: Celery, name: str, **options: object) -> LockedTask:
    def job(account_id: int) -> None:
        return None

    task: LockedTask = app.task(name=name, base=LockedTask, shared=False, **options)(job)
    return task


def test_tasks_that_run_without_the_lock_are_named(app: Celery) -> None:
    tasks = [locked(app, "a.retried"), locked(app, "a.unlocked", lock_on_backend_error="run")]
    said = meanwhile(tasks, 1)
    assert "retried" in said and "a.unlocked, which run WITHOUT the lock" in said
    assert "a.retried" not in said


def test_a_quorum_member_down_says_a_majority_still_takes_locks(app: Celery) -> None:
    assert meanwhile([locked(app, "a.retried")], 3).startswith(
        "locks are taken while a majority of the 3 servers answer"
    )
