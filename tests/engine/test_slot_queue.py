"""Policy ``queue`` over N slots, a rate and a cooldown (engine/kinds/slot_queue.py): parked calls
are handed each freed slot in arrival order, atomically in the release, once each."""

from __future__ import annotations

import time
from typing import Any, Optional, Union

import pytest
import redis

from celery_singleton_lock.engine import Lease, LockHolder, Owner, RedisLocker
from celery_singleton_lock.engine.lease import Parked
from celery_singleton_lock.errors import LockError
from tests.support import SHORT_TTL, wait_until, wait_until_due

Outcome = Union[Lease, LockHolder, Parked]


def attempt(
    locker: RedisLocker,
    task_id: str,
    *,
    limit: int = 2,
    rate: Optional[tuple[int, float]] = None,
    reservation_ttl: float = 30,
    ttl: float = 30,
    **options: Any,
) -> Outcome:
    """One acquire-or-park of the lock "job" by ``task_id``, whose message is ``msg-<id>``."""
    return locker.try_acquire(
        "job",
        ttl=ttl,
        owner=Owner(task_id=task_id),
        renew=False,
        park=f"msg-{task_id}".encode(),
        reservation_ttl=reservation_ttl,
        limit=limit,
        rate=rate,
        **options,
    )


def lease(outcome: Outcome) -> Lease:
    assert isinstance(outcome, Lease), outcome
    return outcome


def release(locker: RedisLocker, held: Lease, **options: Any) -> list[bytes]:
    options.setdefault("limit", 2)
    owned, handed = locker.queue.release_handing_on(held, reservation_ttl=30, **options)
    assert owned
    return handed


def full_with_parked(locker: RedisLocker, *parked: str) -> Lease:
    """Slots 1 and 2 taken by "a" and "b", then ``parked`` parked: "a"'s lease."""
    first = lease(attempt(locker, "a"))
    lease(attempt(locker, "b"))
    for task_id in parked:
        assert isinstance(attempt(locker, task_id), Parked)
    return first


def parked_ids(locker: RedisLocker) -> list[bytes]:
    return list(locker.client.zrange(locker.keys("job").parked, 0, -1))


def reserved_for(client: redis.Redis, locker: RedisLocker, limit: int = 2) -> list[bytes]:
    """The task ids the lock's slots are reserved for (pid 0, no host), by slot, read through
    the public reading API."""
    return [
        holder.task_id.encode()
        for holder in locker.inspect.holders("job", limit)
        if holder.pid == 0 and not holder.host
    ]


def test_calls_beyond_the_limit_are_parked_in_arrival_order(locker: RedisLocker) -> None:
    lease(attempt(locker, "a")), lease(attempt(locker, "b"))
    third, fourth = attempt(locker, "c"), attempt(locker, "d")
    assert isinstance(third, Parked) and isinstance(fourth, Parked)
    assert (third.position, fourth.position) == (1, 2)
    assert parked_ids(locker) == [b"c", b"d"]


