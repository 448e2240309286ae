"""Policy ``queue`` on a real Redis Cluster (3 primaries on loopback): parked calls, the fair
order, and the summary of due slots (engine/slot_sweep.py's ``DueSlots``, ``P:due-slots``)
through which a sweeper finds a lock whose holder died at its next tick rather than after a
whole rotation of the windows of slots; and latest wins' marks of the same summary (a waiting
``replace`` call, a release that hands on or leaves a debounced call waiting), through which
a debounced call is handed the lock at its due time.

One cluster for the module (tests/cluster_topology.py); a fresh locker per test (prefix "t"),
so its window of slots starts at slot 0 in every test.
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Iterator, Union

import pytest
from redis.cluster import RedisCluster
from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from celery_singleton_lock.celery.config.servers import close_client, make_client
from celery_singleton_lock.engine import (
    Latest,
    Lease,
    LockHolder,
    Owner,
    Parked,
    RedisLocker,
    Renewer,
)
from celery_singleton_lock.engine.keys import SharedKeys
from celery_singleton_lock.engine.kinds.latest import LatestWins
from celery_singleton_lock.engine.kinds.slot_queue import SlotQueue
from celery_singleton_lock.engine.slot_sweep import WINDOW, DueSlots
from tests.cluster_topology import ClusterGroup
from tests.support import wait_until

TTL = 30.0
#: seconds of a timed pause that the test waits out: set once the call is parked (a pause
#: writes 16,384 copies of its rule, seconds on a loaded machine: a call sent after it could
#: miss it), so that nothing needs to happen before its end: a pause that ends while its
#: copies are still being written only wakes the call as soon as it is read
PAUSE = 1.0
#: seconds of a dying holder's TTL or of a debounce that the test waits out: the same, for a
#: few round trips
SHORT = 3.0
SUMMARY = "t:due-slots"
_names = itertools.count()

Outcome = Union[Lease, LockHolder, Parked]


@pytest.fixture(scope="module")
def client() -> Iterator[RedisCluster]:
    with ClusterGroup.running() as group:
        made = make_client(group.url, {}, cluster=None)
        assert isinstance(made, RedisCluster)
        yield made
        close_client(made)


@pytest.fixture
def locker(client: RedisCluster) -> Iterator[RedisLocker]:
    made = RedisLocker(client, prefix="t", renewer=Renewer(autostart=False))
    yield made
    made.cancels.close()


def far_name(prefix: str) -> str:
    """A fresh lock name whose key lies beyond the first 4 windows of slots: a fresh locker's
    sweep reaches it by its rotation only at its 5th tick."""
    for _ in range(10_000):  # 3/4 of the slots qualify: bounded all the same
        name = f"{prefix}-{next(_names)}"
        if key_slot(f"t:{{{name}}}".encode()) >= 4 * WINDOW:
            return name
    raise AssertionError("no name beyond the first windows")


def attempt(
    locker: RedisLocker, name: str, task_id: str, *, ttl: float = TTL, **options: Any
) -> Outcome:
    """An acquire-or-park of ``name`` by ``task_id`` (policy queue), message ``msg-<id>``."""
    options.setdefault("limit", 1)
    return locker.try_acquire(
        name,
        ttl=ttl,
        owner=Owner(task_id=task_id),
        renew=False,
        park=f"msg-{task_id}".encode(),
        reservation_ttl=TTL,
        **options,
    )


def queue_of(locker: RedisLocker) -> SlotQueue:
    assert locker.queue is not None
    return locker.queue


def due_slots(locker: RedisLocker) -> DueSlots:
    summary = queue_of(locker).due_slots
    assert summary is not None
    return summary


def newest(
    locker: RedisLocker, name: str, task_id: str, *, debounce: float = 0.0, **options: Any
) -> Outcome:
    """:func:`attempt` of a call whose newest wins (``replace``, with ``debounce`` seconds of
    debounce if given)."""
    return attempt(locker, name, task_id, latest=Latest(debounce=debounce), **options)


def latest_of(locker: RedisLocker) -> LatestWins:
    assert locker.latest is not None
    return locker.latest


def release_queue(locker: RedisLocker, lease: Lease) -> tuple[bool, object]:
    return queue_of(locker).release_handing_on(lease, limit=1, reservation_ttl=TTL)


def release_newest(locker: RedisLocker, lease: Lease) -> tuple[bool, object]:
    return latest_of(locker).release_latest(lease, reservation_ttl=TTL)


#: policy -> its acquire (or wait) and its release: queue's and latest wins' mark the summary
POLICIES = {"queue": (attempt, release_queue), "replace": (newest, release_newest)}


def slot_of(locker: RedisLocker, name: str) -> str:
    return str(key_slot(locker.keys(name).lock.encode()))


def wait_until_due(locker: RedisLocker, client: RedisCluster, name: str) -> None:
    """Until the lock ``name`` is due in its slot's hand-off index (its holder's TTL over)."""
    index = locker.shared.handoff_index(locker.keys(name).lock)

    def due() -> bool:
        score = client.zscore(index, name)
        return score is not None and score <= time.time() * 1000

    wait_until(due, timeout=10)


def summary_slots(client: RedisCluster) -> set[str]:
    return {slot.decode() for slot in client.zrange(SUMMARY, 0, -1)}


def sweep_until_handed(
    locker: RedisLocker, client: RedisCluster, name: str, *, timeout: float = 10
) -> list[bytes]:
    """The messages of ``name`` handed on by a sweeper's ticks, each when the summary says its
    slot is due (within ``timeout`` seconds), at most 4: never the rotation (its slot is 4,096
    or beyond: a 5th tick). Other tests' locks found due meanwhile are left alone."""
    queue, slot, handed = queue_of(locker), slot_of(locker, name), []
    for _ in range(4):
        wait_until(
            lambda: (client.zscore(SUMMARY, slot) or 0) <= time.time() * 1000, timeout=timeout
        )
        if name in queue.hand_off_due().names:
            handed += queue.hand_on(name, reservation_ttl=TTL)
        if handed:
            break
    return handed


