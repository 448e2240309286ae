"""``lock_limit``: up to N holders of one lock name, each on its own slot (engine/slots.py)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from celery_singleton_lock.engine import Latest, Lease, LockHolder, Owner, RedisLocker, Renewer
from celery_singleton_lock.errors import LockConfigurationError
from tests.support import CountingConnection


def take(locker: RedisLocker, limit: int, task_id: str = "", **options: object) -> object:
    return locker.try_acquire(
        "job",
        10.0,
        owner=Owner(task_id=task_id),
        limit=limit,
        **options,  # type: ignore[arg-type]
    )


def held_keys(locker: RedisLocker, limit: int = 1000) -> list[str]:
    """The names of the slots of lock "job" held now, read through the public reading API."""
    return [holder.key for holder in locker.inspect.holders("job", limit)]


def ttl_of(locker: RedisLocker, lease: Lease) -> float:
    """Seconds left on the slot ``lease`` holds, read through the public reading API."""
    held = {holder.key: holder for holder in locker.inspect.holders("job", 1000)}
    ttl = held[lease.key].ttl
    assert ttl is not None
    return ttl


def shorten(locker: RedisLocker, lease: Lease, seconds: float) -> None:
    """Leave ``lease``'s slot only ``seconds`` to live (its TTL replaced by its owner's)."""
    assert locker.renew_by_owner([("job", lease.owner, seconds)]) == []


def test_three_slots_take_three_holders_and_refuse_the_fourth(locker: RedisLocker) -> None:
    taken = [take(locker, 3) for _ in range(4)]
    assert [type(outcome) for outcome in taken] == [Lease, Lease, Lease, LockHolder]
    assert len({lease.key for lease in taken[:3]}) == 3  # type: ignore[attr-defined]


def test_the_first_slot_is_named_as_the_lock_key_and_has_no_key_of_its_own(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, 3)
    assert isinstance(lease, Lease)
    assert lease.key == locker.keys("job").lock and redis_client.exists(lease.key) == 0


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
    assert held_keys(locker) == [second.key]


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
    shorten(locker, second, 0.5)
    assert locker.renew_batch([second], now=locker.renewer.clock()) == []
    assert ttl_of(locker, second) > 5


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
    shorten(locker, short, 3.0)
    holder = take(locker, 2)
    assert isinstance(holder, LockHolder)
    assert holder.task_id == "short"


def test_a_limit_with_latest_wins_is_refused(locker: RedisLocker) -> None:
    with pytest.raises(LockConfigurationError, match="latest wins"):
        take(locker, 2, task_id="t", park=b"message", latest=Latest(0.0, None))


def test_renew_by_owner_with_a_limit_renews_the_owners_slot(locker: RedisLocker) -> None:
    take(locker, 3, task_id="first", renew=False)
    second = take(locker, 3, task_id="second", renew=False)
    assert isinstance(second, Lease) and second.key.endswith(":slot:2")
    shorten(locker, second, 0.5)
    assert locker.renew_by_owner([("job", second.owner, 20.0)], limits=[3]) == []
    assert ttl_of(locker, second) > 15


def test_renew_by_owner_with_a_limit_reports_an_owner_holding_no_slot_lost(
    locker: RedisLocker,
) -> None:
    take(locker, 3, task_id="first", renew=False)
    assert locker.renew_by_owner([("job", Owner(task_id="nobody"), 20.0)], limits=[3]) == [0]


def test_renew_by_owner_finds_the_owners_slot_without_reading_the_others(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    for i in range(999):
        take(locker, 1000, task_id=f"other-{i}", renew=False)
    mine = take(locker, 1000, task_id="mine", renew=False)
    assert isinstance(mine, Lease) and mine.key.endswith(":slot:1000")
    redis_client.config_resetstat()
    assert locker.renew_by_owner([("job", mine.owner, 20.0)], limits=[1000]) == []
    stats = redis_client.info("commandstats")
    assert sum(stat["calls"] for stat in stats.values()) < 20


def test_renew_by_owner_follows_an_owner_that_took_another_slot(locker: RedisLocker) -> None:
    first = take(locker, 3, task_id="first", renew=False)
    mine = take(locker, 3, task_id="mine", renew=False)
    assert isinstance(first, Lease) and isinstance(mine, Lease)
    held = [("job", mine.owner, 20.0)]
    assert locker.renew_by_owner(held, limits=[3]) == []
    first.release()
    mine.release()
    again = locker.try_acquire("job", 10.0, owner=mine.owner, limit=3, renew=False)
    assert isinstance(again, Lease) and again.key == locker.keys("job").lock  # slot 1 now
    assert locker.renew_by_owner(held, limits=[3]) == []
    assert ttl_of(locker, again) > 15


def test_release_abandoned_frees_only_the_dead_owners_slot(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first = take(locker, 3, task_id="first", renew=False)
    dead = take(locker, 3, task_id="dead", renew=False)
    assert isinstance(first, Lease) and isinstance(dead, Lease)
    owner = dead.owner
    freed = locker.release_abandoned("job", task_id="dead", host=owner.host, pid=owner.pid, slot=2)
    assert freed is True
    assert held_keys(locker) == [first.key]


def test_release_abandoned_without_a_slot_frees_the_slot_its_owner_holds(
    locker: RedisLocker,
) -> None:
    first = take(locker, 3, task_id="first", renew=False)
    dead = take(locker, 3, task_id="dead", renew=False)
    assert isinstance(first, Lease) and isinstance(dead, Lease)
    owner = dead.owner
    assert locker.release_abandoned("job", task_id="dead", host=owner.host, pid=owner.pid)
    assert held_keys(locker) == [first.key]


def test_release_abandoned_of_another_slot_frees_nothing(locker: RedisLocker) -> None:
    take(locker, 3, task_id="first", renew=False)
    dead = take(locker, 3, task_id="dead", renew=False)
    assert isinstance(dead, Lease)
    owner = dead.owner
    freed = locker.release_abandoned("job", task_id="dead", host=owner.host, pid=owner.pid, slot=1)
    assert freed is False and len(held_keys(locker)) == 2


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

    from celery_singleton_lock.engine.keys import SharedKeys
    from celery_singleton_lock.engine.kinds.slots import acquire_call

    keys = locker.keys("job")
    shared = SharedKeys("t", cluster=True).of(keys.lock)  # the counter and records of its slot
    script_keys, _ = acquire_call(keys, 10, 1000, "v", True, (3, 1.0), shared, "t", 60000)
    assert len({key_slot(key.encode()) for key in script_keys}) == 1


# -- the slot table: cost and reuse ------------------------------------------------------------


def test_an_acquire_with_999_of_1000_slots_held_sends_as_many_commands_as_with_1_of_10(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    def commands_of_one_acquire(limit: int) -> int:
        name = f"job-{limit}"
        for i in range(limit - 1):
            locker.try_acquire(name, 30, owner=Owner(task_id=f"o-{i}"), limit=limit, renew=False)
        redis_client.config_resetstat()
        lease = locker.try_acquire(name, 30, owner=Owner(task_id="last"), limit=limit, renew=False)
        assert isinstance(lease, Lease) and lease.key.endswith(f":slot:{limit}")
        stats = redis_client.info("commandstats")
        return sum(int(stat["calls"]) for name, stat in stats.items() if name != "cmdstat_evalsha")

    assert commands_of_one_acquire(1000) == commands_of_one_acquire(10)


def commands_of_a_cycle(locker: RedisLocker, redis_client: redis.Redis, limit: int) -> int:
    """The commands the scripts of one acquire and release of a free lock run."""
    name = f"cycle-{limit}"
    first = locker.try_acquire(name, 30, limit=limit, renew=False)
    assert isinstance(first, Lease) and first.release()  # loads the scripts: not counted
    redis_client.config_resetstat()
    lease = locker.try_acquire(name, 30, owner=Owner(task_id="t"), limit=limit, renew=False)
    assert isinstance(lease, Lease) and lease.release()
    stats = redis_client.info("commandstats")
    counted = {k: int(stat["calls"]) for k, stat in stats.items() if "resetstat" not in k}
    return sum(counted.values()) - counted["cmdstat_evalsha"]


def test_an_acquire_and_release_of_a_free_small_limit_run_at_most_13_commands(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    # the table is missing: slot 1 written unread; the last release deletes the table unread
    assert commands_of_a_cycle(locker, redis_client, 3) <= 13


def test_the_release_of_the_last_live_slot_beside_an_expired_one_frees_every_number(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    dead, alive = take(locker, 3, task_id="dead", renew=False), take(locker, 3, renew=False)
    assert isinstance(dead, Lease) and isinstance(alive, Lease)
    shorten(locker, dead, 0.05)
    deadline = time.monotonic() + 30
    while any(h.task_id == "dead" for h in locker.inspect.holders("job", 3)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert alive.release()
    assert [h.task_id for h in locker.inspect.holders("job", 3)] == []
    again = take(locker, 3, task_id="again", renew=False)
    assert isinstance(again, Lease) and again.key == dead.key  # slot 1


def test_a_release_by_a_token_whose_slot_expired_is_refused(locker: RedisLocker) -> None:
    lease = take(locker, 3, renew=False)
    assert isinstance(lease, Lease)
    shorten(locker, lease, 0.05)
    deadline = time.monotonic() + 30
    while locker.inspect.holders("job", 3):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert not lease.release()


def test_the_slot_of_an_expired_holder_is_taken_again(locker: RedisLocker) -> None:
    dead = take(locker, 2, task_id="dead", renew=False)
    take(locker, 2, task_id="alive", renew=False)
    assert isinstance(dead, Lease)
    shorten(locker, dead, 0.05)
    deadline = time.monotonic() + 30
    while any(h.task_id == "dead" for h in locker.inspect.holders("job", 2)):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    again = take(locker, 2, task_id="new", renew=False)
    assert isinstance(again, Lease) and again.key == dead.key


def test_every_key_of_a_slot_table_expires_after_its_last_slot_within_twice_its_ttl(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, 3, renew=False)  # ttl 10 s
    assert isinstance(lease, Lease)
    table = locker.keys("job").slot_table
    assert all(9_000 < redis_client.pttl(key) <= 20_000 for key in table)


def test_the_release_of_the_last_slot_deletes_the_slot_table(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first, second = take(locker, 3, renew=False), take(locker, 3, renew=False)
    assert isinstance(first, Lease) and isinstance(second, Lease)
    table = locker.keys("job").slot_table
    first.release()
    assert redis_client.exists(*table) == 2
    second.release()
    assert redis_client.exists(*table) == 0


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


def test_a_tick_renews_lock_keys_and_slots_in_one_round_trip(counting_client: redis.Redis) -> None:
    locker = RedisLocker(counting_client, prefix="t", renewer=Renewer(autostart=False))
    plain = locker.try_acquire("plain", 10.0, renew=False)
    slot = locker.try_acquire("job", 10.0, limit=3, renew=False)
    assert isinstance(plain, Lease) and isinstance(slot, Lease) and slot.slot == 1
    shorten(locker, slot, 0.5)
    locker.renew_batch([plain, slot], now=locker.renewer.clock())  # loads the script
    CountingConnection.reset()
    assert locker.renew_batch([plain, slot], now=locker.renewer.clock()) == []
    assert CountingConnection.sent == ["EVALSHA"]
    assert ttl_of(locker, slot) > 5


def test_a_tick_reports_a_slot_given_back_lost_and_renews_the_rest(locker: RedisLocker) -> None:
    first, second = take(locker, 3, renew=False), take(locker, 3, renew=False)
    assert isinstance(first, Lease) and isinstance(second, Lease)
    owner = first.owner
    assert locker.release_abandoned("job", task_id="", host=owner.host, pid=owner.pid, slot=1)
    assert locker.renew_batch([first, second], now=locker.renewer.clock()) == [0]


def test_a_slot_table_rebuilt_after_its_holder_expired_keeps_a_ttl_on_both_keys(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    dead = take(locker, 1, task_id="dead", renew=False, rate=(100, 1.0))  # one slot, a table
    assert isinstance(dead, Lease) and dead.slot == 1
    shorten(locker, dead, 0.05)
    deadline = time.monotonic() + 30
    while locker.inspect.holders("job", 1):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    again = take(locker, 1, task_id="new", renew=False, rate=(100, 1.0))  # gives slot 1 back
    assert isinstance(again, Lease) and again.slot == 1
    assert all(redis_client.pttl(key) > 0 for key in locker.keys("job").slot_table)
