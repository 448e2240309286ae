from __future__ import annotations

from typing import Iterator, Optional

import pytest
import redis

from celery_singleton_lock.engine import RedisLocker, Renewer, process_renewer
from celery_singleton_lock.testing import RedisServer
from tests.support import CountingConnection


def stop_renewing(renewer: Renewer) -> None:
    """Stop renewing what a test left held: its server is gone once the test ends, and the
    renewer thread would warn about every failed renewal until the interpreter exits."""
    for lease in renewer.leases():
        renewer.discard(lease)


@pytest.fixture(autouse=True)
def _process_renewer_forgets_each_tests_leases() -> Iterator[None]:
    yield
    stop_renewing(process_renewer())


@pytest.fixture
def locker(redis_client: redis.Redis) -> Iterator[RedisLocker]:
    """A locker with its own renewer thread (isolated from other tests' leases)."""
    renewer = Renewer()
    yield RedisLocker(redis_client, prefix="t", renewer=renewer)
    stop_renewing(renewer)


@pytest.fixture
def counting_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client whose every round trip is recorded in ``CountingConnection.sent``."""
    pool = redis.ConnectionPool(
        host="127.0.0.1", port=redis_server.port, connection_class=CountingConnection
    )
    client = redis.Redis(connection_pool=pool)
    client.ping()
    CountingConnection.reset()
    yield client
    pool.disconnect()


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def stored_token(client: redis.Redis, key: str) -> bytes:
    """The token at the start of the lock value stored at ``key`` (b"" when the key is gone)."""
    return bytes(client.getrange(key, 0, 31))


def stored_fields(client: redis.Redis, key: str) -> dict[str, bytes]:
    """The lock value stored at ``key``, split into its named fields (see engine.scripts)."""
    value = client.get(key)
    assert value is not None, f"{key} is not set"
    token, fence, acquired_at, pid, host, task_id = value.split(b"|", 5)
    return {
        "token": token,
        "fence": fence,
        "acquired_at": acquired_at,
        "pid": pid,
        "host": host,
        "task_id": task_id,
    }


def finish_record(locker: RedisLocker, task_id: str) -> Optional[float]:
    """The remaining life in seconds of the finish record of ``task_id`` (written by a
    release with ``remember_for``: its score in a finish-record set is its expiry in server
    ms), or None when there is none alive."""
    seconds, micros = locker.client.time()
    now_ms = seconds * 1000 + micros // 1000
    for key in locker.client.scan_iter(f"{locker.prefix}:finished:*", count=1000):
        expires = locker.client.zscore(key, task_id)
        if expires is not None and expires > now_ms:
            return (expires - now_ms) / 1000
    return None
