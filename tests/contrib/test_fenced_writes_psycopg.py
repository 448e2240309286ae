"""The plain psycopg helpers on the real PostgreSQL: a write conditional on the lock's fence,
refused by the database for a holder whose fence is older, with fences from either lock
server."""

from __future__ import annotations

import threading
from typing import Any, Iterator

import pytest
import redis

from celery_singleton_lock.engine import Lease, RedisLocker, Renewer
from celery_singleton_lock.errors import StaleFenceError
from tests.contrib.conftest import connect
from tests.engine.conftest import stop_renewing

pytest.importorskip("psycopg")

from celery_singleton_lock.contrib.fencing.psycopg import (
    claim_fence,
    create_fence_table,
    fenced_update,
)
from celery_singleton_lock.engine.postgres.locker import PostgresLocker


def account(db: Any, account_id: int = 1) -> tuple[int, Any]:
    row = db.execute("SELECT balance, fence FROM accounts WHERE id = %s", [account_id]).fetchone()
    return int(row[0]), row[1]


def test_a_write_with_a_newer_fence_passes_and_stores_the_fence(db: Any) -> None:
    assert fenced_update(db, "accounts", {"id": 1}, {"balance": 10}, 6) == 1
    assert account(db) == (10, 6)


def test_a_write_with_an_older_fence_is_refused_and_writes_nothing(db: Any) -> None:
    with pytest.raises(StaleFenceError) as refused:
        fenced_update(db, "accounts", {"id": 1}, {"balance": 10}, 4)
    assert (refused.value.fence, refused.value.seen) == (4, 5)
    assert "already carries fence 5" in str(refused.value)
    assert account(db) == (0, 5)


def test_the_same_fence_writes_again(db: Any) -> None:
    fenced_update(db, "accounts", {"id": 1}, {"balance": 10}, 5)
    fenced_update(db, "accounts", {"id": 1}, {"balance": 20}, 5)
    assert account(db) == (20, 5)


def test_a_row_never_written_under_a_lock_takes_any_fence(db: Any) -> None:
    fenced_update(db, "accounts", {"id": 2}, {"balance": 3}, 1)
    assert account(db, 2) == (3, 1)


def test_no_matching_row_raises_lookup_error(db: Any) -> None:
    with pytest.raises(LookupError, match="no row of accounts"):
        fenced_update(db, "accounts", {"id": 99}, {"balance": 1}, 7)


def test_a_refused_write_rolls_back_with_the_callers_transaction(schema_url: str) -> None:
    with connect(schema_url) as conn:
        with pytest.raises(StaleFenceError), conn.transaction():
            conn.execute("UPDATE accounts SET balance = 99 WHERE id = 2")
            fenced_update(conn, "accounts", {"id": 1}, {"balance": 10}, 3)
        assert account(conn, 2) == (0, None)  # the write before it went with the transaction


def test_none_as_the_fence_is_refused_before_any_sql(db: Any) -> None:
    with pytest.raises(ValueError, match="lock_fencing=True"):
        fenced_update(db, "accounts", {"id": 1}, {"balance": 10}, None)  # type: ignore[arg-type]


@pytest.fixture
def fences(db: Any) -> Any:
    create_fence_table(db)
    return db


def test_claim_fence_refuses_an_older_fence_of_the_resource(fences: Any) -> None:
    claim_fence(fences, "account:1", 8)
    with pytest.raises(StaleFenceError) as refused:
        claim_fence(fences, "account:1", 7)
    assert (refused.value.key, refused.value.seen) == ("account:1", 8)


def test_claim_fence_passes_a_newer_fence_and_the_same_one(fences: Any) -> None:
    claim_fence(fences, "account:1", 8)
    claim_fence(fences, "account:1", 8)
    claim_fence(fences, "account:1", 9)
    row = fences.execute("SELECT fence FROM singleton_lock_fences").fetchall()
    assert row == [(9,)]


def test_a_newer_claim_beside_an_open_older_transaction_wins_and_refuses_it_after(
    schema_url: str, fences: Any
) -> None:
    claimed = threading.Event()
    with connect(schema_url) as older, older.transaction():
        claim_fence(older, "account:1", 3)
        newer_outcome: list[Any] = []

        def newer() -> None:
            with connect(schema_url) as conn, conn.transaction():
                claimed.set()
                claim_fence(conn, "account:1", 4)
                newer_outcome.append("claimed")

        thread = threading.Thread(target=newer)
        thread.start()
        claimed.wait(30)
        older.execute("UPDATE accounts SET balance = balance + 1 WHERE id = 1")
    thread.join(60)
    assert newer_outcome == ["claimed"]
    with pytest.raises(StaleFenceError):  # the older holder, back later, is refused
        claim_fence(fences, "account:1", 3)


# -- fences from either lock server -----------------------------------------------------------


@pytest.fixture(params=["redis", "postgres"])
def lock_server(request: Any, schema_url: str) -> Iterator[Any]:
    """A locker of each backend: the fence comes from whichever lock server issued it."""
    renewer = Renewer(autostart=False)
    if request.param == "redis":
        client: redis.Redis = request.getfixturevalue("redis_client")
        yield RedisLocker(client, prefix="t", renewer=renewer)
    else:
        locker = PostgresLocker(schema_url, prefix="t", renewer=renewer)
        yield locker
        locker.close()
    stop_renewing(renewer)


def take(locker: Any) -> Lease:
    lease = locker.try_acquire("account:1", 30, fencing=True, renew=False)
    assert isinstance(lease, Lease) and lease.fence is not None, lease
    return lease


def test_a_lock_holder_overtaken_by_a_newer_one_has_its_write_refused(
    lock_server: Any, db: Any
) -> None:
    db.execute("UPDATE accounts SET fence = NULL")
    first = take(lock_server)
    lock_server.release(first)  # as if its lease ran out while it stalled
    second = take(lock_server)
    assert second.fence is not None and first.fence is not None and second.fence > first.fence
    fenced_update(db, "accounts", {"id": 1}, {"balance": 2}, second.fence)
    with pytest.raises(StaleFenceError):
        fenced_update(db, "accounts", {"id": 1}, {"balance": 1}, first.fence)
    assert account(db) == (2, second.fence)
