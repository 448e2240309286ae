"""Issue 34's acceptance on real ``celery worker`` processes: RabbitMQ as the broker,
PostgreSQL for the locks, no Redis URL anywhere (tests/celery/postgresapp.py).

The bodies write their start and end by the database's clock, from inside the lock, so "never
two at once" is read from one clock whatever process ran them.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.celery.pg_workers import (
    APP,
    Setup,
    drained,
    never_two_at_once,
    postgres_setup,
    rabbitmq_answers,
    worker_of_its_own,
)
from tests.celery.workers import unique, worker_group
from tests.support import wait_until

psycopg = pytest.importorskip("psycopg")

pytestmark = pytest.mark.skipif(not rabbitmq_answers(), reason="no RabbitMQ at 127.0.0.1:5672")


@pytest.fixture
def setup() -> Iterator[Setup]:
    """A :class:`Setup` whose locks and records share the test's own schema."""
    with postgres_setup() as made:
        yield made


@pytest.fixture(scope="module")
def four_at_a_time() -> Iterator[tuple[Setup, str]]:
    """One prefork worker (-c 4) shared by the tests of the module."""
    with worker_of_its_own(concurrency=4) as shared:
        yield shared


def test_200_same_argument_skip_calls_never_run_two_at_once(
    four_at_a_time: tuple[Setup, str],
) -> None:
    shared, queue = four_at_a_time
    key = unique("skip")
    for _ in range(200):
        shared.client.send_task(f"{APP}.pg_skip", args=[key, 0], queue=queue)
    rows = drained(shared, queue, key)
    assert rows  # some ran
    print(f"200 skip calls: {len(rows)} ran, never two at once")
    never_two_at_once(rows)


def test_50_fenced_retry_calls_get_fences_increasing_in_start_order(
    four_at_a_time: tuple[Setup, str],
) -> None:
    shared, queue = four_at_a_time
    key = unique("fenced")
    for n in range(50):
        shared.client.send_task(f"{APP}.pg_fenced", args=[key, n], queue=queue)
    rows = wait_until(lambda: (lambda r: r if len(r) == 50 else None)(shared.rows(key)), 180)
    assert sorted(row[0] for row in rows) == list(range(50))  # each call ran, once
    fences = [row[2] for row in rows]
    assert all(isinstance(fence, int) for fence in fences)
    assert all(a < b for a, b in zip(fences, fences[1:])), fences
    never_two_at_once(rows)


def test_two_workers_racing_fenced_writes_of_one_key_leave_it_at_the_highest_fence(
    setup: Setup,
) -> None:
    from tests.celery.postgresapp import account_table

    account_table(setup.admin, setup.schema)
    queue, key = setup.queue(), unique("fenced-write")
    setup.admin.execute(f"INSERT INTO {setup.schema}.accounts (key) VALUES (%s)", (key,))
    with worker_group(setup.servers) as group:
        group.start(2, queue=queue, concurrency=2, app=APP)
        for n in range(50):
            setup.client.send_task(f"{APP}.pg_fenced_write", args=[key, n], queue=queue)
        rows = wait_until(lambda: (lambda r: r if len(r) == 50 else None)(setup.rows(key)), 180)
        writes, fence = wait_until(
            lambda: (lambda row: row if row[0] == 50 else None)(
                setup.admin.execute(
                    f"SELECT writes, fence FROM {setup.schema}.accounts WHERE key = %s", (key,)
                ).fetchone()
            ),
            60,
        )
    fences = [row[2] for row in rows]
    assert all(a < b for a, b in zip(fences, fences[1:])), fences  # in start order
    assert (writes, fence) == (50, max(fences))  # every write applied, the last one's fence


# A kill -9 of the holder's worker, the duplicate running within lock_ttl + 3 s: pinned, three
# times over, by tests/chaos/test_postgres_kills.py.
