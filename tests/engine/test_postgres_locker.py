"""The PostgreSQL backend on the real server: leases in rows, owner-checked release, expiry,
renewal in one statement, fences from a sequence, LISTEN/NOTIFY, fork safety, and the options
it refuses."""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest

from celery_singleton_lock.engine import (
    KeyspaceReader,
    Lease,
    LockHolder,
    Owner,
    PartsReader,
    Renewer,
)
from celery_singleton_lock.errors import AlreadyFinished, LockConfigurationError
from tests.engine.conftest import stop_renewing
from tests.postgres_support import postgres_schema
from tests.support import wait_until

pytest.importorskip("psycopg")

from celery_singleton_lock.engine.postgres.locker import PostgresLocker
from celery_singleton_lock.engine.postgres.schema import FUNCTION_FILES


@pytest.fixture
def url() -> Iterator[str]:
    with postgres_schema() as url:
        yield url


@pytest.fixture
def locker(url: str) -> Iterator[PostgresLocker]:
    renewer = Renewer()
    locker = PostgresLocker(url, prefix="t", renewer=renewer)
    yield locker
    stop_renewing(renewer)
    locker.close()


def take(locker: PostgresLocker, name: str = "job", ttl: float = 30.0, **options: Any) -> Lease:
    lease = locker.try_acquire(name, ttl, renew=False, **options)
    assert isinstance(lease, Lease), lease
    return lease


def test_a_second_acquire_is_told_the_holder(locker: PostgresLocker) -> None:
    take(locker, owner=Owner(task_id="first"))
    holder = locker.try_acquire("job", 30, owner=Owner(task_id="second"))
    assert isinstance(holder, LockHolder)
    assert (holder.task_id, holder.pid, holder.key) == ("first", os.getpid(), "t:{job}")
    assert holder.ttl is not None and 0 < holder.ttl <= 30


def test_only_one_of_many_racing_acquires_takes_the_lock(locker: PostgresLocker) -> None:
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda i: locker.try_acquire("race", 30, renew=False), range(40)))
    assert sum(isinstance(outcome, Lease) for outcome in outcomes) == 1


def test_release_frees_the_lock_for_the_next_acquire(locker: PostgresLocker) -> None:
    assert take(locker).release() is True
    assert isinstance(locker.try_acquire("job", 30, renew=False), Lease)


def taken_once_free(locker: PostgresLocker, task_id: str) -> Lease:
    """The lease of ``task_id`` on ``job``, polled for up to 30 s (until the holder's ends)."""

    def attempt() -> Any:
        outcome = locker.try_acquire("job", 30, renew=False, owner=Owner(task_id=task_id))
        return outcome if isinstance(outcome, Lease) else None

    lease: Lease = wait_until(attempt, timeout=30)
    return lease


def test_release_of_a_lease_taken_over_leaves_the_new_holder(locker: PostgresLocker) -> None:
    stale = take(locker, ttl=0.2, owner=Owner(task_id="stale"))
    taken_once_free(locker, "newer")
    assert stale.release() is False
    holder = locker.inspect.read("job")
    assert holder is not None and holder.task_id == "newer"


def test_a_lease_not_renewed_expires_and_another_takes_it(locker: PostgresLocker) -> None:
    take(locker, ttl=0.5, owner=Owner(task_id="gone"))
    assert taken_once_free(locker, "next").owner.task_id == "next"


def test_fences_strictly_increase_across_holders(locker: PostgresLocker) -> None:
    fences = []
    for _ in range(20):
        lease = take(locker, fencing=True)
        fences.append(lease.fence)
        lease.release()
    assert all(isinstance(fence, int) for fence in fences)
    assert fences == sorted(set(fences))  # strictly increasing


def test_fences_go_on_from_the_sequence_in_a_new_locker(url: str, locker: PostgresLocker) -> None:
    first = take(locker, fencing=True)
    first.release()
    other = PostgresLocker(url, prefix="t", renewer=Renewer(autostart=False))
    try:
        second = other.try_acquire("job", 30, renew=False, fencing=True)
        assert isinstance(second, Lease)
        assert second.fence is not None and first.fence is not None
        assert second.fence > first.fence
    finally:
        other.close()


def test_without_fencing_a_lease_has_no_fence(locker: PostgresLocker) -> None:
    assert take(locker).fence is None


def test_renew_batch_is_one_statement_for_every_lease(locker: PostgresLocker) -> None:
    leases = [take(locker, f"job{i}", ttl=5) for i in range(30)]
    before = locker.connections.statements
    assert locker.renew_batch(leases, now=time.monotonic()) == []
    assert locker.connections.statements - before == 1


def test_renew_batch_extends_the_lease_on_the_server(locker: PostgresLocker) -> None:
    lease = take(locker, ttl=2)
    lease.ttl, lease.ttl_ms = 60.0, 60_000  # renewed for longer than it was taken
    locker.renew_batch([lease], now=time.monotonic())
    holder = locker.inspect.read("job")
    assert holder is not None and holder.ttl is not None and holder.ttl > 30


def test_renew_batch_names_the_leases_lost(locker: PostgresLocker) -> None:
    kept = take(locker, "kept")
    released = take(locker, "released")
    locker.release(Lease(**_same(released)))
    assert locker.renew_batch([kept, released], now=time.monotonic()) == [1]


