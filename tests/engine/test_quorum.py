"""The Redlock quorum (engine/quorum.py) on 3 real redis-server processes on loopback."""

from __future__ import annotations

import threading
import time
from contextlib import ExitStack
from typing import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock.engine import Lease, LockHolder, Owner, Renewer, required
from celery_singleton_lock.engine.redlock import QuorumLease, QuorumLocker, drift
from celery_singleton_lock.engine.waiting import wait_for_release
from celery_singleton_lock.errors import (
    AlreadyFinished,
    LockBackendUnavailable,
    LockConfigurationError,
)
from celery_singleton_lock.testing import RedisServer


@pytest.fixture
def servers() -> Iterator[list[RedisServer]]:
    with ExitStack() as stack:
        yield [stack.enter_context(RedisServer.running()) for _ in range(3)]


def fast_client(server: RedisServer) -> redis.Redis:
    """A client that gives up at once on a stopped server (as the tests stop them)."""
    return redis.Redis(
        host="127.0.0.1",
        port=server.port,
        socket_timeout=2,
        socket_connect_timeout=1,
        retry=Retry(NoBackoff(), 0),
    )


@pytest.fixture
def quorum(servers: list[RedisServer]) -> Iterator[QuorumLocker]:
    locker = QuorumLocker([fast_client(s) for s in servers], prefix="q", renewer=Renewer())
    yield locker
    locker.close()


def settled(outcome: object) -> QuorumLease:
    """The lease of an acquire once every server answered: the acquire returns on a majority,
    and a test that reads or changes each server must not race the last write."""
    assert isinstance(outcome, QuorumLease)
    assert outcome.settle()
    return outcome


def holders_on(servers: list[RedisServer], key: str) -> list[bytes]:
    """The token stored at ``key`` on each running server (b"" where absent)."""
    tokens = []
    for server in servers:
        client = server.client()
        tokens.append(bytes(client.getrange(key, 0, 31)))
        client.close()
    return tokens


