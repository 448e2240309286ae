"""A failover of the PostgreSQL lock server: a private primary and its streaming standby
(``pg_basebackup -R``, asynchronous), the primary crashed (``pg_ctl stop -m immediate``), the
standby promoted. The locker's URL names both hosts with ``target_session_attrs=read-write``
(libpq then connects to whichever is the primary), so it follows the promotion by itself.

Asynchronous replication may lose the last commits of a crashed primary: a lease or fence
committed there and not yet replayed on the standby would be gone. The test waits for the
standby to catch up before the crash, so it pins what holds when nothing was lost (the lease,
its renewal, the fences); ``synchronous_standby_names`` is what makes that hold always.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import pytest

from celery_singleton_lock.engine.acquire_request import AcquireRequest
from celery_singleton_lock.engine.lease import Lease
from celery_singleton_lock.engine.postgres.locker import PostgresLocker
from celery_singleton_lock.engine.renewer import Renewer
from celery_singleton_lock.errors import LockBackendUnavailable
from tests.celery.pg_workers import APP, GATED, postgres_setup, rabbitmq_answers, skipped
from tests.celery.workers import unique, worker_group
from tests.postgres_servers import PrivatePostgres, private_postgres, private_standby
from tests.support import wait_until

psycopg = pytest.importorskip("psycopg")


@pytest.fixture
def pair() -> Iterator[tuple[PrivatePostgres, PrivatePostgres]]:
    with private_postgres() as primary, private_standby(primary) as standby:
        yield primary, standby


def both_hosts(primary: PrivatePostgres, standby: PrivatePostgres, schema: str) -> str:
    """The lock URL naming both servers: libpq connects to whichever is the primary."""
    return (
        f"postgresql://postgres@127.0.0.1:{primary.port},127.0.0.1:{standby.port}/postgres"
        f"?target_session_attrs=read-write&schema={schema}"
    )


def caught_up(primary: PrivatePostgres, standby: PrivatePostgres) -> bool:
    with psycopg.connect(primary.url, autocommit=True) as connection:
        (lsn,) = connection.execute("SELECT pg_current_wal_lsn()").fetchone() or ("0/0",)
    with psycopg.connect(standby.url, autocommit=True) as connection:
        row = connection.execute("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,))
        return bool((row.fetchone() or (False,))[0])


@pytest.mark.timeout(300)
def test_after_a_failover_the_lease_is_kept_renewed_and_fences_keep_increasing(
    pair: tuple[PrivatePostgres, PrivatePostgres],
    chaos_figures: Callable[[dict[str, Any]], None],
) -> None:
    primary, standby = pair
    url = both_hosts(primary, standby, "failover")
    locker = PostgresLocker(url, renewer=Renewer(autostart=False))
    other = PostgresLocker(url, renewer=Renewer(autostart=False))
    try:
        held = locker.acquire(AcquireRequest("held", 30, fencing=True, renew=False))
        assert isinstance(held, Lease)
        before = [held.fence]
        for n in range(5):
            lease = locker.acquire(AcquireRequest(f"f{n}", 30, fencing=True, renew=False))
            before.append(lease.fence)
            locker.release(lease)
        wait_until(lambda: caught_up(primary, standby), timeout=60, interval=0.1)
        primary.stop("immediate")
        crashed = time.monotonic()
        with pytest.raises(LockBackendUnavailable):  # no primary: no statement runs
            locker.renew_batch([held], now=held.confirmed_at)
        standby.promote()
        promoted = time.monotonic()
        lost = wait_until(
            lambda: _renewed(locker, held), timeout=60, interval=0.1
        )  # the renewal follows the promotion (a new connection to the new primary)
        renewed = time.monotonic()
        holder = other.acquire(AcquireRequest("held", 30, renew=False))
        after = [
            other.acquire(AcquireRequest(f"g{n}", 30, fencing=True, renew=False)).fence
            for n in range(3)
        ]
    finally:
        locker.close()
        other.close()
    chaos_figures(
        {
            "backend": "postgresql",
            "failover": "primary stop -m immediate; standby promoted (async, caught up)",
            "promote_s": round(promoted - crashed, 2),
            "renewed_after_crash_s": round(renewed - crashed, 2),
            "last_fence_before": max(before),
            "first_fence_after": after[0],
        }
    )
    assert lost == ["kept"]
    assert not isinstance(holder, Lease)  # the lock is still the first holder's
    assert holder.task_id == held.owner.task_id
    assert min(after) > max(before), (before, after)


def _renewed(locker: PostgresLocker, lease: Lease) -> Any:
    """``["kept"]`` if a renewal of ``lease`` went through and kept it, ``["lost"]`` if it
    went through and did not; None while no primary answers."""
    try:
        lost = locker.renew_batch([lease], now=lease.confirmed_at)
    except LockBackendUnavailable:
        return None
    return ["lost"] if lost else ["kept"]


@pytest.mark.timeout(300)
@pytest.mark.skipif(not rabbitmq_answers(), reason="no RabbitMQ at 127.0.0.1:5672")
def test_a_worker_holding_a_lock_through_a_failover_keeps_it_and_its_duplicate_is_skipped(
    pair: tuple[PrivatePostgres, PrivatePostgres],
    chaos_figures: Callable[[dict[str, Any]], None],
) -> None:
    primary, standby = pair
    with postgres_setup(both_hosts(primary, standby, "locks")) as setup:
        queue, key = setup.queue(), unique("failover")
        with worker_group(setup.servers) as group:
            group.start(2, queue=queue, concurrency=2, app=APP)
            setup.client.send_task(f"{APP}.pg_hold", args=[key, 0, GATED], queue=queue)
            wait_until(lambda: setup.records(key), timeout=60)
            wait_until(lambda: caught_up(primary, standby), timeout=60, interval=0.1)
            primary.stop("immediate")
            crashed = time.monotonic()
            # no primary for longer than a renewal interval (lock_ttl / 3): a renewal fails
            wait_until(lambda: "renewal of 1 lease(s) failed" in group.logs(), timeout=30)
            no_primary = time.monotonic() - crashed
            standby.promote()
            duplicate = setup.client.send_task(f"{APP}.pg_hold", args=[key, 1, 0.1], queue=queue)
            # the holder runs until the duplicate was skipped (or ran: the assertion shows it)
            wait_until(
                lambda: skipped(group, duplicate.id) or len(setup.records(key)) > 1, timeout=90
            )
            setup.open_gate(key)
            rows = wait_until(lambda: setup.settled(key, quiet=3.0), timeout=90)
            ended = time.monotonic()
    chaos_figures(
        {
            "backend": "postgresql",
            "failover": "worker holding a lock (lock_ttl 10); primary crashed, standby promoted",
            "no_primary_s": round(no_primary, 2),
            "body_ended_after_crash_s": round(ended - crashed, 2),
        }
    )
    assert [row[0] for row in rows] == [0]  # the duplicate was skipped: the lease followed
    assert rows[0][5] is False  # never reported lost