def test_a_lease_the_renewer_finds_gone_is_reported_lost_naming_postgresql(
    locker: PostgresLocker, caplog: pytest.LogCaptureFixture
) -> None:
    lease = locker.try_acquire("job", 3, renew=True)
    assert isinstance(lease, Lease)
    locker.release(Lease(**_same(lease)))  # the row freed behind the renewer's back
    with caplog.at_level(logging.ERROR, logger="celery_singleton_lock"):
        wait_until(lease.lost.is_set, timeout=30)
    assert "lock server (PostgreSQL row leases) no longer holds our token" in caplog.text
    assert "Redis" not in caplog.text


def _same(lease: Lease) -> dict[str, Any]:
    """A lease of the same token (as another handle on the same row)."""
    return {
        "locker": lease.locker,
        "keys": lease.keys,
        "token": lease.token,
        "ttl": lease.ttl,
        "owner": lease.owner,
        "fence": lease.fence,
        "confirmed_at": lease.confirmed_at,
        "deadline": None,
    }


def test_the_renewer_keeps_a_lease_alive_past_its_ttl(url: str) -> None:
    renewer = Renewer()
    locker = PostgresLocker(url, prefix="t", renewer=renewer)
    try:
        lease = locker.try_acquire("job", 1.5, owner=Owner(task_id="kept"))
        assert isinstance(lease, Lease)
        time.sleep(5)
        holder = locker.inspect.read("job")
        assert holder is not None and holder.task_id == "kept" and lease.held
    finally:
        stop_renewing(renewer)
        locker.close()


def test_renew_by_owner_renews_only_that_owners_lock(locker: PostgresLocker) -> None:
    owner = Owner(task_id="child", pid=4242, host="h")
    take(locker, "mine", ttl=2, owner=owner)
    take(locker, "theirs", ttl=2, owner=Owner(task_id="other", pid=4242, host="h"))
    lost = locker.renew_by_owner([("mine", owner, 60), ("theirs", owner, 60), ("none", owner, 60)])
    assert lost == [1, 2]
    holder = locker.inspect.read("mine")
    assert holder is not None and holder.ttl is not None and holder.ttl > 30


def test_release_abandoned_frees_a_lock_by_its_owner_fields(locker: PostgresLocker) -> None:
    take(locker, owner=Owner(task_id="dead", pid=4242, host="h"))
    assert not locker.release_abandoned("job", task_id="dead", host="h", pid=1)
    assert locker.release_abandoned("job", task_id="dead", host="h", pid=4242)
    assert locker.inspect.read("job") is None


def test_a_release_wakes_a_subscriber_of_that_lock(locker: PostgresLocker) -> None:
    lease = take(locker)
    subscription = locker.subscribe_releases("job")
    try:
        lease.release()
        message = subscription.get_message(timeout=30)
        assert message is not None and message["type"] == "message"
    finally:
        subscription.close()


def test_the_release_of_another_lock_does_not_wake_a_subscriber(locker: PostgresLocker) -> None:
    other = take(locker, "other")
    subscription = locker.subscribe_releases("job")
    try:
        other.release()
        assert subscription.get_message(timeout=1.0) is None
    finally:
        subscription.close()


def test_a_finish_record_refuses_the_same_task_id(locker: PostgresLocker) -> None:
    owner = Owner(task_id="done")
    take(locker, owner=owner).release(remember_for=60)
    with pytest.raises(AlreadyFinished):
        locker.try_acquire("job", 30, owner=owner, unless_finished=True, renew=False)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"park": b"message", "limit": 2}, "on_duplicate='queue' with lock_limit > 1"),
        ({"min_replicas": 1}, "lock_min_replicas"),
    ],
)
def test_an_option_it_lacks_is_refused_naming_the_backend(
    locker: PostgresLocker, options: dict[str, Any], option: str
) -> None:
    with pytest.raises(LockConfigurationError, match="PostgreSQL") as refused:
        locker.try_acquire("job", 30, owner=Owner(task_id="t"), renew=False, **options)
    assert option in refused.value.message


def test_a_forked_child_leaves_its_parents_connections_working(locker: PostgresLocker) -> None:
    take(locker, "parent")  # the parent has a kept connection now
    pid = os.fork()
    if pid == 0:  # the child: its own connection, and an exit that frees nothing of the parent's
        code = 0 if isinstance(locker.try_acquire("child", 30, renew=False), Lease) else 1
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert isinstance(locker.try_acquire("after", 30, renew=False), Lease)
    assert {holder.key for holder in locker.inspect.scan()} == {
        "t:{parent}",
        "t:{child}",
        "t:{after}",
    }


def test_a_schema_set_up_again_leaves_its_functions_as_they_are(locker: PostgresLocker) -> None:
    # a replaced function gets a new row version (xmin): the versioned functions are created
    # once, so a process of another release, or a role that does not own them, never swaps them
    functions = f"""SELECT p.proname, p.xmin::text FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = '{locker.schema.name}'
        ORDER BY p.proname"""
    locker.ensure_schema()
    before = locker.connections.run(functions, None)
    locker.ensure_schema()
    assert len(before) == len(FUNCTION_FILES)
    assert locker.connections.run(functions, None) == before


def test_a_postgres_reader_reads_the_parts_but_declares_no_reads_of_redis_keys(
    locker: PostgresLocker,
) -> None:
    inspect = locker.inspect
    assert isinstance(inspect, PartsReader) and not isinstance(inspect, KeyspaceReader)
