"""A restart of PostgreSQL under the PostgreSQL backend (a private server of the test's own:
tests/postgres_servers.py): a lease outlives a short restart (its rows are committed; the
renewer reconnects), a lease whose TTL runs out while the server is down is reported lost, a
new call takes the lock after the restart, and parked calls are handed on after it."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Iterator

import pytest

from celery_singleton_lock.engine import Lease, LockHolder, Owner, Parked, Renewer
from celery_singleton_lock.errors import LockBackendUnavailable
from tests.engine.conftest import stop_renewing
from tests.postgres_servers import PrivatePostgres, private_postgres
from tests.support import wait_until

pytest.importorskip("psycopg")

from celery_singleton_lock.engine.postgres.locker import PostgresLocker


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    with private_postgres() as server:
        yield server


@pytest.fixture
def locker(server: PrivatePostgres) -> Iterator[PostgresLocker]:
    renewer = Renewer()
    locker = PostgresLocker(server.url, prefix=f"r{time.monotonic_ns()}", renewer=renewer)
    yield locker
    stop_renewing(renewer)
    locker.close()


def test_a_lease_outlives_a_restart_shorter_than_its_ttl(
    server: PrivatePostgres, locker: PostgresLocker
) -> None:
    lease = locker.try_acquire("job", 6.0, owner=Owner(task_id="holder"))
    assert isinstance(lease, Lease)
    looked, ends = time.monotonic(), lease_end(server, locker.prefix, "holder")
    server.stop()
    # a renewal since the look (if any) ended the row at most that much later
    ends += timedelta(seconds=time.monotonic() - looked)
    server.start()
    # past the end the row had at the restart, by the server's clock: only renewals kept it
    wait_until(lambda: server_now(server) > ends, timeout=30, interval=0.1)
    assert lease.held
    assert isinstance(locker.try_acquire("job", 6.0, owner=Owner(task_id="other")), LockHolder)
    assert locker.release(lease)
    assert isinstance(locker.try_acquire("job", 6.0, owner=Owner(task_id="new")), Lease)


def lease_end(server: PrivatePostgres, prefix: str, task_id: str) -> datetime:
    """When the lease row that ``task_id`` holds under ``prefix`` ends (the server's clock)."""
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT lease_until FROM singleton_lock_leases WHERE prefix = %s AND task_id = %s",
            (prefix, task_id),
        ).fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def server_now(server: PrivatePostgres) -> datetime:
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as connection:
        row = connection.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def test_a_lease_whose_ttl_runs_out_while_the_server_is_down_is_reported_lost(
    server: PrivatePostgres, locker: PostgresLocker
) -> None:
    lost = threading.Event()
    lease = locker.try_acquire(
        "job", 2.0, owner=Owner(task_id="holder"), on_lost=lambda lease: lost.set()
    )
    assert isinstance(lease, Lease)
    server.stop()
    try:
        assert lost.wait(timeout=20)  # reported once its TTL has certainly run out
        assert not lease.held
    finally:
        server.start()
    taken = wait_until(
        lambda: locker.try_acquire("job", 5.0, owner=Owner(task_id="new"), renew=False), 20
    )
    assert isinstance(taken, Lease)  # the lost lease's row ran out: a new call takes it


def test_calls_parked_before_a_restart_are_handed_the_lock_after_it(
    server: PrivatePostgres, locker: PostgresLocker
) -> None:
    queue = locker.queue
    assert queue is not None
    lease = locker.try_acquire("job", 30.0, owner=Owner(task_id="a"), park=b"a\n{}")
    parked = locker.try_acquire("job", 30.0, owner=Owner(task_id="b"), park=b"b\n{}")
    assert isinstance(lease, Lease) and isinstance(parked, Parked)
    server.restart()
    released = wait_until(lambda: _released(locker, lease), timeout=20)
    assert released == (True, [b"b\n{}"])


def _released(locker: PostgresLocker, lease: Lease) -> object:
    """The release's reply, or None while the kept connections still fail after the restart."""
    assert locker.queue is not None
    try:
        return locker.queue.release_handing_on(lease, limit=1, reservation_ttl=5.0)
    except LockBackendUnavailable:
        return None
