"""A release sent without waiting frees the lock at once; its outcome arrives once the reply
is read (by the next command on that connection, or by the settler thread)."""

from __future__ import annotations

import os
import threading
from typing import Optional

import redis

from celery_singleton_lock.engine import Lease, Owner, RedisLocker, Renewer, ReplySettler
from celery_singleton_lock.testing import RedisServer
from tests.support import CountingConnection, wait_until

#: A settler that never looks by itself within a test: replies stay unread until asked.
NEVER = 3600.0


def make_locker(client: redis.Redis, settler: ReplySettler) -> RedisLocker:
    return RedisLocker(client, prefix="t", renewer=Renewer(), settler=settler)


def acquired(locker: RedisLocker, name: str) -> Lease:
    lease = locker.try_acquire(name, 30)
    assert isinstance(lease, Lease)
    return lease


def test_the_lock_is_free_before_its_reply_is_read(redis_client: redis.Redis) -> None:
    settler = ReplySettler(interval=NEVER)
    locker = make_locker(redis_client, settler)
    lease = acquired(locker, "job")
    outcomes: list[Optional[bool]] = []
    assert locker.release_soon(lease, outcomes.append)
    wait_until(lambda: not redis_client.exists(lease.key), timeout=5, interval=0.005)
    assert outcomes == []  # nobody has read the reply yet
    assert locker.connections.has_pending()
    assert settler.flush(5)
    assert outcomes == [True]


def test_the_settler_thread_reads_the_reply_of_an_idle_connection(
    redis_client: redis.Redis,
) -> None:
    locker = make_locker(redis_client, ReplySettler(interval=0.02))
    lease = acquired(locker, "job")
    outcomes: list[Optional[bool]] = []
    done = threading.Event()
    locker.release_soon(lease, lambda owned: (outcomes.append(owned), done.set()))
    assert done.wait(5)
    assert outcomes == [True]
    assert not locker.connections.has_pending()


def test_the_next_command_on_the_connection_reads_the_earlier_reply_first(
    redis_client: redis.Redis,
) -> None:
    locker = make_locker(redis_client, ReplySettler(interval=NEVER))
    first = acquired(locker, "a")
    outcomes: list[Optional[bool]] = []
    locker.release_soon(first, outcomes.append)
    second = acquired(locker, "b")  # same thread, same connection
    assert outcomes == [True]
    assert second.fence is None and redis_client.exists(second.key)


def test_renewal_stops_when_the_release_is_sent(redis_client: redis.Redis) -> None:
    renewer = Renewer(autostart=False)
    locker = RedisLocker(
        redis_client, prefix="t", renewer=renewer, settler=ReplySettler(interval=NEVER)
    )
    lease = acquired(locker, "job")
    locker.release_soon(lease)
    assert renewer.leases() == []
    assert lease.released


def test_releasing_twice_sends_one_command(counting_client: redis.Redis) -> None:
    settler = ReplySettler(interval=NEVER)
    locker = make_locker(counting_client, settler)
    acquired(locker, "warm").release()  # loads the scripts
    lease = acquired(locker, "job")
    CountingConnection.reset()
    assert locker.release_soon(lease) is True
    assert locker.release_soon(lease) is False
    assert settler.flush(5)
    assert CountingConnection.sent == ["EVALSHA"]


def test_a_release_sent_after_a_script_flush_is_sent_again_and_confirmed(
    redis_client: redis.Redis,
) -> None:
    settler = ReplySettler(interval=NEVER)
    locker = make_locker(redis_client, settler)
    lease = acquired(locker, "job")
    redis_client.script_flush()  # e.g. a failover to a replica that never saw the scripts
    outcomes: list[Optional[bool]] = []
    locker.release_soon(lease, outcomes.append)
    assert settler.flush(5)
    assert outcomes == [True]
    assert not redis_client.exists(lease.key)


def test_a_reply_lost_with_its_server_is_reported_unknown_and_later_releases_work() -> None:
    with RedisServer.running() as server:
        client = server.client(socket_timeout=0.3, socket_connect_timeout=0.3)
        settler = ReplySettler(interval=NEVER)
        locker = make_locker(client, settler)
        first = acquired(locker, "a")
        outcomes: list[Optional[bool]] = []
        server.pause()
        try:
            locker.release_soon(first, outcomes.append)  # sent; no reply will come
            assert settler.flush(10)
        finally:
            server.resume()
        assert outcomes == [None]
        second = acquired(locker, "b")
        locker.release_soon(second, outcomes.append)
        assert settler.flush(5)
        assert outcomes == [None, True]


def test_release_all_reads_pending_replies_then_releases_the_rest(
    redis_client: redis.Redis,
) -> None:
    settler = ReplySettler(interval=NEVER)
    locker = make_locker(redis_client, settler)
    leases = [acquired(locker, f"job-{i}") for i in range(50)]
    outcomes: list[Optional[bool]] = []
    for lease in leases[:25]:
        locker.release_soon(lease, outcomes.append)
    assert locker.release_all() == 25
    assert not locker.connections.has_pending()
    assert outcomes == [True] * 25
    assert list(redis_client.scan_iter(match="t:{*}")) == []


def test_a_forked_child_never_reads_its_parents_replies(redis_server: RedisServer) -> None:
    client = redis_server.client()
    settler = ReplySettler(interval=NEVER)
    locker = make_locker(client, settler)
    lease = acquired(locker, "parent-job")
    outcomes: list[Optional[bool]] = []
    locker.release_soon(lease, outcomes.append)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - child
        clean = not locker.connections.has_pending() and settler.flush(1) and outcomes == []
        os._exit(0 if clean else 3)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert settler.flush(5)
    assert outcomes == [True]


def test_a_release_sent_without_waiting_can_remember_its_owner(redis_client: redis.Redis) -> None:
    settler = ReplySettler(interval=NEVER)
    locker = make_locker(redis_client, settler)
    lease = locker.try_acquire("job", 30, owner=Owner(task_id="t-9"))
    assert isinstance(lease, Lease)
    locker.release_soon(lease, remember_for=60)
    assert settler.flush(5)
    record = locker.finished("job", "t-9")
    assert record is not None and record.task_id == "t-9"


def test_a_deferred_release_after_the_server_lost_its_keys_reports_not_ours(
    redis_server: RedisServer,
) -> None:
    client = redis_server.client(socket_timeout=5, socket_connect_timeout=2)
    locker = RedisLocker(client, prefix="t", renewer=Renewer(autostart=False))
    lease = locker.try_acquire("job", 30, renew=False)
    assert isinstance(lease, Lease)
    redis_server.restart()  # keeps nothing: the lock is gone, the kept connection is dead
    outcomes: list[Optional[bool]] = []
    locker.release_soon(lease, outcomes.append)
    wait_until(lambda: outcomes, timeout=5)
    assert outcomes == [False]  # Redis answered: not ours. Not "could not release" (None)
