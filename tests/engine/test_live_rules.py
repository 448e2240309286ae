"""The live rule's pause (engine/live_rules.py, lua/includes/live_rule.lua): one hash per task
or group, read by every acquire in the same script call, on a real Redis."""

from __future__ import annotations

import time
from typing import Any

import redis

from celery_singleton_lock.engine import Lease, LockHolder, Owner, RedisLocker
from celery_singleton_lock.engine.acquire_request import AcquireRequest
from celery_singleton_lock.engine.lease import Parked
from tests.support import wait_until

RULE = "t:cap:proj.job"  # the live rule of family "proj.job" under the locker's prefix "t"


def take(locker: RedisLocker, task_id: str, **options: Any) -> Any:
    """One acquire of lock "proj.job:aa" that reads the family's live rule."""
    return locker.try_acquire(
        "proj.job:aa", ttl=30, owner=Owner(task_id=task_id), renew=False, cap_key=RULE, **options
    )


def park(locker: RedisLocker, task_id: str, limit: int = 2) -> Any:
    return take(locker, task_id, park=f"msg-{task_id}".encode(), limit=limit)


def test_a_paused_family_refuses_a_free_mutex_saying_paused(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", 30)
    refused = take(locker, "a")
    assert isinstance(refused, LockHolder) and refused.paused and 25 < refused.ttl <= 30


def test_a_pause_until_resumed_reads_as_no_ttl(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", None)
    refused = take(locker, "a", fencing=True, unless_finished=True)  # the long form
    assert isinstance(refused, LockHolder) and refused.paused and refused.ttl is None


def test_a_paused_family_refuses_a_free_slot(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", 30)
    refused = take(locker, "a", limit=3)
    assert isinstance(refused, LockHolder) and refused.paused


def test_the_prepared_mutex_reads_the_pause_in_its_one_call(locker: RedisLocker) -> None:
    prepared = locker.prepare(AcquireRequest("", 30, renew=False, cap_key=RULE))
    assert isinstance(prepared.acquire("proj.job:bb", Owner(task_id="x")), Lease)
    locker.live_rules.pause("proj.job", 30)
    refused = prepared.acquire("proj.job:cc", Owner(task_id="y"))
    assert isinstance(refused, LockHolder) and refused.paused


def test_a_pause_of_another_family_leaves_this_one_free(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.other", 30)
    assert isinstance(take(locker, "a"), Lease)


def test_a_pause_for_some_seconds_ends_by_itself(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", 0.3)
    wait_until(lambda: not isinstance(take(locker, "probe"), LockHolder), timeout=10)
    assert locker.live_rules.read("proj.job").paused_for is None


def test_resume_ends_a_pause_at_once(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", None)
    locker.live_rules.resume("proj.job")
    assert isinstance(take(locker, "a"), Lease)


def test_a_lengthening_pause_never_shortens_a_longer_one(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", 60)
    locker.live_rules.pause("proj.job", 1, lengthen=True)
    assert locker.live_rules.read("proj.job").paused_for > 50


def test_the_pause_leaves_the_live_cap_in_place(locker: RedisLocker) -> None:
    locker.live_rules.set_cap("proj.job", 2)
    locker.live_rules.pause("proj.job", 30)
    locker.live_rules.resume("proj.job")
    assert locker.live_rules.read("proj.job").cap == 2


def test_a_paused_queue_call_parks_though_a_slot_is_free(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", 30)
    parked = park(locker, "a")
    assert isinstance(parked, Parked) and parked.position == 1


def test_a_sweeper_hands_no_slot_on_while_paused(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", 30)
    park(locker, "a")
    assert locker.queue.hand_on("proj.job:aa", reservation_ttl=30) == []


def test_a_paused_lock_is_due_for_a_sweeper_when_the_pause_ends(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    end = locker.live_rules.pause("proj.job", 20)
    park(locker, "a")
    due = redis_client.zscore("t:handoff-due", "proj.job:aa")
    assert due is not None and abs(due / 1000.0 - end) < 0.05


def test_resume_makes_the_familys_parked_locks_due_now(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.live_rules.pause("proj.job", None)
    park(locker, "a")
    before = time.time()
    locker.live_rules.resume("proj.job")
    due = redis_client.zscore("t:handoff-due", "proj.job:aa")
    assert due is not None and due / 1000.0 < before + 1
    assert locker.queue.hand_on("proj.job:aa", reservation_ttl=30) == [b"msg-a"]


def test_a_resend_of_a_lock_taken_before_the_pause_keeps_it(locker: RedisLocker) -> None:
    first = take(locker, "a", token="0" * 32)
    locker.live_rules.pause("proj.job", 30)
    again = take(locker, "a", token="0" * 32)
    assert isinstance(first, Lease) and isinstance(again, Lease)


def test_the_prepared_mutex_packs_lock_held_index_and_rule_as_redis_py_would(
    locker: RedisLocker, monkeypatch: Any
) -> None:
    prepared = locker.prepare(AcquireRequest("", 30, renew=False, cap_key=RULE))
    sent: list[bytes] = []
    connections = locker.server.connections
    assert connections is not None
    real = connections.call_packed
    monkeypatch.setattr(connections, "call_packed", lambda b: sent.append(b) or real(b))
    assert isinstance(prepared.acquire("proj.job:pk", Owner(task_id="x")), Lease)
    value = sent[0].split(b"\r\n")[-2].decode()  # the lock value, the command's last part
    sha = locker.mutex._acquire_script.sha
    lock = locker.keys("proj.job:pk").lock
    command = ("EVALSHA", sha, 3, lock, "t:held", RULE, 30000, value)
    assert sent[0] == b"".join(redis.Connection().pack_command(*command))


def test_the_prepared_mutex_reading_the_rule_indexes_the_lock_it_takes(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    prepared = locker.prepare(AcquireRequest("", 30, renew=False, cap_key=RULE))
    assert isinstance(prepared.acquire("proj.job:ix", Owner(task_id="x")), Lease)
    assert redis_client.zscore("t:held", locker.keys("proj.job:ix").lock) is not None


def test_a_slot_acquire_reading_the_rule_indexes_the_slot_table_it_takes_from(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    lease = take(locker, "x", limit=2)
    assert isinstance(lease, Lease)
    assert redis_client.zscore("t:held", lease.keys.slot_table[0]) is not None


def test_the_families_with_a_rule_are_listed_from_the_rule_index(
    locker: RedisLocker, redis_client: redis.Redis
) -> None:
    locker.live_rules.pause("proj.job", 30)
    locker.live_rules.set_cap("proj.other", 2)
    assert redis_client.smembers("t:rules") == {b"proj.job", b"proj.other"}
    assert sorted(locker.live_rules.every()) == ["proj.job", "proj.other"]


def test_a_resumed_family_without_a_cap_is_not_listed(locker: RedisLocker) -> None:
    locker.live_rules.pause("proj.job", None)
    locker.live_rules.resume("proj.job")
    assert locker.live_rules.every() == {}