def test_calls_parked_on_a_cluster_are_handed_the_lock_in_arrival_order(
    locker: RedisLocker,
) -> None:
    name = far_name("order")
    holder = attempt(locker, name, "h")
    assert isinstance(holder, Lease)
    for task_id in ("p1", "p2", "p3"):
        assert isinstance(attempt(locker, name, task_id), Parked)
    queue = queue_of(locker)
    assert queue.release_handing_on(holder, limit=1, reservation_ttl=TTL) == (True, [b"msg-p1"])
    p1 = attempt(locker, name, "p1")
    assert isinstance(p1, Lease)
    assert queue.release_handing_on(p1, limit=1, reservation_ttl=TTL) == (True, [b"msg-p2"])


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_call_waiting_on_a_cluster_marks_its_slot_in_the_summary_of_due_slots(
    locker: RedisLocker, client: RedisCluster, policy: str
) -> None:
    acquire, _ = POLICIES[policy]
    name = far_name(f"mark-{policy}")
    assert isinstance(acquire(locker, name, "h"), Lease)
    client.zrem(SUMMARY, slot_of(locker, name))  # another test's mark of the slot, if any
    assert isinstance(acquire(locker, name, "p1"), Parked)
    assert slot_of(locker, name) in summary_slots(client)


@pytest.mark.parametrize("policy", list(POLICIES))
def test_an_uncontended_acquire_and_release_on_a_cluster_mark_nothing(
    locker: RedisLocker, client: RedisCluster, policy: str
) -> None:
    acquire, release = POLICIES[policy]
    name = far_name(f"alone-{policy}")
    client.zrem(SUMMARY, slot_of(locker, name))
    holder = acquire(locker, name, "h")
    assert isinstance(holder, Lease)
    assert release(locker, holder)[0]
    assert slot_of(locker, name) not in summary_slots(client)


