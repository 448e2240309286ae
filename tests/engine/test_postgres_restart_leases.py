"""A restart of PostgreSQL under the PostgreSQL backend (a private server of the test's own:
tests/postgres_servers.py): a lease outlives a short restart (its rows are committed; the
renewer reconnects), a lease whose TTL runs out while the server is down is reported lost, a
new call takes the lock after the restart, and parked calls are handed on after it."""

from __future__ import annotations

import threading
import time
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
    server.restart()
    time.sleep(8.0)  # past the TTL it had at the restart: only renewals kept it
    assert lease.held
    assert isinstance(locker.try_acquire("job", 6.0, owner=Owner(task_id="other")), LockHolder)
    assert locker.release(lease)
    assert isinstance(locker.try_acquire("job", 6.0, owner=Owner(task_id="new")), Lease)


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