def test_a_released_slot_is_reserved_for_the_oldest_parked_call_and_its_message_returned(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first = full_with_parked(locker, "c", "d")
    assert release(locker, first) == [b"msg-c"]
    assert reserved_for(redis_client, locker) == [b"c"]


def test_two_releases_reserve_two_slots_for_two_different_parked_calls(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first, second = lease(attempt(locker, "a")), lease(attempt(locker, "b"))
    attempt(locker, "c"), attempt(locker, "d"), attempt(locker, "e")
    assert release(locker, first) + release(locker, second) == [b"msg-c", b"msg-d"]
    assert sorted(reserved_for(redis_client, locker)) == [b"c", b"d"]


def test_the_reserved_call_takes_its_slot_and_leaves_the_parked_list(
    locker: RedisLocker,
) -> None:
    first = full_with_parked(locker, "c")
    release(locker, first)
    taken = lease(attempt(locker, "c"))
    assert taken.key == first.key and parked_ids(locker) == []


def test_a_newcomer_does_not_take_a_slot_reserved_for_a_parked_call(
    locker: RedisLocker,
) -> None:
    first = full_with_parked(locker, "c")
    release(locker, first)
    late = attempt(locker, "z")
    assert isinstance(late, Parked) and parked_ids(locker) == [b"c", b"z"]


def test_a_newcomer_finding_a_free_slot_hands_it_to_an_older_parked_call(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first = full_with_parked(locker, "c")
    first.release()  # a plain release (by hand): nothing handed on
    late = attempt(locker, "z")
    assert isinstance(late, Parked) and late.handed == b"msg-c"
    assert reserved_for(redis_client, locker) == [b"c"]


def test_twelve_calls_over_three_slots_each_run_once_in_arrival_order(
    locker: RedisLocker,
) -> None:
    ids = [f"t{i:02d}" for i in range(12)]
    running = [lease(attempt(locker, i, limit=3)) for i in ids[:3]]
    for task_id in ids[3:]:
        assert isinstance(attempt(locker, task_id, limit=3), Parked)
    started = list(ids[:3])
    for _ in range(12):  # bounded: one release per call
        if not running:
            break
        for message in release(locker, running.pop(0), limit=3):
            task_id = message.decode()[len("msg-") :]
            running.append(lease(attempt(locker, task_id, limit=3)))
            started.append(task_id)
    assert started == ids and parked_ids(locker) == []


def test_a_dropped_call_reserved_a_slot_hands_it_to_the_next(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first = full_with_parked(locker, "c", "d")
    release(locker, first)
    assert locker.queue.drop_parked("job", "c", reservation_ttl=30) == b"msg-d"
    assert reserved_for(redis_client, locker) == [b"d"] and parked_ids(locker) == [b"d"]


def test_a_sweeper_reserves_again_for_a_call_whose_reservation_ran_out(
    locker: RedisLocker,
) -> None:
    first = lease(attempt(locker, "a", reservation_ttl=0.2))
    lease(attempt(locker, "b"))
    attempt(locker, "c", reservation_ttl=0.2)
    assert locker.queue.release_handing_on(first, limit=2, reservation_ttl=0.2)[1] == [b"msg-c"]
    wait_until(lambda: locker.queue.hand_off_due().names == ["job"], timeout=5)
    assert locker.queue.hand_on("job", reservation_ttl=30) == [b"msg-c"]


def test_a_slot_freed_by_a_dead_holders_ttl_is_handed_on_by_the_sweeper(
    locker: RedisLocker,
) -> None:
    lease(attempt(locker, "a"))
    lease(attempt(locker, "b", ttl=0.3))  # never renewed: as if its holder died
    attempt(locker, "c")
    wait_until(lambda: locker.queue.hand_off_due().names == ["job"], timeout=5)
    assert locker.queue.hand_on("job", reservation_ttl=30) == [b"msg-c"]


def test_a_call_over_the_rate_is_parked_and_due_when_the_window_allows(
    locker: RedisLocker,
) -> None:
    rate = (1, 0.5)
    lease(attempt(locker, "a", rate=rate)).release()
    over = attempt(locker, "b", rate=rate)
    assert isinstance(over, Parked) and locker.queue.hand_off_due().names == []
    wait_until(lambda: locker.queue.hand_off_due().names == ["job"], timeout=5)
    assert locker.queue.hand_on("job", reservation_ttl=30) == [b"msg-b"]


def test_a_reservation_counts_as_a_start_of_the_rate(locker: RedisLocker) -> None:
    rate = (2, 30.0)
    first = lease(attempt(locker, "a", rate=rate, limit=1))
    attempt(locker, "b", rate=rate, limit=1), attempt(locker, "c", rate=rate, limit=1)
    assert release(locker, first, limit=1, rate=rate) == [b"msg-b"]
    lease(attempt(locker, "b", rate=rate, limit=1))
    assert locker.queue.hand_on("job", reservation_ttl=30) == []  # c: over the rate, not handed


def test_a_release_into_a_cooldown_hands_the_slot_on_when_the_cooldown_ends(
    locker: RedisLocker,
) -> None:
    first = lease(attempt(locker, "a", limit=1))
    attempt(locker, "b", limit=1)
    started = time.monotonic()
    assert release(locker, first, limit=1, cooldown=0.5) == []
    assert locker.queue.hand_off_due().names == []
    wait_until(lambda: locker.queue.hand_on("job", reservation_ttl=30) == [b"msg-b"], timeout=5)
    assert time.monotonic() - started >= 0.45  # not before the cooldown's end


def test_a_lock_whose_slots_are_taken_reads_as_held_beside_its_parked_calls(
    locker: RedisLocker,
) -> None:
    """The slot table holds the holders, not the lock key: `locks doctor` warns of calls
    parked behind a free lock, so this one must read as held."""
    full_with_parked(locker, "c", "d")
    assert locker.inspect.parked_locks() == [("job", 2, True)]


def test_a_lock_whose_slots_all_freed_reads_as_free_beside_its_parked_calls(
    locker: RedisLocker,
) -> None:
    """Its holders' TTLs over, nobody handed the slots on yet: what the doctor reports."""
    lease(attempt(locker, "a", limit=1, ttl=0.2))
    assert isinstance(attempt(locker, "b", limit=1), Parked)
    wait_until(lambda: locker.inspect.parked_locks() == [("job", 1, False)], timeout=10)


def test_the_index_forgets_a_lock_once_nothing_is_parked(locker: RedisLocker) -> None:
    first = lease(attempt(locker, "a", limit=1, rate=(5, 1.0)))
    attempt(locker, "b", limit=1, rate=(5, 1.0))
    release(locker, first, limit=1, rate=(5, 1.0))
    lease(attempt(locker, "b", limit=1, rate=(5, 1.0)))
    client = locker.client
    keys = locker.keys("job")
    assert client.zscore(locker.shared.handoff_index(keys.lock), "job") is None
    assert client.exists(keys.parked_rule) == 0


def test_a_slot_table_key_holding_something_else_is_refused_not_overwritten(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    slots_key = locker.keys("job").slot_table[0]
    redis_client.set(slots_key, "user data")
    with pytest.raises(LockError):
        attempt(locker, "a")
    assert redis_client.get(slots_key) == b"user data"


def test_a_copy_of_a_running_call_is_neither_parked_nor_run(locker: RedisLocker) -> None:
    lease(attempt(locker, "a"))
    copy = attempt(locker, "a")
    assert isinstance(copy, LockHolder) and copy.task_id == "a"
    assert parked_ids(locker) == []


def test_fairly_parked_calls_are_handed_the_lock_round_robin_across_values(
    locker: RedisLocker,
) -> None:
    holder = lease(attempt(locker, "h", limit=1, fair="A"))
    for task_id, value in (("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B")):
        assert isinstance(attempt(locker, task_id, limit=1, fair=value), Parked)
    assert parked_ids(locker) == [b"a1", b"b1", b"a2", b"b2", b"a3"]
    assert release(locker, holder, limit=1) == [b"msg-a1"]


def test_a_value_idle_for_a_while_joins_the_current_round_not_the_first(
    locker: RedisLocker,
) -> None:
    holder = lease(attempt(locker, "h", limit=1))
    for task_id in ("a1", "a2", "a3", "a4"):
        attempt(locker, task_id, limit=1, fair="A")
    release(locker, holder, limit=1)  # reserved for a1: a1 leaves the parked calls
    lease(attempt(locker, "a1", limit=1, fair="A"))
    attempt(locker, "b1", limit=1, fair="B")  # the oldest parked now is a2, of round 2
    assert parked_ids(locker) == [b"a2", b"b1", b"a3", b"a4"]


def test_the_fair_rounds_go_with_the_last_parked_call(locker: RedisLocker) -> None:
    holder = lease(attempt(locker, "h", limit=1))
    attempt(locker, "a1", limit=1, fair="A")
    assert locker.client.exists(locker.keys("job").parked_rounds) == 1
    release(locker, holder, limit=1)
    release(locker, lease(attempt(locker, "a1", limit=1, fair="A")), limit=1)
    assert locker.client.exists(locker.keys("job").parked_rounds) == 0


def test_a_live_cap_lowered_while_calls_are_parked_hands_on_no_slot_above_it(
    locker: RedisLocker,
) -> None:
    cap_key = "singleton-lock:cap:proj.job"
    first = lease(attempt(locker, "a", limit=3, cap_key=cap_key))
    lease(attempt(locker, "b", limit=3, cap_key=cap_key))
    assert isinstance(attempt(locker, "c", limit=3, cap_key=cap_key), Lease)
    assert isinstance(attempt(locker, "d", limit=3, cap_key=cap_key), Parked)
    locker.client.hset(cap_key, "cap", 2)  # 3 run: a release leaves 2 taken, the cap
    assert release(locker, first, limit=3, cap_key=cap_key) == []
    assert parked_ids(locker) == [b"d"]


def test_a_live_cap_is_read_by_the_sweeper_from_the_lock_rule(locker: RedisLocker) -> None:
    cap_key = "singleton-lock:cap:proj.job"
    locker.client.hset(cap_key, "cap", 1)
    lease(attempt(locker, "a", limit=3, cap_key=cap_key, ttl=SHORT_TTL))
    assert isinstance(attempt(locker, "b", limit=3, cap_key=cap_key), Parked)
    assert isinstance(attempt(locker, "c", limit=3, cap_key=cap_key), Parked)
    wait_until_due(locker, "job")  # a's holder died: its slot expired
    assert locker.queue.hand_on("job", reservation_ttl=30) == [b"msg-b"]  # one, not two


# -- priority (the message's, read the broker's way by the Celery layer) ----------------------


def test_a_parked_call_of_a_higher_rank_is_handed_a_slot_before_older_ones(
    locker: RedisLocker,
) -> None:
    held = full_with_parked(locker, "c")
    assert isinstance(attempt(locker, "d", priority=5), Parked)
    assert parked_ids(locker) == [b"d", b"c"]
    assert release(locker, held) == [b"msg-d"]


def test_parked_calls_of_one_rank_keep_their_arrival_order(locker: RedisLocker) -> None:
    full_with_parked(locker)
    for task_id in "cde":
        attempt(locker, task_id, priority=3)
    attempt(locker, "f", priority=-3)
    assert parked_ids(locker) == [b"c", b"d", b"e", b"f"]


# -- priority within a fairness value (lua/includes/fair_queue.lua) -------------------------


def park_fairly(locker: RedisLocker, *calls: tuple[str, str, int]) -> Lease:
    """The lock's one slot taken by "h", then each ``(task id, value, rank)`` parked fairly:
    "h"'s lease."""
    holder = lease(attempt(locker, "h", limit=1))
    for task_id, value, rank in calls:
        assert isinstance(attempt(locker, task_id, limit=1, fair=value, priority=rank), Parked)
    return holder


def hand_out_order(locker: RedisLocker, holder: Lease) -> list[str]:
    """Release ``holder``, then let each call handed the slot take it and release it in turn:
    the task ids in the order they were handed the slot."""
    order: list[str] = []
    handed = release(locker, holder, limit=1)
    for _ in range(20):  # more than any test parks
        if not handed:
            break
        (message,) = handed
        order.append(message.decode()[len("msg-") :])
        handed = release(locker, lease(attempt(locker, order[-1], limit=1)), limit=1)
    return order


def test_a_fair_values_turn_goes_to_its_parked_call_of_the_highest_rank(
    locker: RedisLocker,
) -> None:
    holder = park_fairly(locker, ("a1", "A", 0), ("a2", "A", 0), ("b1", "B", 0), ("a3", "A", 5))
    assert hand_out_order(locker, holder) == ["a3", "b1", "a1", "a2"]


def test_a_fair_values_best_call_finding_the_lock_free_takes_its_values_first_turn(
    locker: RedisLocker,
) -> None:
    holder = park_fairly(locker, ("a1", "A", 0), ("b1", "B", 0), ("a2", "A", 5))
    holder.release()  # a plain release (by hand): the lock is free, nothing handed on
    taken = lease(attempt(locker, "a2", limit=1, fair="A", priority=5))  # its message again
    assert hand_out_order(locker, taken) == ["b1", "a1"]  # a1 waits in a2's later turn


def test_a_fair_call_finding_the_lock_free_at_its_turn_hands_it_to_its_values_best_call(
    locker: RedisLocker,
) -> None:
    holder = park_fairly(locker, ("a1", "A", 0), ("b1", "B", 0), ("a2", "A", 5))
    holder.release()  # a plain release (by hand): the lock is free, nothing handed on
    late = attempt(locker, "a1", limit=1, fair="A")  # its message again
    assert isinstance(late, Parked) and late.handed == b"msg-a2"


def test_fair_values_keep_their_round_robin_whatever_their_calls_ranks(
    locker: RedisLocker,
) -> None:
    holder = park_fairly(
        locker, ("a1", "A", 9), ("a2", "A", 9), ("a3", "A", 9), ("b1", "B", -9), ("b2", "B", 0)
    )
    assert hand_out_order(locker, holder) == ["a1", "b2", "a2", "b1", "a3"]


def test_fair_calls_of_one_value_and_rank_go_in_arrival_order(locker: RedisLocker) -> None:
    holder = park_fairly(locker, ("a1", "A", 3), ("a2", "A", 3), ("a3", "A", 3), ("a0", "A", 0))
    assert hand_out_order(locker, holder) == ["a1", "a2", "a3", "a0"]


def test_a_fair_call_whose_reservation_ran_out_is_handed_the_slot_again_not_its_values_next(
    locker: RedisLocker,
) -> None:
    holder = lease(attempt(locker, "h", limit=1))
    for task_id, rank in (("a1", 0), ("a2", 5)):
        attempt(locker, task_id, limit=1, fair="A", priority=rank, reservation_ttl=SHORT_TTL)
    locker.queue.release_handing_on(holder, limit=1, reservation_ttl=SHORT_TTL)  # for a2
    assert isinstance(attempt(locker, "a3", limit=1, fair="A", priority=9), Parked)
    wait_until_due(locker, "job")  # a2's message was never delivered: its reservation ran out
    assert locker.queue.hand_on("job", reservation_ttl=30) == [b"msg-a2"]


def test_a_dropped_fair_call_is_never_handed_its_values_turn(locker: RedisLocker) -> None:
    holder = park_fairly(locker, ("a1", "A", 0), ("a2", "A", 5))
    assert locker.queue.drop_parked("job", "a2", reservation_ttl=30) is True
    assert hand_out_order(locker, holder) == ["a1"]


def test_a_fair_order_entry_an_older_worker_left_behind_is_dropped_not_handed(
    locker: RedisLocker,
) -> None:
    holder = park_fairly(locker, ("a1", "A", 0), ("a2", "A", 5))
    keys = locker.keys("job")
    locker.client.zrem(keys.parked, "a2")  # dropped by a version without the fair order
    locker.client.hdel(keys.parked_messages, "a2")
    assert hand_out_order(locker, holder) == ["a1"]


def test_the_fair_order_goes_with_the_last_parked_call(locker: RedisLocker) -> None:
    holder = park_fairly(locker, ("a1", "A", 0), ("a2", "A", 5))
    assert locker.client.exists(*locker.keys("job").parked_fair) == 2
    hand_out_order(locker, holder)
    assert locker.client.exists(*locker.keys("job").parked_fair) == 0


def test_a_queue_slot_taken_indexes_its_slot_table_in_the_held_index(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    held = lease(attempt(locker, "a"))
    assert redis_client.zscore("t:held", held.keys.slot_table[0]) is not None


def test_a_slot_reserved_on_release_keeps_its_slot_table_listed(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    first = full_with_parked(locker, "c")
    release(locker, first)
    assert sorted(holder.task_id for holder in locker.inspect.scan()) == ["b", "c"]


def test_the_last_queue_slot_released_takes_its_slot_table_out_of_the_held_index(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    release(locker, lease(attempt(locker, "a")))
    assert redis_client.zcard("t:held") == 0


def test_an_acquire_and_release_of_a_free_queue_with_nothing_parked_run_at_most_15_commands(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    release(locker, lease(attempt(locker, "warm", limit=1)), limit=1)  # loads the scripts
    redis_client.config_resetstat()
    release(locker, lease(attempt(locker, "a", limit=1)), limit=1)
    stats = redis_client.info("commandstats")
    counted = {k: int(stat["calls"]) for k, stat in stats.items() if "resetstat" not in k}
    # no table, nothing parked: slot 1 written unread; the last release deletes the table
    assert sum(counted.values()) - counted["cmdstat_evalsha"] <= 15


def test_a_call_finding_no_slot_taken_but_an_older_call_parked_does_not_overtake_it(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease(attempt(locker, "a", limit=1))
    assert isinstance(attempt(locker, "b", limit=1), Parked)
    redis_client.delete(*locker.keys("job").slot_table)  # as if "a" expired and was given back
    assert isinstance(attempt(locker, "c", limit=1), Parked)
