"""Admission on the PostgreSQL backend, on the real server: one of N slots (``lock_limit``),
a rate of starts (``lock_rate``), a live cap, the cooldown release (``lock_cooldown``) and the
queued markers (``dedupe_on_enqueue``)."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import pytest

from celery_singleton_lock.engine import (
    AcquireRequest,
    Lease,
    LiveRule,
    LockHolder,
    Owner,
    PausingRules,
    Renewer,
)
from celery_singleton_lock.errors import AlreadyFinished
from tests.engine.conftest import stop_renewing
from tests.postgres_support import postgres_schema
from tests.support import wait_until

pytest.importorskip("psycopg")

from celery_singleton_lock.engine.postgres.locker import PostgresLocker


@pytest.fixture
def url() -> Iterator[str]:
    with postgres_schema() as url:
        yield url


@pytest.fixture
def locker(url: str) -> Iterator[PostgresLocker]:
    renewer = Renewer()
    locker = PostgresLocker(url, prefix="t", renewer=renewer)
    yield locker
    stop_renewing(renewer)
    locker.close()


def take(locker: PostgresLocker, name: str = "job", ttl: float = 30.0, **options: Any) -> Any:
    return locker.try_acquire(name, ttl, renew=False, **options)


def sql(locker: PostgresLocker, statement: str, *params: Any) -> list[tuple[Any, ...]]:
    return locker.connections.run(statement, params or None)


# -- slots (lock_limit) ---------------------------------------------------------------------


def test_a_limit_of_3_admits_3_holders_and_names_a_holder_to_the_4th(
    locker: PostgresLocker,
) -> None:
    leases = [take(locker, limit=3, owner=Owner(task_id=f"t{i}")) for i in range(3)]
    assert all(isinstance(lease, Lease) for lease in leases)
    assert [lease.key for lease in leases] == ["t:{job}", "t:{job}:slot:2", "t:{job}:slot:3"]
    fourth = take(locker, limit=3)
    assert isinstance(fourth, LockHolder) and fourth.task_id in {"t0", "t1", "t2"}


def test_many_racing_acquires_never_take_more_than_the_limit(locker: PostgresLocker) -> None:
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(pool.map(lambda i: take(locker, "race", limit=3), range(40)))
    assert sum(isinstance(outcome, Lease) for outcome in outcomes) == 3


def test_racing_acquires_never_take_more_than_a_live_cap(locker: PostgresLocker) -> None:
    # each slot's row excludes its own takers; a cap counts the slots held, which only the
    # admission lock of the name keeps from being counted twice by racing calls
    locker.live_rules.set_cap("job", 2)
    with ThreadPoolExecutor(8) as pool:
        outcomes = list(
            pool.map(lambda i: take(locker, "race", limit=10, cap_key="t:cap:job"), range(40))
        )
    assert sum(isinstance(outcome, Lease) for outcome in outcomes) == 2


def test_racing_acquires_never_start_more_than_the_rate(locker: PostgresLocker) -> None:
    def start(i: int) -> bool:
        outcome = take(locker, "race", limit=10, rate=(3, 60.0))
        if isinstance(outcome, Lease):
            outcome.release()
            return True
        return False

    with ThreadPoolExecutor(8) as pool:
        assert sum(pool.map(start, range(40))) == 3


def test_a_released_slot_is_taken_again(locker: PostgresLocker) -> None:
    leases = [take(locker, limit=2) for _ in range(2)]
    assert isinstance(take(locker, limit=2), LockHolder)
    assert leases[1].release() is True
    again = take(locker, limit=2)
    assert isinstance(again, Lease) and again.key == leases[1].key


def test_a_slot_not_renewed_expires_and_another_takes_it(locker: PostgresLocker) -> None:
    take(locker, limit=2, ttl=30)
    take(locker, limit=2, ttl=0.3)
    assert isinstance(take(locker, limit=2), LockHolder)
    assert isinstance(wait_until(lambda: _lease_or_none(take(locker, limit=2)), 10), Lease)


def _lease_or_none(outcome: Any) -> Any:
    return outcome if isinstance(outcome, Lease) else None


def test_fences_of_slots_strictly_increase_in_the_order_taken(locker: PostgresLocker) -> None:
    fences = []
    for _ in range(6):
        lease = take(locker, limit=2, fencing=True)
        fences.append(lease.fence)
        lease.release()
    assert all(a < b for a, b in zip(fences, fences[1:])), fences


def test_a_resend_of_the_same_token_takes_no_second_slot(locker: PostgresLocker) -> None:
    first = take(locker, limit=3, token="a" * 32)
    again = take(locker, limit=3, token="a" * 32)
    assert isinstance(again, Lease) and again.key == first.key
    assert len(locker.inspect.holders("job", 3)) == 1


def test_renew_batch_renews_a_slots_row(locker: PostgresLocker) -> None:
    take(locker, limit=2)
    lease = take(locker, limit=2, ttl=1)
    assert locker.renew_batch([lease], now=time.monotonic()) == []
    assert lease.key == "t:{job}:slot:2"
    (left,) = sql(
        locker,
        f"SELECT extract(epoch FROM lease_until - now()) FROM {locker.schema.leases} "
        "WHERE name = %s",
        "{job}:slot:2",
    )[0]
    assert 0.5 < float(left) <= 1.0


def test_renew_by_owner_finds_the_owners_slot(locker: PostgresLocker) -> None:
    take(locker, limit=3, owner=Owner(task_id="a"))
    take(locker, limit=3, owner=Owner(task_id="b"))
    owner_b, stranger = Owner(task_id="b"), Owner(task_id="c")
    lost = locker.renew_by_owner([("job", owner_b, 30), ("job", stranger, 30)], limits=[3, 3])
    assert lost == [1]


def test_release_abandoned_frees_a_slot_by_its_owner(locker: PostgresLocker) -> None:
    take(locker, limit=2, owner=Owner(task_id="a"))
    owner = Owner(task_id="dead")
    take(locker, limit=2, owner=owner)
    freed = locker.release_abandoned("job", task_id="dead", host=owner.host, pid=owner.pid, slot=2)
    assert freed is True
    assert [holder.task_id for holder in locker.inspect.holders("job", 2)] == ["a"]


def test_holders_are_read_in_slot_order(locker: PostgresLocker) -> None:
    for index in range(11):
        take(locker, limit=11, owner=Owner(task_id=f"t{index}"))
    assert [holder.task_id for holder in locker.inspect.holders("job", 11)] == [
        f"t{index}" for index in range(11)
    ]


def test_scan_names_a_slot_by_its_key(locker: PostgresLocker) -> None:
    take(locker, limit=2)
    take(locker, limit=2)
    assert {holder.key for holder in locker.inspect.scan()} == {"t:{job}", "t:{job}:slot:2"}


def test_a_finish_record_refuses_the_same_task_id_with_a_limit(locker: PostgresLocker) -> None:
    owner = Owner(task_id="done")
    take(locker, limit=2, owner=owner).release(remember_for=60)
    with pytest.raises(AlreadyFinished):
        take(locker, limit=2, owner=owner, unless_finished=True)


def test_a_release_of_a_slot_wakes_a_subscriber_of_the_lock(locker: PostgresLocker) -> None:
    take(locker, limit=2)
    second = take(locker, limit=2)
    subscription = locker.subscribe_releases("job")
    try:
        second.release()
        assert subscription.get_message(timeout=10) is not None
    finally:
        subscription.close()


# -- live cap ---------------------------------------------------------------------------------


def test_a_live_cap_lowers_the_limit(locker: PostgresLocker) -> None:
    locker.ensure_schema()
    sql(locker, f"INSERT INTO {locker.schema.caps} (key, cap) VALUES (%s, 1)", "t:cap:job")
    assert isinstance(take(locker, limit=3, cap_key="t:cap:job"), Lease)
    assert isinstance(take(locker, limit=3, cap_key="t:cap:job"), LockHolder)
    assert isinstance(take(locker, limit=3), Lease)  # without the cap: its limit


# -- rate (lock_rate) -------------------------------------------------------------------------


def test_a_rate_of_2_per_window_refuses_the_3rd_start_and_says_when(
    locker: PostgresLocker,
) -> None:
    for _ in range(2):
        take(locker, rate=(2, 30.0)).release()
    third = take(locker, rate=(2, 30.0))
    assert isinstance(third, LockHolder) and third.over_rate
    assert third.ttl is not None and 25 < third.ttl <= 30


def test_rate_use_counts_the_starts_in_the_window(locker: PostgresLocker) -> None:
    for _ in range(2):
        take(locker, rate=(5, 30.0)).release()
    ((starts, empty_in),) = locker.inspect.rate_use(["t:{job}"])
    assert starts == 2 and empty_in is not None and 25 < empty_in <= 30
    assert locker.inspect.rate_use(["t:{other}"]) == [(0, None)]


def test_a_rate_allows_a_start_again_once_the_window_passed(locker: PostgresLocker) -> None:
    take(locker, rate=(1, 0.5)).release()
    assert isinstance(take(locker, rate=(1, 0.5)), LockHolder)
    assert isinstance(wait_until(lambda: _lease_or_none(take(locker, rate=(1, 0.5))), 10), Lease)


# -- cooldown (lock_cooldown) -----------------------------------------------------------------


def test_a_cooling_release_leaves_the_lock_taken_for_the_cooldown(
    locker: PostgresLocker,
) -> None:
    lease = take(locker, owner=Owner(task_id="ran"))
    assert locker.cooldown.release_cooling(lease, 30) is True
    holder = take(locker)
    assert isinstance(holder, LockHolder) and holder.cooling
    assert holder.task_id == "ran" and holder.ttl is not None and 25 < holder.ttl <= 30


def test_the_lock_is_free_once_its_cooldown_ended(locker: PostgresLocker) -> None:
    locker.cooldown.release_cooling(take(locker), 0.3)
    assert isinstance(wait_until(lambda: _lease_or_none(take(locker)), 10), Lease)


def test_a_cooling_release_of_a_lease_taken_over_changes_nothing(
    locker: PostgresLocker,
) -> None:
    lease = take(locker, ttl=0.2)
    time.sleep(0.4)
    take(locker, owner=Owner(task_id="next"))
    assert locker.cooldown.release_cooling(lease, 30) is False
    assert locker.inspect.read("job").task_id == "next"  # type: ignore[union-attr]


def test_a_slot_cools_down_alone(locker: PostgresLocker) -> None:
    first = take(locker, limit=2)
    take(locker, limit=2)
    locker.cooldown.release_cooling(first, 30)
    assert isinstance(take(locker, limit=2), LockHolder)


# -- queued markers (dedupe_on_enqueue) ------------------------------------------------------


def test_the_first_enqueue_is_published_the_next_told_the_first(locker: PostgresLocker) -> None:
    markers = locker.markers
    locker.ensure_schema()
    assert markers.enqueue("job", "first", 60) is None
    assert markers.enqueue("job", "second", 60) == "first"
    assert markers.queued("job") == "first"


def test_racing_enqueues_publish_one(locker: PostgresLocker) -> None:
    locker.ensure_schema()
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda i: locker.markers.enqueue("job", f"t{i}", 60), range(30)))
    assert answers.count(None) == 1


def test_an_enqueue_of_a_running_name_is_told_the_holder(locker: PostgresLocker) -> None:
    take(locker, owner=Owner(task_id="running"))
    assert locker.markers.enqueue("job", "new", 60) == "running"
    assert locker.markers.enqueue("job", "new", 60, running=False) is None


def test_a_resend_is_published_beside_a_marker(locker: PostgresLocker) -> None:
    locker.ensure_schema()
    locker.markers.enqueue("job", "first", 60)
    assert locker.markers.enqueue("job", "retry", 60, resend=True) is None
    assert locker.markers.queued("job") == "first"


def test_the_acquire_of_the_queued_task_id_takes_its_marker(locker: PostgresLocker) -> None:
    locker.ensure_schema()
    locker.markers.enqueue("job", "mine", 60)
    take(locker, owner=Owner(task_id="mine"), take_queued=True)
    assert locker.markers.queued("job") is None


def test_a_retried_call_stays_queued_while_another_holds(locker: PostgresLocker) -> None:
    take(locker, owner=Owner(task_id="holder"))
    locker.markers.enqueue("job", "mine", 60, running=False)
    request = AcquireRequest(
        "job", 30, Owner(task_id="mine"), renew=False, take_queued=True, queued_while_held=True
    )
    outcome = locker.acquire(request)
    assert isinstance(outcome, LockHolder)
    assert locker.markers.queued("job") == "mine"


def test_a_marker_expires_after_its_ttl(locker: PostgresLocker) -> None:
    locker.ensure_schema()
    locker.markers.enqueue("job", "first", 0.3)
    assert wait_until(lambda: locker.markers.enqueue("job", "second", 60) is None, 10)


def test_clear_queued_deletes_only_the_id_it_names(locker: PostgresLocker) -> None:
    locker.ensure_schema()
    locker.markers.enqueue("job", "first", 60)
    assert locker.markers.clear_queued("job", "other") is False
    assert locker.markers.clear_queued("job", "first") is True
    assert locker.markers.queued_for("job") is None


def test_queued_names_lists_the_names_with_a_marker(locker: PostgresLocker) -> None:
    locker.ensure_schema()
    locker.markers.enqueue("a", "1", 60)
    locker.markers.enqueue("b", "2", 60)
    assert list(locker.inspect.queued_names()) == ["a", "b"]


def test_a_database_without_the_admission_tables_gets_them_at_the_first_read(url: str) -> None:
    older = PostgresLocker(url, prefix="t", renewer=Renewer())
    older.ensure_schema()
    schema = older.schema
    sql(older, f"DROP TABLE {schema.queued}, {schema.starts}")  # as an earlier version left it
    older.close()
    locker = PostgresLocker(url, prefix="t", renewer=Renewer())
    try:
        assert locker.markers.queued("job") is None
        assert locker.inspect.rate_use(["t:{job}"]) == [(0, None)]
    finally:
        locker.close()


def test_a_live_cap_is_read_back_by_family_and_listed(locker: PostgresLocker) -> None:
    locker.live_rules.set_cap("proj.job", 3)
    assert (locker.live_rules.read("proj.job").cap, locker.live_rules.every()) == (
        3,
        {"proj.job": LiveRule(3, None)},
    )


def test_postgres_live_rules_keep_caps_and_declare_no_pause(locker: PostgresLocker) -> None:
    assert not isinstance(locker.live_rules, PausingRules)
