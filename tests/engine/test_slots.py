"""``lock_limit``: up to N holders of one lock name, each on its own slot (engine/slots.py)."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from celery_singleton_lock.engine import Latest, Lease, LockHolder, Owner, RedisLocker
from celery_singleton_lock.errors import LockConfigurationError


def take(locker: RedisLocker, limit: int, task_id: str = "", **options: object) -> object:
    return locker.try_acquire(
        "job",
        10.0,
        owner=Owner(task_id=task_id),
        limit=limit,
        **options,  # type: ignore[arg-type]
    )


def test_three_slots_take_three_holders_and_refuse_the_fourth(locker: RedisLocker) -> None:
    taken = [take(locker, 3) for _ in range(4)]
    assert [type(outcome) for outcome in taken] == [Lease, Lease, Lease, LockHolder]
    assert len({lease.key for lease in taken[:3]}) == 3  # type: ignore[attr-defined]


def test_the_first_slot_is_the_mutex_key(locker: RedisLocker) -> None:
    lease = take(locker, 3)
    assert isinstance(lease, Lease)
    assert lease.key == locker.keys("job").lock


def test_a_released_slot_is_taken_again(locker: RedisLocker) -> None:
    leases = [take(locker, 2) for _ in range(2)]
    assert isinstance(leases[0], Lease)
    leases[0].release()
    again = take(locker, 2)
    assert isinstance(again, Lease)
    assert again.key == leases[0].key


def test_a_release_frees_only_the_releasers_slot(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first, second = take(locker, 2), take(locker, 2)
    assert isinstance(first, Lease) and isinstance(second, Lease)
    first.release()
    assert first.release() is False  # a second release frees nothing more
    assert redis_client.exists(second.key) == 1


def test_fences_strictly_increase_across_slots(locker: RedisLocker) -> None:
    fences = []
    for _ in range(6):
        lease = take(locker, 3, fencing=True)
        assert isinstance(lease, Lease)
        fences.append(lease.fence)
        lease.release()
    assert fences == sorted(set(fences)) and len(fences) == 6


def test_a_slot_is_renewed_by_the_batched_renewal(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    take(locker, 2)
    second = take(locker, 2)
    assert isinstance(second, Lease)
    redis_client.pexpire(second.key, 500)
    assert locker.renew_batch([second], now=locker.renewer.clock()) == []
    assert redis_client.pttl(second.key) > 5000


def test_a_resent_acquire_with_the_same_token_takes_no_second_slot(locker: RedisLocker) -> None:
    token = "a" * 32
    first = take(locker, 3, token=token, renew=False)
    again = take(locker, 3, token=token, renew=False)
    assert isinstance(first, Lease) and isinstance(again, Lease)
    assert first.key == again.key


def test_all_slots_held_reports_the_holder_that_frees_first(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    take(locker, 2, task_id="long", renew=False)
    short = take(locker, 2, task_id="short", renew=False)
    assert isinstance(short, Lease)
    redis_client.pexpire(short.key, 3000)
    holder = take(locker, 2)
    assert isinstance(holder, LockHolder)
    assert holder.task_id == "short"


def test_a_limit_with_latest_wins_is_refused(locker: RedisLocker) -> None:
    with pytest.raises(LockConfigurationError, match="latest wins"):
        take(locker, 2, task_id="t", park=b"message", latest=Latest(0.0, None))


def test_renew_by_owner_with_a_limit_renews_the_owners_slot(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    take(locker, 3, task_id="first", renew=False)
    second = take(locker, 3, task_id="second", renew=False)
    assert isinstance(second, Lease) and second.key.endswith(":slot:2")
    redis_client.pexpire(second.key, 500)
    assert locker.renew_by_owner([("job", second.owner, 20.0)], limits=[3]) == []
    assert redis_client.pttl(second.key) > 15_000


def test_renew_by_owner_with_a_limit_reports_an_owner_holding_no_slot_lost(
    locker: RedisLocker,
) -> None:
    take(locker, 3, task_id="first", renew=False)
    assert locker.renew_by_owner([("job", Owner(task_id="nobody"), 20.0)], limits=[3]) == [0]


def test_renew_by_owner_with_a_limit_reads_only_the_owners_slot_after_the_first_call(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    for i in range(999):
        take(locker, 1000, task_id=f"other-{i}", renew=False)
    mine = take(locker, 1000, task_id="mine", renew=False)
    assert isinstance(mine, Lease) and mine.key.endswith(":slot:1000")
    held = [("job", mine.owner, 20.0)]
    reads = []
    for _ in range(2):
        redis_client.config_resetstat()
        assert locker.renew_by_owner(held, limits=[1000]) == []
        reads.append(redis_client.info("commandstats")["cmdstat_get"]["calls"])
    assert reads == [1000, 1]  # every slot once, then the one it remembered


def test_renew_by_owner_renews_an_owner_that_took_another_slot_again_at_the_next_call(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first = take(locker, 3, task_id="first", renew=False)
    mine = take(locker, 3, task_id="mine", renew=False)
    assert isinstance(first, Lease) and isinstance(mine, Lease)
    held = [("job", mine.owner, 20.0)]
    assert locker.renew_by_owner(held, limits=[3]) == []  # remembers slot 2
    first.release()
    mine.release()
    again = locker.try_acquire("job", 10.0, owner=mine.owner, limit=3, renew=False)
    assert isinstance(again, Lease) and again.key == locker.keys("job").lock  # slot 1 now
    assert locker.renew_by_owner(held, limits=[3]) == [0]  # slot 2 names it no more
    assert locker.renew_by_owner(held, limits=[3]) == []  # every slot sent again
    assert redis_client.pttl(again.key) > 15_000


def test_release_abandoned_frees_only_the_dead_owners_slot(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first = take(locker, 3, task_id="first", renew=False)
    dead = take(locker, 3, task_id="dead", renew=False)
    assert isinstance(first, Lease) and isinstance(dead, Lease)
    owner = dead.owner
    freed = locker.release_abandoned("job", task_id="dead", host=owner.host, pid=owner.pid, slot=2)
    assert freed is True
    assert (redis_client.exists(dead.key), redis_client.exists(first.key)) == (0, 1)


def test_holders_reads_every_slot(locker: RedisLocker) -> None:
    for task_id in ("a", "b"):
        take(locker, 3, task_id=task_id, renew=False)
    assert sorted(holder.task_id for holder in locker.inspect.holders("job", 3)) == ["a", "b"]


def test_scan_lists_every_held_slot(locker: RedisLocker) -> None:
    for task_id in ("a", "b", "c"):
        take(locker, 3, task_id=task_id, renew=False)
    listed = sorted(holder.key for holder in locker.inspect.scan())
    assert listed == sorted(
        [locker.keys("job").lock, *(f"{locker.keys('job').lock}:slot:{k}" for k in (2, 3))]
    )


def test_every_key_of_a_limited_rated_lock_shares_one_cluster_slot(locker: RedisLocker) -> None:
    from redis.crc import key_slot

    from celery_singleton_lock.engine.shared_keys import SharedKeys
    from celery_singleton_lock.engine.slots import acquire_call

    keys = locker.keys("job")
    shared = SharedKeys("t", cluster=True).of(keys.lock)  # the counter and records of its slot
    script_keys, _ = acquire_call(keys, 10, 1000, "v", True, (3, 1.0), shared, "t", 60000)
    assert len({key_slot(key.encode()) for key in script_keys}) == 1


# -- the live cap (celery locks limit) ---------------------------------------------------------


def capped_acquire(locker: RedisLocker, task_id: str, cap_key: str, limit: int = 3) -> Any:
    return locker.try_acquire(
        "job", ttl=30, owner=Owner(task_id=task_id), renew=False, limit=limit, cap_key=cap_key
    )


def test_a_live_cap_below_the_limit_refuses_a_slot_once_that_many_are_taken(
    locker: RedisLocker,
) -> None:
    cap_key = "singleton-lock:cap:proj.job"
    locker.client.hset(cap_key, "cap", 1)
    assert isinstance(capped_acquire(locker, "a", cap_key), Lease)
    held = capped_acquire(locker, "b", cap_key)
    assert isinstance(held, LockHolder) and held.task_id == "a"


def test_without_a_live_cap_set_the_declared_limit_holds(locker: RedisLocker) -> None:
    cap_key = "singleton-lock:cap:proj.job"
    assert all(isinstance(capped_acquire(locker, t, cap_key), Lease) for t in "abc")
    assert isinstance(capped_acquire(locker, "d", cap_key), LockHolder)


def test_a_live_cap_of_zero_refuses_every_slot_and_asks_to_come_back(locker: RedisLocker) -> None:
    cap_key = "singleton-lock:cap:proj.job"
    locker.client.hset(cap_key, "cap", 0)
    refused = capped_acquire(locker, "a", cap_key)
    assert isinstance(refused, LockHolder) and refused.over_rate and refused.ttl == 1.0
