"""``locks doctor`` against real Redis servers: one line per finding with its fix, exit 0
when healthy and 1 otherwise (``celery locks --url URL doctor``: the click group run in-process,
with Celery's default app as ``celery`` without ``-A`` gives it)."""

from __future__ import annotations

import json
import types
from typing import Any, Iterator

import pytest
from celery import Celery
from click.testing import CliRunner

from celery_singleton_lock.celery import LockedTask
from celery_singleton_lock.celery.cli.app_target import open_target
from celery_singleton_lock.celery.cli.doctor import STALE_MARKER, run_doctor
from celery_singleton_lock.command_line import locks
from celery_singleton_lock.engine import Lease, Owner, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer


def doctor(server: RedisServer, *args: str) -> Any:
    context = types.SimpleNamespace(app=Celery(set_as_current=False))  # what celery gives
    return CliRunner().invoke(
        locks, ["--url", server.url, "doctor", *args], obj=context, prog_name="celery locks"
    )


def problems(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith(("ERROR", "WARNING"))]


@pytest.fixture
def evicting_server() -> Iterator[RedisServer]:
    with RedisServer.running(extra_args=["--maxmemory-policy", "allkeys-lru"]) as server:
        yield server


def test_doctor_exits_0_on_a_healthy_server(redis_server: RedisServer) -> None:
    assert doctor(redis_server).exit_code == 0


def test_doctor_exits_1_on_a_server_that_may_evict_any_key(evicting_server: RedisServer) -> None:
    assert doctor(evicting_server).exit_code == 1


def test_doctor_says_an_allkeys_policy_in_one_error_line_with_the_fix(
    evicting_server: RedisServer,
) -> None:
    (line,) = problems(doctor(evicting_server).stdout)
    assert (
        line.startswith("ERROR eviction:"),
        "allkeys-lru" in line,
        "fix: set maxmemory-policy noeviction" in line,
    ) == (True, True, True)


def test_doctor_json_lists_the_eviction_finding_with_its_severity(
    evicting_server: RedisServer,
) -> None:
    # the first line: click < 8.2's runner mixes the summary on stderr into stdout
    findings = json.loads(doctor(evicting_server, "--json").stdout.splitlines()[0])
    assert [(f["check"], f["severity"]) for f in findings if f["severity"] != "info"] == [
        ("eviction", "error")
    ]


def test_doctor_reports_calls_parked_behind_a_free_lock(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.zadd("singleton-lock:{proj.job:abc}:parked", {"t-1": 1, "t-2": 2})
    # as a parking script leaves it: the lock named in the hand-off index, whose sweeper is gone
    client.zadd("singleton-lock:handoff-due", {"proj.job:abc": 1})
    (line,) = problems(doctor(redis_server).stdout)
    assert line.startswith("WARNING parked: 2 call(s) parked behind free lock proj.job:abc")


def test_doctor_reports_an_enqueue_marker_without_ttl_as_stray(redis_server: RedisServer) -> None:
    client = redis_server.client()
    client.set("singleton-lock:{proj.job:abc}:queued", "t-1")
    # as enqueue.lua indexes a marker (whose TTL was then taken away)
    client.zadd("singleton-lock:queued", {"singleton-lock:{proj.job:abc}:queued": 1})
    (line,) = problems(doctor(redis_server).stdout)
    # the command that clears it, as this one was run
    assert f"fix: celery locks --url {redis_server.url} clear-queued proj.job:abc" in line


def test_doctor_counts_one_fence_counter_for_two_fenced_names(redis_server: RedisServer) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    for name in ("proj.job:a", "proj.job:b"):
        locker.try_acquire(name, 30, owner=Owner(task_id="t"), fencing=True, renew=False)
    assert (
        "INFO keys: 1 fence counters under prefix 'singleton-lock'" in doctor(redis_server).stdout
    )


def test_doctor_counts_finish_records_by_task_id(redis_server: RedisServer) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    for name in ("proj.job:a", "proj.job:b", "proj.job:c"):
        lease = locker.try_acquire(name, 30, owner=Owner(task_id=name), renew=False)
        assert isinstance(lease, Lease) and lease.release(remember_for=60)
    assert (
        "INFO keys: 3 finish records under prefix 'singleton-lock'" in doctor(redis_server).stdout
    )


def test_doctor_reports_a_lock_whose_holder_node_does_not_answer_a_ping(
    redis_server: RedisServer, own_app: Celery
) -> None:
    locker = RedisLocker(redis_server.client(), renewer=Renewer(autostart=False))
    owner = Owner(task_id="t-1", host="gone@nowhere", pid=4242)
    locker.try_acquire("proj.job:abc", 60, owner=owner, renew=False)
    target = open_target(app=own_app)
    try:
        findings = run_doctor(target, own_app, ping_timeout=0.5)
    finally:
        target.close()
    orphans = [(f.severity, f.fix) for f in findings if f.check == "orphans"]
    assert orphans == [("warning", "celery locks release proj.job:abc (or wait for its TTL)")]


def test_doctor_warns_of_a_server_without_aof_when_a_task_uses_fencing(
    redis_server: RedisServer, own_app: Celery
) -> None:
    @own_app.task(base=LockedTask, lock_fencing=True, name="proj.fenced")
    def fenced() -> None: ...

    target = open_target(app=own_app)
    try:
        findings = run_doctor(target, own_app, ping_timeout=0.5)
    finally:
        target.close()
    persistence = [f for f in findings if f.check == "persistence"]
    assert [(f.severity, "proj.fenced" in f.message) for f in persistence] == [("warning", True)]


def test_doctor_names_an_enqueue_marker_whose_task_never_started(
    redis_server: RedisServer, own_app: Celery
) -> None:
    @own_app.task(base=LockedTask, dedupe_on_enqueue=True, name="proj.deduped")
    def deduped(key: str) -> None: ...

    name = deduped.lock_options.keyer.name(("a",), {})
    left = deduped.lock_options.queued_ttl - 2 * STALE_MARKER  # written that long ago
    client = redis_server.client()
    key = f"singleton-lock:{{{name}}}:queued"
    client.set(key, "lost-one", ex=int(left))
    client.zadd("singleton-lock:queued", {key: 1})  # as enqueue.lua indexes it
    target = open_target(app=own_app)
    try:
        findings = run_doctor(target, own_app, ping_timeout=0.5)
    finally:
        target.close()
    (marker,) = [f for f in findings if f.check == "markers"]
    assert (marker.severity, "lost-one" in marker.message) == ("info", True)
    assert marker.fix.startswith(f"celery locks clear-queued {name}")
