"""Releases handed to the process releaser run off the caller's path, in order, once."""

from __future__ import annotations

import os
import threading

import redis

from celery_singleton_lock.engine import Lease, RedisLocker, Releaser, Renewer
from celery_singleton_lock.testing import RedisServer
from tests.support import CountingConnection


def test_a_handed_over_release_frees_the_lock(redis_client: redis.Redis) -> None:
    releaser = Releaser()
    locker = RedisLocker(redis_client, prefix="t", renewer=Renewer(), releaser=releaser)
    lease = locker.try_acquire("job", 30)
    assert isinstance(lease, Lease)
    outcomes: list[object] = []
    done = threading.Event()
    assert locker.release_soon(lease, lambda owned: (outcomes.append(owned), done.set()))
    assert done.wait(5)
    assert outcomes == [True]
    assert not redis_client.exists(lease.key)


def test_renewal_stops_at_hand_over(redis_client: redis.Redis) -> None:
    renewer = Renewer(autostart=False)
    locker = RedisLocker(redis_client, prefix="t", renewer=renewer, releaser=Releaser())
    lease = locker.try_acquire("job", 30)
    assert isinstance(lease, Lease)
    locker.release_soon(lease)
    assert renewer.leases() == []
    assert lease.released


def test_handing_over_twice_releases_once(counting_client: redis.Redis) -> None:
    releaser = Releaser()
    locker = RedisLocker(counting_client, prefix="t", renewer=Renewer(), releaser=releaser)
    locker.try_acquire("warm", 30).release()  # type: ignore[union-attr]
    lease = locker.try_acquire("job", 30)
    assert isinstance(lease, Lease)
    CountingConnection.reset()
    assert locker.release_soon(lease) is True
    assert locker.release_soon(lease) is False
    assert releaser.flush(5)
    assert CountingConnection.sent == ["EVALSHA"]


def test_a_failed_release_is_reported_and_the_thread_survives() -> None:
    with RedisServer.running() as server:
        client = server.client(socket_timeout=0.3, socket_connect_timeout=0.3)
        releaser = Releaser()
        locker = RedisLocker(client, prefix="t", renewer=Renewer(), releaser=releaser)
        first = locker.try_acquire("a", 30)
        assert isinstance(first, Lease)
        outcomes: list[object] = []
        server.pause()
        try:
            locker.release_soon(first, outcomes.append)
            assert releaser.flush(10)
        finally:
            server.resume()
        second = locker.try_acquire("b", 30)
        assert isinstance(second, Lease)
        locker.release_soon(second, outcomes.append)
        assert releaser.flush(5)
        assert outcomes == [None, True]


def test_release_all_runs_pending_hand_overs_first(redis_client: redis.Redis) -> None:
    releaser = Releaser()
    locker = RedisLocker(redis_client, prefix="t", renewer=Renewer(), releaser=releaser)
    leases = [locker.try_acquire(f"job-{i}", 30) for i in range(50)]
    for lease in leases[:25]:
        locker.release_soon(lease)  # type: ignore[arg-type]
    assert locker.release_all() == 25
    assert releaser.pending() == 0
    assert list(redis_client.scan_iter(match="t:*")) == []


def test_a_forked_child_does_not_run_its_parents_pending_releases(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client()
    releaser = Releaser()
    locker = RedisLocker(client, prefix="t", renewer=Renewer(), releaser=releaser)
    lease = locker.try_acquire("parent-job", 30)
    assert isinstance(lease, Lease)
    with releaser._wakeup:  # hold the queue so the hand-over is still pending at fork
        releaser._queue.append((lease, None))
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            os._exit(0 if releaser.pending() == 0 else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    releaser._queue.clear()
    assert client.exists(lease.key)
    assert lease.release()
