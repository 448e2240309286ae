"""The PostgreSQL backend's kept connections across a restart of the server (a private
PostgreSQL, tests/postgres_servers.py): a connection the server closed while it sat idle is
dropped before use, so the first statements after a restart do not fail on a dead socket."""

from __future__ import annotations

import contextlib
from typing import Iterator

import pytest

from celery_singleton_lock.engine.acquire_request import AcquireRequest
from celery_singleton_lock.engine.lease import Lease
from celery_singleton_lock.engine.renewer import Renewer
from tests.postgres_servers import PrivatePostgres, private_postgres

pytest.importorskip("psycopg")  # the oldest corner installs no psycopg

from celery_singleton_lock.engine.postgres.locker import PostgresLocker


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    with private_postgres() as started:
        yield started


@pytest.fixture
def locker(server: PrivatePostgres) -> Iterator[PostgresLocker]:
    if not server.running():
        server.start()
    made = PostgresLocker(f"{server.url}?schema=restart", renewer=Renewer(autostart=False))
    try:
        yield made
    finally:
        made.close()


def keep_connections(locker: PostgresLocker, count: int) -> None:
    """Leave ``count`` connections kept idle (all open at once, then put back)."""
    with contextlib.ExitStack() as stack:
        for _ in range(count):
            stack.enter_context(locker.connections.connection()).execute("SELECT 1")


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_the_first_acquires_after_a_restart_do_not_fail_on_the_kept_connections(
    server: PrivatePostgres, locker: PostgresLocker, mode: str
) -> None:
    keep_connections(locker, 4)
    server.stop(mode)
    server.start()
    for n in range(4):  # one per kept connection: each would have failed on its dead socket
        assert isinstance(locker.acquire(AcquireRequest(f"{mode}-{n}", 10, renew=False)), Lease)


def test_a_renewal_after_a_restart_renews_the_lease(
    server: PrivatePostgres, locker: PostgresLocker
) -> None:
    lease = locker.acquire(AcquireRequest("renewed", 10, renew=False))
    assert isinstance(lease, Lease)
    keep_connections(locker, 2)
    server.stop("fast")
    server.start()
    assert locker.renew_batch([lease], now=lease.confirmed_at) == []  # none lost
