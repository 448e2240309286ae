"""A Redlock quorum (singleton_lock_url listing several servers) in the Celery layer: what it
refuses at registration and worker start, how its URLs are checked, and the CLI on it."""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Any, Iterator

import pytest
from celery import Celery

from celery_singleton_lock import LockConfigurationError, LockedTask
from celery_singleton_lock.celery.config.servers import choose_url
from celery_singleton_lock.celery.config.urls import quorum_urls, redact
from celery_singleton_lock.engine import Lease, Owner, Renewer
from celery_singleton_lock.engine.redlock import QuorumLease, QuorumLocker
from celery_singleton_lock.testing import RedisServer
from tests.celery.test_cli import run_cli
from tests.celery.test_worker_start import EX_CONFIG, run_worker

QUORUM = ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "redis://127.0.0.1:3/0"]


@pytest.fixture
def app() -> Iterator[Celery]:
    app = Celery("quorum-cfg", set_as_current=False, broker="memory://")
    app.finalize()  # binds the shared tasks of other test apps, some of them fenced
    app.conf.singleton_lock_url = QUORUM  # never contacted here
    yield app
    app.close()


def register(app: Celery, **options: Any) -> Any:
    def job(account_id: int) -> None:
        return None

    return app.task(name="billing.job", base=LockedTask, shared=False, **options)(job)


@pytest.mark.parametrize(
    "option, value",
    [
        ("lock_fencing", True),
        ("dedupe_on_enqueue", True),
        ("lock_min_replicas", 1),
        ("on_duplicate", "queue"),
    ],
)
def test_an_option_needing_one_server_fails_at_registration(
    app: Celery, option: str, value: Any
) -> None:
    with pytest.raises(LockConfigurationError, match=rf"billing\.job: {option}=.*Redlock quorum"):
        register(app, **{option: value})


def test_a_task_without_those_options_registers_on_a_quorum(app: Celery) -> None:
    assert register(app, on_duplicate="retry").lock_options.ttl == 15.0


def test_a_list_of_urls_is_chosen_as_one_quorum_url(app: Celery) -> None:
    url, source = choose_url(app.conf)
    assert source == "singleton_lock_url"
    assert quorum_urls(url) == QUORUM


def test_a_quorum_of_two_is_refused(app: Celery) -> None:
    app.conf.singleton_lock_url = QUORUM[:2]
    with pytest.raises(LockConfigurationError, match="at least 3"):
        choose_url(app.conf)


def test_a_sentinel_url_inside_a_quorum_is_refused(app: Celery) -> None:
    app.conf.singleton_lock_url = [*QUORUM[:2], "sentinel://127.0.0.1:26379"]
    with pytest.raises(LockConfigurationError, match="no Sentinel"):
        choose_url(app.conf)


def test_a_quorum_url_that_is_not_redis_is_refused(app: Celery) -> None:
    app.conf.singleton_lock_url = [*QUORUM[:2], "amqp://127.0.0.1"]
    with pytest.raises(LockConfigurationError, match="not a Redis URL"):
        choose_url(app.conf)


def test_every_password_of_a_quorum_is_hidden() -> None:
    shown = redact(",".join(url.replace("//", "//:secret@") for url in QUORUM))
    assert "secret" not in shown and shown.count(":***@") == 3


def test_a_worker_refuses_fencing_set_after_registration_on_a_quorum(
    tmp_path: Path, broker_server: RedisServer
) -> None:
    outcome = run_worker(
        tmp_path,
        broker_server,
        "solo",
        # finalize(): the task is bound (its options validated) before the settings change
        after=f"app.finalize()\napp.conf.singleton_lock_url = {QUORUM!r}\n"
        "app.conf.singleton_lock_fencing = True",
    )
    assert outcome.returncode == EX_CONFIG, outcome.output
    assert "billing.transfer: lock_fencing=True is not supported" in outcome.output


def test_a_worker_refuses_a_quorum_of_two(tmp_path: Path, broker_server: RedisServer) -> None:
    outcome = run_worker(
        tmp_path, broker_server, "solo", after=f"app.conf.singleton_lock_url = {QUORUM[:2]!r}"
    )
    assert outcome.returncode == EX_CONFIG, outcome.output
    assert "at least 3 independent Redis servers" in outcome.output


# -- the CLI on a quorum ------------------------------------------------------------------------


@pytest.fixture
def servers() -> Iterator[list[RedisServer]]:
    with ExitStack() as stack:
        yield [stack.enter_context(RedisServer.running()) for _ in range(3)]


def held_lock(servers: list[RedisServer]) -> tuple[QuorumLocker, Lease]:
    """A lock held on every server. The acquire returns once a majority answered; the tests
    then change single servers, so they wait for the last server's write first (a write that
    landed after the test flushed server 0 once made it hold the lock again)."""
    locker = QuorumLocker([s.client() for s in servers], renewer=Renewer(autostart=False))
    lease = locker.try_acquire("app.job:aa", 30, owner=Owner(task_id="t-1", host="w1", pid=11))
    assert isinstance(lease, QuorumLease)
    assert lease.settle()
    return locker, lease


def test_list_shows_a_lock_held_on_the_quorum(servers: list[RedisServer]) -> None:
    held_lock(servers)
    servers[0].client().flushall()  # held on 2 of 3: still held
    result = run_cli("--url", ",".join(s.url for s in servers), "list")
    assert result.returncode == 0, result.stderr
    assert "singleton-lock:{app.job:aa}  task=t-1  host=w1  pid=11" in result.stdout


def test_show_gives_each_servers_view(servers: list[RedisServer]) -> None:
    held_lock(servers)
    servers[0].client().flushall()
    result = run_cli("--url", ",".join(s.url for s in servers), "show", "app.job:aa")
    assert result.returncode == 0, result.stderr
    assert f"127.0.0.1:{servers[0].port}: free" in result.stderr
    assert f"127.0.0.1:{servers[1].port}: singleton-lock:{{app.job:aa}}  task=t-1" in result.stderr


def test_release_frees_the_lock_on_every_server(servers: list[RedisServer]) -> None:
    held_lock(servers)
    result = run_cli("--url", ",".join(s.url for s in servers), "release", "--force", "app.job:aa")
    assert result.returncode == 0, result.stderr
    assert [s.client().exists("singleton-lock:{app.job:aa}") for s in servers] == [0, 0, 0]