def test_a_release_on_a_cluster_that_leaves_calls_parked_marks_its_slot(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("release")
    holder = attempt(locker, name, "h")
    assert isinstance(holder, Lease)
    for task_id in ("p1", "p2"):
        attempt(locker, name, task_id)
    client.zrem(SUMMARY, slot_of(locker, name))
    queue_of(locker).release_handing_on(holder, limit=1, reservation_ttl=TTL)
    assert slot_of(locker, name) in summary_slots(client)


def test_a_sweeper_finds_a_dead_holders_lock_on_a_cluster_from_the_summary_not_the_rotation(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("dead")
    assert isinstance(attempt(locker, name, "h", ttl=SHORT), Lease)  # never renewed: it "dies"
    assert isinstance(attempt(locker, name, "p1"), Parked)
    queue = queue_of(locker)
    assert name not in queue.hand_off_due().names  # looked at: its holder's TTL is not over
    wait_until_due(locker, client, name)
    # 2nd tick: the rotation reads slots 1,024 to 2,047; the lock lies at 4,096 or beyond
    assert name in queue.hand_off_due().names
    assert queue.hand_on(name, reservation_ttl=TTL) == [b"msg-p1"]


def test_a_swept_slot_is_rescored_to_its_indexs_next_due_time(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("rescore")
    assert isinstance(attempt(locker, name, "h"), Lease)
    assert isinstance(attempt(locker, name, "p1"), Parked)
    queue, slot = queue_of(locker), slot_of(locker, name)
    queue.hand_off_due()  # reads the marked slot
    queue.hand_off_due()  # and re-scores it, looked at
    index = locker.shared.handoff_index(locker.keys(name).lock)
    (_, first), *_ = client.zrange(index, 0, 0, withscores=True)
    assert client.zscore(SUMMARY, slot) == first > time.time() * 1000


def test_a_swept_slot_whose_index_is_empty_leaves_the_summary(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("empty")
    summary = due_slots(locker)
    summary.mark(locker.keys(name).lock)  # marked, but nothing is due there
    queue = queue_of(locker)
    index = locker.shared.handoff_index(locker.keys(name).lock)
    assert client.zcard(index) == 0, "another test left a lock due in this slot"
    queue.hand_off_due()
    queue.hand_off_due()
    assert slot_of(locker, name) not in summary_slots(client)


def test_a_rescore_keeps_a_mark_written_after_the_sweeper_read_the_slot(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("race")
    summary, lock = due_slots(locker), locker.keys(name).lock
    summary.mark(lock)
    seen = summary.due()
    slot = key_slot(lock.encode())
    wait_until(lambda: time.time() * 1000 >= seen[slot] + 2)  # the next mark is a new score
    summary.mark(lock)  # a call parked there after the sweeper read the slot
    marked = client.zscore(SUMMARY, str(slot))
    summary.rescore(seen)  # would remove it: the slot's index is empty
    assert client.zscore(SUMMARY, str(slot)) == marked != seen[slot]


def test_resuming_a_paused_family_on_a_cluster_marks_the_slots_of_its_parked_locks(
    locker: RedisLocker, client: RedisCluster
) -> None:
    family = f"fam{next(_names)}"
    name = far_name(f"{family}:x")
    cap = f"t:cap:{family}"
    locker.live_rules.pause(family, None)
    assert isinstance(attempt(locker, name, "p1", cap_key=cap), Parked)
    client.zrem(SUMMARY, slot_of(locker, name))
    locker.live_rules.resume(family)
    assert slot_of(locker, name) in summary_slots(client)
    assert name in queue_of(locker).hand_off_due().names
    assert queue_of(locker).hand_on(name, reservation_ttl=TTL) == [b"msg-p1"]


@pytest.mark.parametrize("policy", ["queue", "replace"])
def test_a_timed_pause_on_a_cluster_wakes_its_waiting_call_when_it_ends(
    locker: RedisLocker, client: RedisCluster, policy: str
) -> None:
    acquire, _ = POLICIES[policy]
    family = f"fam{next(_names)}"
    name = far_name(f"{family}:x")
    locker.live_rules.pause(family, None)  # until resumed: the call parks inside it, whenever
    waits = acquire(locker, name, "p1", cap_key=f"t:cap:{family}")
    assert isinstance(waits, Parked) and waits.paused
    locker.live_rules.pause(family, PAUSE)  # now timed: a sweeper looks, and again at its end
    rule = SharedKeys.of_slot(locker.live_rules.key(family), int(slot_of(locker, name)))
    end_ms = int(client.hget(rule, "until"))  # the end read by this lock: its slot's copy
    assert sweep_until_handed(locker, client, name, timeout=PAUSE + 10) == [b"msg-p1"]
    assert time.time() * 1000 >= end_ms  # not before: the pause's end woke it


def test_fairly_parked_calls_on_a_cluster_are_handed_the_lock_round_robin(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("fair")
    holder = attempt(locker, name, "h", fair="A")
    assert isinstance(holder, Lease)
    for task_id, value in (("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B")):
        assert isinstance(attempt(locker, name, task_id, fair=value), Parked)
    parked = client.zrange(locker.keys(name).parked, 0, -1)
    assert parked == [b"a1", b"b1", b"a2", b"b2", b"a3"]


def test_calls_parked_over_two_slots_on_a_cluster_are_handed_both_as_they_free(
    locker: RedisLocker,
) -> None:
    name = far_name("limit2")
    first, second = (attempt(locker, name, task_id, limit=2) for task_id in ("a", "b"))
    assert isinstance(first, Lease) and isinstance(second, Lease)
    for task_id in ("p1", "p2"):
        assert isinstance(attempt(locker, name, task_id, limit=2), Parked)
    queue = queue_of(locker)
    assert queue.release_handing_on(first, limit=2, reservation_ttl=TTL) == (True, [b"msg-p1"])
    assert queue.release_handing_on(second, limit=2, reservation_ttl=TTL) == (True, [b"msg-p2"])


def test_the_rotation_still_finds_a_due_lock_whose_slot_was_never_marked(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("unmarked")
    assert isinstance(attempt(locker, name, "h", ttl=SHORT), Lease)
    assert isinstance(attempt(locker, name, "p1"), Parked)
    client.zrem(SUMMARY, slot_of(locker, name))  # as if its marking client died first
    wait_until_due(locker, client, name)
    queue, seen = queue_of(locker), []
    for _ in range(REDIS_CLUSTER_HASH_SLOTS // WINDOW + 1):  # one pass over the slots
        seen += queue.hand_off_due().names
    assert seen.count(name) == 1


# -- latest wins (replace, lock_debounce) ------------------------------------------------------


def test_a_replace_release_on_a_cluster_that_hands_the_lock_on_marks_its_slot(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("latest-handed")
    holder = newest(locker, name, "v1")
    assert isinstance(holder, Lease)
    assert isinstance(newest(locker, name, "v2"), Parked)
    client.zrem(SUMMARY, slot_of(locker, name))
    assert latest_of(locker).release_latest(holder, reservation_ttl=TTL) == (True, b"msg-v2")
    assert slot_of(locker, name) in summary_slots(client)


def test_a_release_on_a_cluster_leaving_a_debounced_call_waiting_marks_its_slot(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("latest-debounced")
    holder = newest(locker, name, "v1")
    assert isinstance(holder, Lease)
    assert isinstance(newest(locker, name, "v2", debounce=60), Parked)
    client.zrem(SUMMARY, slot_of(locker, name))
    assert latest_of(locker).release_latest(holder, reservation_ttl=TTL) == (True, None)
    assert slot_of(locker, name) in summary_slots(client)


def test_a_debounced_burst_on_a_cluster_hands_its_newest_call_the_lock_from_the_summary(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("latest-burst")
    for task_id in ("v1", "v2", "v3"):
        assert isinstance(newest(locker, name, task_id, debounce=SHORT), Parked)
    queue = queue_of(locker)
    assert name not in queue.hand_off_due().names  # its slot is read: due at the debounce's end
    assert sweep_until_handed(locker, client, name, timeout=SHORT + 10) == [b"msg-v3"]


def test_a_replace_call_waiting_behind_a_dead_holder_on_a_cluster_is_found_from_the_summary(
    locker: RedisLocker, client: RedisCluster
) -> None:
    name = far_name("latest-dead")
    assert isinstance(newest(locker, name, "v1", ttl=SHORT), Lease)  # never renewed: it "dies"
    assert isinstance(newest(locker, name, "v2"), Parked)
    assert name not in queue_of(locker).hand_off_due().names  # its holder's TTL is not over
    assert sweep_until_handed(locker, client, name, timeout=SHORT + 10) == [b"msg-v2"]


def test_the_locks_with_calls_parked_on_a_cluster_are_read_from_every_slots_index(
    locker: RedisLocker,
) -> None:
    """What `celery locks doctor` and the metrics' parked gauge read: one lock far from slot 0
    (its index beyond the first windows), its holder and 2 parked calls."""
    name = far_name("inspect")
    assert isinstance(attempt(locker, name, "holder"), Lease)
    for task_id in ("p1", "p2"):
        assert isinstance(attempt(locker, name, task_id), Parked)
    assert [count for found, count, _ in locker.inspect.parked_locks() if found == name] == [2]


def test_a_queue_lock_held_by_its_slot_table_is_read_as_held_not_free(
    locker: RedisLocker,
) -> None:
    """A queue keeps its holder in its slot table, not the lock key: `locks doctor` warns of
    calls parked behind a FREE lock, so a held one must read as held."""
    name = far_name("held")
    assert isinstance(attempt(locker, name, "holder"), Lease)
    assert isinstance(attempt(locker, name, "p1"), Parked)
    assert [held for found, _, held in locker.inspect.parked_locks() if found == name] == [True]
