"""The queue parts of the PostgreSQL backend on the real server: calls parked in rows behind a
lock and handed it in arrival order (policy ``queue``), the newest call waiting alone (policy
``replace``), the sweeper's view of due locks, and cancel flags (policy ``restart``)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest

from celery_singleton_lock.engine import Lease, LockHolder, Owner, Parked, Renewer
from celery_singleton_lock.engine.latest import Latest
from celery_singleton_lock.errors import AlreadySuperseded, LockConfigurationError
from tests.engine.conftest import stop_renewing
from tests.postgres_support import postgres_schema

pytest.importorskip("psycopg")

from celery_singleton_lock.engine.postgres.locker import PostgresLocker

RESERVE = 5.0


@pytest.fixture
def locker() -> Iterator[PostgresLocker]:
    with postgres_schema() as url:
        renewer = Renewer()
        locker = PostgresLocker(url, prefix="t", renewer=renewer)
        yield locker
        stop_renewing(renewer)
        locker.close()


def message(task_id: str) -> bytes:
    return f"{task_id}\n{{}}".encode()


def queue_call(locker: PostgresLocker, task_id: str, ttl: float = 30.0, **options: Any) -> Any:
    return locker.try_acquire(
        "job",
        ttl,
        owner=Owner(task_id=task_id),
        renew=False,
        park=message(task_id),
        reservation_ttl=RESERVE,
        **options,
    )


def latest_call(
    locker: PostgresLocker, task_id: str, sent: str = "", debounce: float = 0.0, **latest: Any
) -> Any:
    return locker.try_acquire(
        "job",
        30.0,
        owner=Owner(task_id=task_id),
        renew=False,
        park=message(task_id),
        latest=Latest(debounce=debounce, sent=sent, **latest),
    )


def release(locker: PostgresLocker, lease: Lease) -> tuple[bool, list[bytes]]:
    assert locker.queue is not None
    return locker.queue.release_handing_on(lease, limit=1, reservation_ttl=RESERVE)


def test_a_call_that_finds_the_lock_held_is_parked_in_arrival_order(
    locker: PostgresLocker,
) -> None:
    assert isinstance(queue_call(locker, "a"), Lease)
    parked = [queue_call(locker, task_id) for task_id in "bcd"]
    assert all(isinstance(outcome, Parked) for outcome in parked)
    assert [outcome.position for outcome in parked] == [1, 2, 3]
    assert parked[0].holder is not None and parked[0].holder.task_id == "a"
    assert locker.inspect.parked("job") == ["b", "c", "d"]


def test_the_release_hands_the_lock_to_the_oldest_parked_call_only(
    locker: PostgresLocker,
) -> None:
    lease = queue_call(locker, "a")
    queue_call(locker, "b")
    queue_call(locker, "c")
    assert release(locker, lease) == (True, [message("b")])
    assert isinstance(queue_call(locker, "c"), Parked)  # reserved for b: c stays behind
    assert isinstance(queue_call(locker, "b"), Lease)
    assert locker.inspect.parked("job") == ["c"]


def test_a_redelivered_copy_of_a_parked_call_keeps_its_place(locker: PostgresLocker) -> None:
    queue_call(locker, "a")
    queue_call(locker, "b")
    queue_call(locker, "c")
    again = queue_call(locker, "b")
    assert isinstance(again, Parked) and again.position == 1
    assert locker.inspect.parked("job") == ["b", "c"]


def test_a_copy_of_the_running_call_is_told_it_holds_the_lock_and_is_not_parked(
    locker: PostgresLocker,
) -> None:
    queue_call(locker, "a")
    copy = queue_call(locker, "a")
    assert isinstance(copy, LockHolder) and copy.task_id == "a"
    assert locker.inspect.parked("job") == []


def test_a_free_lock_goes_to_the_oldest_parked_call_not_to_a_newer_caller(
    locker: PostgresLocker,
) -> None:
    queue_call(locker, "a", ttl=0.3)
    queue_call(locker, "b")
    time.sleep(0.6)  # a's lease ran out without a release (its worker died)
    newer = queue_call(locker, "c")
    assert isinstance(newer, Parked)
    assert newer.handed == message("b")  # the caller publishes b's message
    assert isinstance(queue_call(locker, "b"), Lease)


def test_the_sweeper_finds_a_lock_whose_holder_died_and_hands_it_on(
    locker: PostgresLocker,
) -> None:
    queue = locker.queue
    assert queue is not None
    queue_call(locker, "a", ttl=0.5)
    queue_call(locker, "b")
    due = queue.hand_off_due()
    assert due.names == [] and due.next_in is not None and 0 < due.next_in <= 0.5
    time.sleep(0.7)
    assert queue.hand_off_due().names == ["job"]
    assert queue.hand_on("job", reservation_ttl=RESERVE) == [message("b")]
    assert queue.hand_off_due().names == []  # reserved: not due until the reservation ends


def test_a_reservation_never_taken_up_is_made_again_for_the_same_call(
    locker: PostgresLocker,
) -> None:
    queue = locker.queue
    assert queue is not None
    lease = queue_call(locker, "a")
    queue_call(locker, "b")
    queue_call(locker, "c")
    assert queue.release_handing_on(lease, limit=1, reservation_ttl=0.3) == (True, [message("b")])
    time.sleep(0.5)
    assert queue.hand_off_due().names == ["job"]
    assert queue.hand_on("job", reservation_ttl=RESERVE) == [message("b")]


def test_sent_makes_the_reservation_last_and_is_false_once_taken(locker: PostgresLocker) -> None:
    queue = locker.queue
    assert queue is not None
    lease = queue_call(locker, "a")
    queue_call(locker, "b")
    queue.release_handing_on(lease, limit=1, reservation_ttl=0.3)
    assert queue.handed("job", "b", reservation_ttl=RESERVE)
    time.sleep(0.5)
    assert queue.hand_off_due().names == []
    assert isinstance(queue_call(locker, "b"), Lease)
    assert not queue.handed("job", "b", reservation_ttl=RESERVE)


def test_dropping_the_call_the_lock_is_reserved_for_hands_it_to_the_next(
    locker: PostgresLocker,
) -> None:
    queue = locker.queue
    assert queue is not None
    lease = queue_call(locker, "a")
    queue_call(locker, "b")
    queue_call(locker, "c")
    release(locker, lease)
    assert queue.drop_parked("job", "b", reservation_ttl=RESERVE) == message("c")
    assert queue.drop_parked("job", "nobody", reservation_ttl=RESERVE) is False
    assert isinstance(queue_call(locker, "c"), Lease)


def test_a_release_with_nothing_parked_frees_the_lock(locker: PostgresLocker) -> None:
    lease = queue_call(locker, "a")
    assert release(locker, lease) == (True, [])
    assert locker.inspect.read("job") is None
    assert release(locker, lease) == (False, [])


def test_racing_calls_take_the_lock_once_and_park_the_rest(locker: PostgresLocker) -> None:
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda i: queue_call(locker, f"t{i}"), range(40)))
    assert sum(isinstance(outcome, Lease) for outcome in outcomes) == 1
    parked = sorted(outcome.position for outcome in outcomes if isinstance(outcome, Parked))
    assert parked == list(range(1, 40))


def test_fair_parking_hands_the_lock_round_robin_across_values(locker: PostgresLocker) -> None:
    lease = queue_call(locker, "a")
    for task_id, value in (("x1", "x"), ("x2", "x"), ("x3", "x"), ("y1", "y")):
        queue_call(locker, task_id, fair=value)
    assert locker.inspect.parked("job") == ["x1", "y1", "x2", "x3"]
    assert release(locker, lease)[1] == [message("x1")]


# -- priority (the message's, read the broker's way by the Celery layer: sql/turn.sql) --------


def hand_out_order(locker: PostgresLocker, holder: Lease) -> list[str]:
    """Release ``holder``, then let each call handed the lock take it and release it in turn:
    the task ids in the order they were handed the lock."""
    order: list[str] = []
    handed = release(locker, holder)[1]
    for _ in range(20):  # more than any test parks
        if not handed:
            break
        (sent,) = handed
        order.append(sent.decode().split("\n", 1)[0])
        handed = release(locker, queue_call(locker, order[-1]))[1]
    return order


def park_ranked(locker: PostgresLocker, *calls: tuple[str, int], fair: str = "") -> Lease:
    """The lock taken by "h", then each ``(task id, rank)`` parked (with ``fair``): "h"'s
    lease."""
    holder = queue_call(locker, "h")
    for task_id, rank in calls:
        assert isinstance(queue_call(locker, task_id, fair=fair, priority=rank), Parked)
    return holder


def test_parked_calls_are_handed_the_lock_by_rank_the_redis_brokers_way(
    locker: PostgresLocker,
) -> None:
    """Priorities 9, 0, 5 on a Redis broker (lower first) are ranks -9, 0, -5."""
    holder = park_ranked(locker, ("p9", -9), ("p0", 0), ("p5", -5))
    assert hand_out_order(locker, holder) == ["p0", "p5", "p9"]


def test_a_parked_call_of_a_higher_rank_is_placed_before_older_ones(
    locker: PostgresLocker,
) -> None:
    park_ranked(locker, ("c", 0))
    parked = queue_call(locker, "d", priority=5)
    assert isinstance(parked, Parked) and parked.position == 1
    assert locker.inspect.parked("job") == ["d", "c"]


def test_parked_calls_of_one_rank_keep_their_arrival_order(locker: PostgresLocker) -> None:
    holder = park_ranked(locker, ("c", 3), ("d", 3), ("e", 3), ("f", -3))
    assert hand_out_order(locker, holder) == ["c", "d", "e", "f"]


def test_a_rank_beyond_255_counts_as_255(locker: PostgresLocker) -> None:
    park_ranked(locker, ("a", 255), ("b", 1000))
    assert locker.inspect.parked("job") == ["a", "b"]


def park_fairly(locker: PostgresLocker, *calls: tuple[str, str, int]) -> Lease:
    """The lock taken by "h", then each ``(task id, value, rank)`` parked fairly: "h"'s
    lease."""
    holder = queue_call(locker, "h")
    for task_id, value, rank in calls:
        assert isinstance(queue_call(locker, task_id, fair=value, priority=rank), Parked)
    return holder


def test_a_fair_values_turn_goes_to_its_parked_call_of_the_highest_rank(
    locker: PostgresLocker,
) -> None:
    holder = park_fairly(locker, ("a1", "A", 0), ("a2", "A", 0), ("b1", "B", 0), ("a3", "A", 5))
    assert hand_out_order(locker, holder) == ["a3", "b1", "a1", "a2"]


def test_a_fair_values_best_call_finding_the_lock_free_takes_its_values_first_turn(
    locker: PostgresLocker,
) -> None:
    holder = park_fairly(locker, ("a1", "A", 0), ("b1", "B", 0), ("a2", "A", 5))
    holder.release()  # a plain release (by hand): the lock is free, nothing handed on
    taken = queue_call(locker, "a2", fair="A", priority=5)  # its message again
    assert isinstance(taken, Lease)
    assert hand_out_order(locker, taken) == ["b1", "a1"]  # a1 waits in a2's later turn


def test_a_fair_call_finding_the_lock_free_at_its_turn_hands_it_to_its_values_best_call(
    locker: PostgresLocker,
) -> None:
    holder = park_fairly(locker, ("a1", "A", 0), ("b1", "B", 0), ("a2", "A", 5))
    holder.release()  # a plain release (by hand): the lock is free, nothing handed on
    late = queue_call(locker, "a1", fair="A")  # its message again
    assert isinstance(late, Parked) and late.handed == message("a2")


def test_fair_values_keep_their_round_robin_whatever_their_calls_ranks(
    locker: PostgresLocker,
) -> None:
    holder = park_fairly(
        locker, ("a1", "A", 9), ("a2", "A", 9), ("a3", "A", 9), ("b1", "B", -9), ("b2", "B", 0)
    )
    assert hand_out_order(locker, holder) == ["a1", "b2", "a2", "b1", "a3"]


def test_fair_calls_of_one_value_and_rank_go_in_arrival_order(locker: PostgresLocker) -> None:
    holder = park_fairly(locker, ("a1", "A", 3), ("a2", "A", 3), ("a3", "A", 3), ("a0", "A", 0))
    assert hand_out_order(locker, holder) == ["a1", "a2", "a3", "a0"]


def test_a_call_passed_over_in_its_values_turn_keeps_its_place_among_equals(
    locker: PostgresLocker,
) -> None:
    """a1's turn goes to a3 (rank 5), a1 waits in a3's later turn; a1 is still older than a2."""
    holder = park_fairly(locker, ("a1", "A", 0), ("a2", "A", 0), ("a3", "A", 5))
    assert hand_out_order(locker, holder) == ["a3", "a1", "a2"]


def test_a_fair_call_whose_reservation_ran_out_is_handed_the_lock_again_not_its_values_next(
    locker: PostgresLocker,
) -> None:
    queue = locker.queue
    assert queue is not None
    holder = park_fairly(locker, ("a1", "A", 0), ("a2", "A", 5))
    assert queue.release_handing_on(holder, limit=1, reservation_ttl=0.3)[1] == [message("a2")]
    assert isinstance(queue_call(locker, "a3", fair="A", priority=9), Parked)
    time.sleep(0.5)  # a2's message was never delivered: its reservation ran out
    assert queue.hand_on("job", reservation_ttl=RESERVE) == [message("a2")]


def test_a_dropped_fair_call_is_never_handed_its_values_turn(locker: PostgresLocker) -> None:
    queue = locker.queue
    assert queue is not None
    holder = park_fairly(locker, ("a1", "A", 0), ("a2", "A", 5))
    assert queue.drop_parked("job", "a2", reservation_ttl=RESERVE) is True
    assert hand_out_order(locker, holder) == ["a1"]


#: the parked table as a schema made before the ranks holds it (tables.sql adds the columns)
PARKED_BEFORE_RANKS = """CREATE TABLE {schema}.singleton_lock_parked (
    prefix text NOT NULL, name text NOT NULL, task_id text NOT NULL,
    round bigint NOT NULL DEFAULT 0, arrival bigint NOT NULL, fair text NOT NULL DEFAULT '',
    message bytea NOT NULL, PRIMARY KEY (prefix, name, task_id))"""


def test_a_schema_made_before_the_ranks_gets_them_and_parks_by_rank() -> None:
    psycopg = pytest.importorskip("psycopg")
    with postgres_schema() as url:
        base, schema = url.rsplit("?schema=", 1)
        with psycopg.connect(base, autocommit=True) as admin:
            admin.execute(f"CREATE SCHEMA {schema}")
            admin.execute(PARKED_BEFORE_RANKS.format(schema=schema))
        renewer = Renewer()
        locker = PostgresLocker(url, prefix="t", renewer=renewer)
        try:
            park_ranked(locker, ("c", 0), ("d", 5))
            assert locker.inspect.parked("job") == ["d", "c"]
        finally:
            stop_renewing(renewer)
            locker.close()


def test_a_queue_of_several_holders_is_refused(locker: PostgresLocker) -> None:
    assert locker.queue is not None
    lease = queue_call(locker, "a")
    with pytest.raises(LockConfigurationError, match="one holder"):
        locker.queue.release_handing_on(lease, limit=2, reservation_ttl=RESERVE)


# -- latest wins --------------------------------------------------------------------------------


def test_the_newest_call_displaces_the_one_waiting(locker: PostgresLocker) -> None:
    assert isinstance(latest_call(locker, "a", "1"), Lease)
    first = latest_call(locker, "b", "2")
    second = latest_call(locker, "c", "3")
    assert isinstance(first, Parked) and first.displaced == ()
    assert isinstance(second, Parked) and second.displaced == (message("b"),)
    assert locker.inspect.parked("job") == ["c"]


def test_a_call_sent_before_the_newest_is_superseded_at_once(locker: PostgresLocker) -> None:
    latest_call(locker, "a", "0000000000000005.1")
    latest_call(locker, "c", "0000000000000007.1")
    with pytest.raises(AlreadySuperseded):
        latest_call(locker, "b", "0000000000000006.1")
    with pytest.raises(AlreadySuperseded):  # a stale copy of a displaced call
        latest_call(locker, "b", "0000000000000009.1")


def test_the_release_hands_the_lock_to_the_newest(locker: PostgresLocker) -> None:
    assert locker.latest is not None
    lease = latest_call(locker, "a", "1")
    latest_call(locker, "b", "2")
    latest_call(locker, "c", "3")
    assert locker.latest.release_latest(lease, reservation_ttl=RESERVE) == (True, message("c"))
    assert isinstance(latest_call(locker, "c", "3"), Lease)


def test_displaced_calls_are_left_to_mark_until_cleared(locker: PostgresLocker) -> None:
    latest = locker.latest
    assert latest is not None
    latest_call(locker, "a", "1")
    latest_call(locker, "b", "2")
    latest_call(locker, "c", "3")
    assert latest.superseded_left() == []  # within the grace: the worker marks them
    locker.connections.run(
        f"UPDATE {locker.schema.name}.singleton_lock_superseded SET mark_after = now()", None
    )
    assert latest.superseded_left() == [("job", [message("b")])]
    assert latest.clear_superseded("job", ["b"]) == 0
    assert latest.superseded_left() == []


def test_a_debounced_call_waits_on_a_free_lock_until_it_is_due(locker: PostgresLocker) -> None:
    queue = locker.queue
    assert queue is not None
    waiting = latest_call(locker, "a", "1", debounce=1.0)
    assert isinstance(waiting, Parked) and waiting.holder is None
    newest = locker.inspect.waiting_newest("job")
    assert newest is not None and newest[0] == "a" and newest[1] is not None
    due = queue.hand_off_due()
    assert due.names == [] and due.next_in is not None and 0 < due.next_in <= 1.0
    assert queue.hand_on("job", reservation_ttl=RESERVE) == []  # not before its due time
    time.sleep(1.2)
    assert queue.hand_off_due().names == ["job"]
    assert queue.hand_on("job", reservation_ttl=RESERVE) == [message("a")]
    assert isinstance(latest_call(locker, "a", "1", debounce=1.0), Lease)


def test_a_newer_call_within_the_debounce_takes_the_place_and_the_time_starts_again(
    locker: PostgresLocker,
) -> None:
    latest_call(locker, "a", "1", debounce=1.0)
    time.sleep(0.6)
    newer = latest_call(locker, "b", "2", debounce=1.0)
    assert isinstance(newer, Parked) and newer.displaced == (message("a"),)
    time.sleep(0.6)  # 1.2 s after a, 0.6 s after b: not due yet
    assert locker.queue is not None and locker.queue.hand_off_due().names == []


def test_debounce_max_bounds_how_long_a_burst_holds_the_newest_back(
    locker: PostgresLocker,
) -> None:
    latest_call(locker, "a", "1", debounce=5.0, debounce_max=1.0)
    latest_call(locker, "b", "2", debounce=5.0, debounce_max=1.0)
    newest = locker.inspect.waiting_newest("job")
    assert newest is not None and newest[1] is not None
    assert newest[1] - time.time() <= 1.2  # due by the burst's bound, not 5 s from now


def test_a_release_leaves_a_debounced_call_to_its_due_time(locker: PostgresLocker) -> None:
    latest = locker.latest
    assert latest is not None
    lease = latest_call(locker, "a", "1")
    latest_call(locker, "b", "2", debounce=5.0)
    assert latest.release_latest(lease, reservation_ttl=RESERVE) == (True, None)


# -- restart ------------------------------------------------------------------------------------


def test_the_newest_call_flags_the_running_holder(locker: PostgresLocker) -> None:
    cancels = locker.cancels
    assert cancels is not None
    latest_call(locker, "a", "1")
    assert cancels.cancel_requested([("job", "a")]) == [False]
    assert cancels.cancel_holder("job", "b") == "a"
    assert cancels.cancel_holder("job", "a") is None  # never itself
    assert cancels.cancel_requested([("job", "a"), ("job", "b"), ("other", "a")]) == [
        True,
        False,
        False,
    ]


def test_a_schema_no_process_has_used_reads_nothing_parked(locker: PostgresLocker) -> None:
    inspect = locker.inspect  # no statement sent yet: the tables do not exist
    assert (inspect.parked("job"), inspect.parked_locks(), inspect.waiting_newest("job")) == (
        [],
        [],
        None,
    )


def test_the_reader_names_each_lock_with_parked_calls_and_their_count(
    locker: PostgresLocker,
) -> None:
    for task_id in ("holder", "first", "second"):
        queue_call(locker, task_id)
    assert locker.inspect.parked_locks() == [("job", 2, True)]
