"""Locks in PostgreSQL through PgBouncer in **transaction** mode, on real ``celery worker``
processes (issue 34: "works through PgBouncer in transaction mode").

A private ``pgbouncer`` (tests/postgres_servers.py; Debian's package, the tests skip without
it) stands in front of the shared PostgreSQL; the workers (tests/celery/postgresapp.py) take
their locks through it and write their records to PostgreSQL directly. Each statement of the
backend is one transaction, so any server connection may run it; only the ``LISTEN`` of a
waiting duplicate needs a session, which PgBouncer's transaction pooling does not keep: the
waiter hears no release and takes the lock when it next looks, at the holder's remaining TTL.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.celery.pg_workers import (
    APP,
    Setup,
    never_two_at_once,
    postgres_setup,
    rabbitmq_answers,
    two_prefork_workers,
)
from tests.celery.workers import WorkerGroup, unique, worker_group
from tests.postgres_servers import PrivatePgBouncer, private_pgbouncer
from tests.postgres_support import postgres_schema
from tests.support import wait_until

TTL = 10.0  # postgresapp.OUTAGE_TTL

pytestmark = pytest.mark.skipif(not rabbitmq_answers(), reason="no RabbitMQ at 127.0.0.1:5672")


@pytest.fixture(scope="module")
def bouncer() -> Iterator[PrivatePgBouncer]:
    with private_pgbouncer() as started:
        yield started


@pytest.fixture(scope="module")
def setup(bouncer: PrivatePgBouncer) -> Iterator[Setup]:
    with postgres_schema() as direct:
        schema = direct.rsplit("?schema=", 1)[1]
        with postgres_setup(f"{bouncer.url}?schema={schema}") as made:
            yield made


@pytest.fixture(scope="module")
def workers(setup: Setup) -> Iterator[tuple[WorkerGroup, str]]:
    """Two prefork workers (-c 2) on one queue, their locks through PgBouncer."""
    with two_prefork_workers(setup) as shared:
        yield shared


def test_the_workers_lock_url_goes_through_pgbouncer(
    bouncer: PrivatePgBouncer, setup: Setup
) -> None:
    assert f":{bouncer.port}/" in setup.servers.lock_url


def test_100_skip_calls_on_2_workers_never_run_two_at_once(
    setup: Setup, workers: tuple[WorkerGroup, str]
) -> None:
    _, queue = workers
    key = unique("skip")
    for n in range(100):
        setup.client.send_task(f"{APP}.pg_hold", args=[key, n, 0.02], queue=queue)
    wait_until(lambda: setup.queue_empty(queue), timeout=120, interval=0.5)
    rows = wait_until(lambda: setup.settled(key), timeout=60)
    print(f"100 skip calls through PgBouncer: {len(rows)} ran")
    never_two_at_once(rows)


def test_30_fenced_retry_calls_on_2_workers_run_once_each_with_increasing_fences(
    setup: Setup, workers: tuple[WorkerGroup, str]
) -> None:
    _, queue = workers
    key = unique("retry")
    for n in range(30):
        setup.client.send_task(f"{APP}.pg_retry", args=[key, n, 0.02], queue=queue)
    rows = wait_until(lambda: setup.settled(key, count=30), timeout=240)
    assert sorted(row[0] for row in rows) == list(range(30))  # each call ran, once
    never_two_at_once(rows)
    fences = [row[2] for row in rows]
    assert all(a < b for a, b in zip(fences, fences[1:])), fences


def test_a_body_longer_than_the_lease_keeps_it_renewed_and_its_duplicate_is_skipped(
    setup: Setup, workers: tuple[WorkerGroup, str]
) -> None:
    _, queue = workers
    key = unique("renew")
    setup.client.send_task(f"{APP}.pg_hold", args=[key, 0, TTL + 5], queue=queue)
    started = wait_until(lambda: setup.records(key), timeout=60)[0][3]
    # past the first lease: the lock is still held only if it was renewed through PgBouncer
    wait_until(lambda: (setup.now() - started).total_seconds() > TTL + 1, timeout=30)
    setup.client.send_task(f"{APP}.pg_hold", args=[key, 1, 0.1], queue=queue)
    rows = wait_until(lambda: setup.settled(key, quiet=3.0), timeout=90)
    assert [row[0] for row in rows] == [0]  # the duplicate was skipped
    assert rows[0][5] is False  # never reported lost


def handoff(setup: Setup, queue: str, key: str, hold: float) -> float:
    """Seconds from the end of a ``wait`` holder's body (``hold`` s) to the start of its
    waiting duplicate's."""
    setup.client.send_task(f"{APP}.pg_wait", args=[key, 0, hold], queue=queue)
    wait_until(lambda: setup.records(key), timeout=60)
    setup.client.send_task(f"{APP}.pg_wait", args=[key, 1, 0.1], queue=queue)
    rows = wait_until(lambda: setup.settled(key, count=2), timeout=120)
    never_two_at_once(rows)
    return float((rows[1][3] - rows[0][4]).total_seconds())


def test_a_waiting_duplicate_hears_no_release_and_takes_the_lock_at_the_holders_ttl(
    setup: Setup, workers: tuple[WorkerGroup, str]
) -> None:
    _, queue = workers
    gap = handoff(setup, queue, unique("wait"), hold=1.0)
    print(f"wait through PgBouncer: the duplicate started {gap:.2f}s after the holder ended")
    # not woken by the release (a NOTIFY reaches no LISTEN through transaction pooling)...
    assert gap > 1.0
    # ...but at the lease the holder's release did not end: within lock_ttl
    assert gap <= TTL + 3


def test_direct_a_waiting_duplicate_is_woken_by_the_release(bouncer: PrivatePgBouncer) -> None:
    """The same hand-off with the locks on PostgreSQL directly: woken by the NOTIFY."""
    with postgres_schema() as direct, postgres_setup(direct) as made:
        queue = made.queue()
        with worker_group(made.servers) as group:
            group.start(1, queue=queue, concurrency=2, app=APP)
            gap = handoff(made, queue, unique("wait"), hold=1.0)
    print(f"wait on PostgreSQL directly: the duplicate started {gap:.2f}s after the holder ended")
    assert gap < 1.0