def test_an_acquire_writes_the_same_token_on_every_server(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = settled(quorum.try_acquire("job", 5, renew=False))
    assert holders_on(servers, lease.key) == [lease.token.encode()] * 3


def test_an_acquire_indexes_the_lock_in_the_held_index_of_every_server(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = settled(quorum.try_acquire("job", 5, renew=False))
    indexed = []
    for server in servers:
        client = server.client()
        indexed.append(client.zscore("q:held", lease.key) is not None)
        client.close()
    assert indexed == [True] * 3


def test_a_release_deletes_the_lock_on_every_server(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = quorum.try_acquire("job", 5, renew=False)
    assert isinstance(lease, Lease)
    assert lease.release() is True
    assert holders_on(servers, lease.key) == [b""] * 3


def test_a_held_lock_reports_its_holder_to_a_second_acquire(quorum: QuorumLocker) -> None:
    lease = quorum.try_acquire("job", 5, owner=Owner(task_id="first"), renew=False)
    assert isinstance(lease, Lease)
    second = quorum.try_acquire("job", 5, owner=Owner(task_id="second"), renew=False)
    assert isinstance(second, LockHolder)
    assert second.task_id == "first"


def test_the_lock_is_free_again_after_a_release(quorum: QuorumLocker) -> None:
    lease = quorum.try_acquire("job", 5, renew=False)
    assert isinstance(lease, Lease)
    lease.release()
    again = quorum.try_acquire("job", 5, renew=False)
    assert isinstance(again, Lease)


def test_renewal_replaces_the_ttl_on_every_server(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = settled(quorum.try_acquire("job", 5, renew=False))
    for server in servers:
        server.client().pexpire(lease.key, 100)
    assert quorum.renew_batch([lease], now=quorum.renewer.clock()) == []
    assert all(server.client().pttl(lease.key) > 1000 for server in servers)


def test_a_lease_renewed_on_fewer_than_a_majority_is_lost(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = settled(quorum.try_acquire("job", 5, renew=False))
    for server in servers[:2]:  # taken over on two of three
        server.client().delete(lease.key)
    assert quorum.renew_batch([lease], now=quorum.renewer.clock()) == [0]


def test_the_renewer_keeps_a_quorum_lease_alive_past_its_ttl(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = quorum.try_acquire("job", 0.6)
    assert isinstance(lease, Lease)
    time.sleep(1.5)
    assert lease.held
    assert holders_on(servers, lease.key) == [lease.token.encode()] * 3
    lease.release()


def test_a_lease_is_given_only_while_validity_remains(quorum: QuorumLocker) -> None:
    # a TTL shorter than the drift allowance leaves no validity whatever the latency
    ttl = 0.001
    assert ttl - drift(ttl) <= 0
    with pytest.raises(LockBackendUnavailable, match="too late"):
        quorum.try_acquire("job", ttl, renew=False)


def test_a_late_majority_is_rolled_back_on_every_server(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    with pytest.raises(LockBackendUnavailable):
        quorum.try_acquire("job", 0.001, renew=False)
    time.sleep(0.01)
    assert holders_on(servers, "q:{job}") == [b""] * 3


def test_a_partial_acquire_is_rolled_back(quorum: QuorumLocker, servers: list[RedisServer]) -> None:
    # another owner holds the lock on two servers: we take the third, then give it back
    other = "f" * 32
    for server in servers[1:]:
        server.client().set("q:{job}", f"{other}||0|1|elsewhere|theirs", px=5000)
    outcome = quorum.try_acquire("job", 5, owner=Owner(task_id="mine"), renew=False)
    assert isinstance(outcome, LockHolder)
    assert outcome.task_id == "theirs"
    assert holders_on(servers, "q:{job}")[0] == b""


def test_one_server_stopped_still_acquires_renews_and_releases(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    servers[0].stop()
    lease = quorum.try_acquire("job", 5, renew=False)
    assert isinstance(lease, Lease)
    assert quorum.renew_batch([lease], now=quorum.renewer.clock()) == []
    assert lease.release() is True


def test_two_servers_stopped_make_the_acquire_unavailable(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    servers[0].stop()
    servers[1].stop()
    with pytest.raises(LockBackendUnavailable, match="only 1 of 3"):
        quorum.try_acquire("job", 5, renew=False)
    assert holders_on(servers[2:], "q:{job}") == [b""]  # what it took there was given back


def test_two_servers_stopped_make_renewal_unavailable(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = quorum.try_acquire("job", 5, renew=False)
    assert isinstance(lease, Lease)
    servers[0].stop()
    servers[1].stop()
    with pytest.raises(LockBackendUnavailable):
        quorum.renew_batch([lease], now=quorum.renewer.clock())


def test_a_release_that_reached_no_majority_leaves_the_lease_not_held_and_not_renewed(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = settled(quorum.try_acquire("job", 5))
    assert lease in quorum.renewer.leases()
    servers[0].stop()
    servers[1].stop()
    with pytest.raises(LockBackendUnavailable):
        lease.release()
    assert not lease.held
    assert lease not in quorum.renewer.leases()


def test_restarted_servers_resume_the_quorum(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    servers[0].stop()
    servers[1].stop()
    with pytest.raises(LockBackendUnavailable):
        quorum.try_acquire("job", 5, renew=False)
    servers[0].restart()
    servers[1].restart()
    lease = quorum.try_acquire("job", 5, renew=False)
    assert isinstance(lease, Lease)
    assert lease.release() is True


def test_contending_threads_never_hold_the_lock_together(quorum: QuorumLocker) -> None:
    inside, overlaps, runs = [0], [0], [0]
    guard = threading.Lock()

    def worker(index: int) -> None:
        deadline = time.monotonic() + 10
        done = 0
        while done < 15 and time.monotonic() < deadline:
            outcome = quorum.try_acquire("hot", 2, owner=Owner(task_id=f"w{index}"), renew=False)
            if not isinstance(outcome, Lease):
                time.sleep(0.001)
                continue
            with guard:
                inside[0] += 1
                overlaps[0] += inside[0] > 1
            time.sleep(0.002)
            with guard:
                inside[0] -= 1
                runs[0] += 1
            outcome.release()
            done += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert runs[0] == 60
    assert overlaps[0] == 0


def test_a_finish_record_on_a_server_refuses_the_acquire(quorum: QuorumLocker) -> None:
    owner = Owner(task_id="t1")
    lease = quorum.try_acquire("job", 5, owner=owner, renew=False)
    assert isinstance(lease, Lease)
    lease.release(remember_for=60)
    with pytest.raises(AlreadyFinished):
        quorum.try_acquire(
            "job", 5, owner=owner, renew=False, unless_finished=True, finished_ttl=60
        )


def test_fencing_is_refused_on_a_quorum(quorum: QuorumLocker) -> None:
    with pytest.raises(LockConfigurationError, match="Redlock quorum"):
        quorum.try_acquire("job", 5, fencing=True)


def test_queued_markers_are_refused_on_a_quorum_naming_it(quorum: QuorumLocker) -> None:
    with pytest.raises(LockConfigurationError, match=r"dedupe_on_enqueue.*Redlock quorum"):
        required(quorum.markers, quorum, "dedupe_on_enqueue", "enqueue_markers")


def test_fewer_than_three_servers_are_refused(servers: list[RedisServer]) -> None:
    with pytest.raises(LockConfigurationError, match="at least 3"):
        QuorumLocker([fast_client(s) for s in servers[:2]])


def test_the_inspector_reads_a_lock_held_on_a_majority(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    lease = settled(quorum.try_acquire("job", 5, owner=Owner(task_id="t1"), renew=False))
    servers[0].client().delete(lease.key)
    holder = quorum.inspect.read("job")
    assert holder is not None and holder.task_id == "t1"
    assert [h.task_id for h in quorum.inspect.scan()] == ["t1"]
    servers[1].client().delete(lease.key)  # on one server only now: not held
    assert quorum.inspect.read("job") is None
    assert list(quorum.inspect.scan()) == []


def test_a_dead_holders_lock_is_released_on_every_server(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    owner = Owner(task_id="t1", host="node", pid=999_999)
    lease = settled(quorum.try_acquire("job", 5, owner=owner, renew=False))
    assert quorum.release_abandoned("job", task_id="t1", host="node", pid=999_999)
    assert holders_on(servers, lease.key) == [b""] * 3


def test_renew_by_owner_keeps_a_childs_lock_on_the_quorum(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    owner = Owner(task_id="t1", host="node", pid=4242)
    lease = settled(quorum.try_acquire("job", 5, owner=owner, renew=False))
    assert quorum.renew_by_owner([("job", owner, 30)]) == []
    assert all(server.client().pttl(lease.key) > 10_000 for server in servers)
    assert quorum.renew_by_owner([("job", Owner(task_id="t2"), 30)]) == [0]


def test_a_waiter_is_woken_by_a_release_with_one_server_stopped(
    quorum: QuorumLocker, servers: list[RedisServer]
) -> None:
    servers[0].stop()
    lease = quorum.try_acquire("job", 30, renew=False)
    assert isinstance(lease, Lease)
    pubsub = quorum.subscribe_releases("job")
    try:
        releaser = threading.Timer(0.2, lease.release)
        releaser.start()
        started = time.monotonic()
        assert wait_for_release(pubsub, 10) is True
        assert time.monotonic() - started < 9  # woken by the release, not the timeout
        releaser.join(10)
    finally:
        pubsub.close()
