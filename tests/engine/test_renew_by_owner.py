"""``renew_by_owner``: a supervisor extends its children's locks knowing only who holds them."""

from __future__ import annotations

import redis

from celery_singleton_lock.engine import Lease, Owner, RedisLocker
from celery_singleton_lock.engine.server_renewal import SLOT_CHUNK
from tests.support import CountingConnection

CHILD = Owner(task_id="t1", host="node@h", pid=4242)


def hold(locker: RedisLocker, name: str, owner: Owner, ttl: float = 1.0) -> Lease:
    lease = locker.try_acquire(name, ttl, owner=owner, fencing=True, renew=False)
    assert isinstance(lease, Lease)
    return lease


def test_the_lock_of_the_named_owner_gets_the_new_ttl(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = hold(locker, "a", CHILD, ttl=1)
    assert locker.renew_by_owner([("a", CHILD, 30)]) == []
    assert 1000 < redis_client.pttl(lease.key) <= 30_000


def test_a_lock_held_by_another_execution_is_left_untouched(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    others = [
        Owner(task_id="t2", host=CHILD.host, pid=CHILD.pid),  # same process, other task
        Owner(task_id=CHILD.task_id, host=CHILD.host, pid=1),  # same task id, other process
        Owner(task_id=CHILD.task_id, host="other@h", pid=CHILD.pid),  # another node
    ]
    names = [f"other-{i}" for i in range(len(others))]
    for name, owner in zip(names, others):
        hold(locker, name, owner, ttl=1)
    assert locker.renew_by_owner([(name, CHILD, 30) for name in names]) == [0, 1, 2]
    for name in names:
        assert redis_client.pttl(locker.keys(name).lock) <= 1000


def test_a_released_lock_is_reported_and_never_created_again(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    hold(locker, "a", CHILD).release()
    assert locker.renew_by_owner([("a", CHILD, 30)]) == [0]
    assert not redis_client.exists(locker.keys("a").lock)


def test_a_key_that_is_not_a_lock_is_reported_and_left_as_it_is(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    key = locker.keys("a").lock
    redis_client.set(key, "some other data", px=1000)
    redis_client.rpush(locker.keys("b").lock, "a list")
    assert locker.renew_by_owner([("a", CHILD, 30), ("b", CHILD, 30)]) == [0, 1]
    assert redis_client.get(key) == b"some other data"
    assert redis_client.pttl(key) <= 1000


def test_an_owner_whose_host_needs_escaping_is_matched(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    owner = Owner(task_id="x|y", host="node|1%x", pid=7)
    lease = hold(locker, "a", owner)
    assert locker.renew_by_owner([("a", owner, 30)]) == []
    assert redis_client.pttl(lease.key) > 1000


def test_each_lock_gets_its_own_ttl(locker: RedisLocker, redis_client: redis.Redis) -> None:
    a, b = hold(locker, "a", CHILD), hold(locker, "b", CHILD)
    assert locker.renew_by_owner([("a", CHILD, 20), ("b", CHILD, 40)]) == []
    assert 10_000 < redis_client.pttl(a.key) <= 20_000
    assert 20_000 < redis_client.pttl(b.key) <= 40_000


def test_owned_missing_and_foreign_locks_in_one_call_report_only_those_not_renewed(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    mine = hold(locker, "mine", CHILD)
    hold(locker, "theirs", Owner(task_id="t9", host=CHILD.host, pid=CHILD.pid))
    batch = [("gone", CHILD, 30), ("mine", CHILD, 30), ("theirs", CHILD, 30)]
    assert locker.renew_by_owner(batch) == [0, 2]
    assert redis_client.pttl(mine.key) > 1000


def test_renewing_many_owners_costs_one_round_trip(counting_client: redis.Redis) -> None:
    locker = RedisLocker(counting_client, prefix="t")
    owners = [Owner(task_id=f"t{i}", host="node@h", pid=1000 + i) for i in range(50)]
    for i, owner in enumerate(owners):
        hold(locker, f"k{i}", owner, ttl=30)  # none expires while the others are taken
    locker.renew_by_owner([("warm-up", owners[0], 1)])  # loads the script (NOSCRIPT)
    CountingConnection.reset()
    assert locker.renew_by_owner([(f"k{i}", o, 30) for i, o in enumerate(owners)]) == []
    assert len(CountingConnection.sent) == 1


def test_renewing_more_locks_by_owner_than_a_chunk_is_one_round_trip_reporting_each_lost(
    counting_client: redis.Redis,
) -> None:
    locker = RedisLocker(counting_client, prefix="t")
    held = [
        (f"k{i}", Owner(task_id=f"t{i}", host="node@h", pid=7), 30.0)
        for i in range(2 * SLOT_CHUNK + 100)
    ]
    for name, owner, _ in held:
        # 30 s: taking 500 locks one by one outlasts 1 s on a loaded machine, and the first
        # expired before the renewal, reported lost
        hold(locker, name, owner, ttl=30)
    lost = [0, SLOT_CHUNK - 1, SLOT_CHUNK, 2 * SLOT_CHUNK + 7]
    counting_client.delete(*(locker.keys(held[index][0]).lock for index in lost))
    locker.renew_by_owner(held[:1])  # loads the script (NOSCRIPT)
    counting_client.config_resetstat()
    CountingConnection.reset()
    assert locker.renew_by_owner(held) == lost
    assert CountingConnection.sent == ["PIPELINE"]
    assert counting_client.info("commandstats")["cmdstat_evalsha"]["calls"] == 3


def test_renewing_slots_by_owner_over_chunks_reports_the_locks_with_no_slot_of_theirs(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    owners = [Owner(task_id=f"t{i}", host="node@h", pid=7) for i in range(700)]
    for i, owner in enumerate(owners):  # 700 locks: 4 chunks
        lease = locker.try_acquire(f"k{i}", 30, owner=owner, limit=3, renew=False)
        assert isinstance(lease, Lease)
    lost = [0, 400, 699]
    for index in lost:
        owner = owners[index]
        name = f"k{index}"
        assert locker.release_abandoned(name, task_id=owner.task_id, host=owner.host, pid=7)
    held = [(f"k{i}", owner, 60.0) for i, owner in enumerate(owners)]
    assert locker.renew_by_owner(held, limits=[3] * len(held)) == lost
    renewed = locker.inspect.read("k698")
    assert renewed is not None and renewed.ttl is not None and renewed.ttl > 30  # to 60 s
