"""Admission on PostgreSQL on real ``celery worker`` processes (RabbitMQ as the broker, no
Redis URL anywhere: tests/celery/postgresapp.py): ``lock_limit``, ``lock_rate``,
``lock_cooldown``, ``dedupe_on_enqueue``, and a killed holder's slot taken again after its
lease. The bodies write their start and end by the database's clock."""

from __future__ import annotations

from typing import Any, Iterator

import pytest
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.celery.config.lockers import forget_locker
from tests.celery.pg_workers import APP, Setup, drained, worker_of_its_own
from tests.celery.test_postgres_workers import setup  # noqa: F401 - the fixture
from tests.celery.workers import unique, worker_group
from tests.support import wait_until

pytestmark = pytest.mark.usefixtures("setup")


def most_at_once(rows: list[tuple[Any, ...]]) -> int:
    """The most bodies running at one instant (rows: ``(n, pid, fence, started, ended)``)."""
    events = sorted([(row[3], 1) for row in rows] + [(row[4], -1) for row in rows])
    running = most = 0
    for _, step in events:  # an end before a start at the same instant: -1 sorts first
        running += step
        most = max(most, running)
    return most


def ended(rows: list[tuple[Any, ...]], count: int) -> Any:
    """``rows`` once there are ``count`` and each has ended, else None."""
    return rows if len(rows) == count and all(row[4] for row in rows) else None


def test_a_limit_of_3_never_runs_more_than_3_of_30_retried_calls_and_runs_all(
    setup: Setup,  # noqa: F811
) -> None:
    queue, key = setup.queue(), unique("limited")
    with worker_group(setup.servers) as group:
        group.start(1, queue=queue, concurrency=4, app=APP)
        for n in range(30):
            setup.client.send_task(f"{APP}.pg_limited", args=[key, n], queue=queue)
        rows = wait_until(lambda: ended(setup.rows(key), 30), 240)
    assert sorted(row[0] for row in rows) == list(range(30))  # each ran, once
    most = most_at_once(rows)
    print(f"30 calls, lock_limit=3, prefork -c 4: at most {most} at once")
    assert most <= 3
    assert most >= 2  # the slots were used side by side, not one at a time


@pytest.fixture(scope="module")
def one_at_a_time() -> Iterator[tuple[Setup, str]]:
    """A worker running one call at a time (-c 1: a call is never skipped for a running one,
    only for the rate or the cooldown), shared by the tests of the module."""
    with worker_of_its_own(concurrency=1) as shared:
        yield shared


def test_a_rate_of_2_per_window_starts_2_of_5_calls(one_at_a_time: tuple[Setup, str]) -> None:
    shared, queue = one_at_a_time
    key = unique("rated")
    for n in range(5):
        shared.client.send_task(f"{APP}.pg_rated", args=[key, n], queue=queue)
    rows = drained(shared, queue, key)
    assert len(rows) == 2  # the other 3 were skipped: over the rate of 2 per 30 s


def test_a_cooldown_skips_a_second_start_within_it(one_at_a_time: tuple[Setup, str]) -> None:
    shared, queue = one_at_a_time
    key = unique("cooled")
    shared.client.send_task(f"{APP}.pg_cooled", args=[key, 0], queue=queue)
    wait_until(lambda: (lambda r: r if r and r[0][4] else None)(shared.rows(key)), 60)
    shared.client.send_task(f"{APP}.pg_cooled", args=[key, 1], queue=queue)
    rows = drained(shared, queue, key)
    assert [row[0] for row in rows] == [0]  # the second came within the 30 s cooldown


@pytest.fixture
def deduped(setup: Setup) -> Iterator[Any]:  # noqa: F811
    """``pg_deduped`` on a publisher app of the test's lock URL (the worker's app reads it from
    its environment), with ``dedupe_on_enqueue=True``."""
    publisher = Celery(unique("pg-publisher"), set_as_current=False)
    publisher.conf.update(
        broker_url=setup.servers.broker_url, singleton_lock_url=setup.servers.lock_url
    )

    @publisher.task(
        base=LockedTask,
        name=f"{APP}.pg_deduped",
        dedupe_on_enqueue=True,
        lock_on=["key"],
        shared=False,
    )
    def pg_deduped(key: str, n: int) -> None: ...

    try:
        yield pg_deduped
    finally:
        forget_locker(publisher)
        publisher.close()


def messages(setup: Setup, queue: str) -> int:  # noqa: F811
    """Messages in ``queue`` (declared if it is not yet)."""
    with setup.client.connection_for_write() as connection:
        channel = connection.default_channel
        channel.queue_declare(queue, durable=True, auto_delete=False)
        return int(channel.queue_declare(queue, passive=True).message_count)


def test_5_deduped_calls_with_no_worker_publish_1_message(
    setup: Setup,  # noqa: F811
    deduped: Any,
) -> None:
    queue, key = setup.queue(), unique("deduped")
    messages(setup, queue)
    results = [deduped.apply_async(args=[key, n], queue=queue) for n in range(5)]
    assert messages(setup, queue) == 1
    assert len({result.id for result in results}) == 1  # the 4 duplicates answer the first


def test_a_deduped_call_is_published_again_once_the_queued_one_started(
    setup: Setup,  # noqa: F811
    deduped: Any,
) -> None:
    queue, key = setup.queue(), unique("deduped")
    first = deduped.apply_async(args=[key, 0], queue=queue)
    with worker_group(setup.servers) as group:
        group.start(1, queue=queue, concurrency=1, app=APP)
        rows = drained(setup, queue, key)
    assert [row[0] for row in rows] == [0]
    again = deduped.apply_async(args=[key, 1], queue=queue)  # its start took the marker
    assert again.id != first.id and messages(setup, queue) == 1


def test_a_killed_holders_slot_is_taken_again_after_its_lease(setup: Setup) -> None:  # noqa: F811
    held_queue, spare_queue, key = setup.queue(), setup.queue(), unique("slotkill")
    ttl = 3.0  # pg_limited_long's lock_ttl
    with worker_group(setup.servers) as group:
        holder = group.launch(1, queue=held_queue, concurrency=2, app=APP)[0]
        group.launch(1, queue=spare_queue, concurrency=1, app=APP)
        group.wait_ready()  # the two start side by side
        for n in range(2):  # both slots, held by bodies that would run 300 s
            setup.client.send_task(f"{APP}.pg_limited_long", args=[key, n, 300.0], queue=held_queue)
        wait_until(lambda: (lambda r: r if len(r) == 2 else None)(setup.rows(key)), 60)
        holder.crash()
        killed = setup.now()
        setup.client.send_task(f"{APP}.pg_limited_long", args=[key, 9, 0.1], queue=spare_queue)
        rows = wait_until(
            lambda: (lambda r: r if any(x[0] == 9 for x in r) else None)(setup.rows(key)), 60
        )
    started = next(row[3] for row in rows if row[0] == 9)
    delay = (started - killed).total_seconds()
    print(f"a call took a killed holder's slot {delay:.2f}s after the kill -9 (ttl {ttl:g}s)")
    assert delay <= ttl + 3
