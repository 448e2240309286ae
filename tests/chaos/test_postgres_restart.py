"""A restart of the PostgreSQL lock server under real workers (issue 34's acceptance: "a Postgres
restart while locks are held: no call runs twice at once; what the docs promise holds").

The lock server is a private PostgreSQL (tests/postgres_servers.py) that each test stops and
starts; the workers (tests/celery/postgresapp.py, ``lock_ttl=10``, renewed every ~3.3 s) keep
their records in the shared PostgreSQL, which stays up. What is pinned:

* down for less than the lease: the holder's renewal reconnects and keeps the lease (never
  reported lost), and a duplicate sent after the restart is skipped;
* down for longer than the lease: the lease is reported lost (``request.lock.lost``) while the
  server is still down, before anyone else can take it; a duplicate sent after the restart runs;
* fences after a restart, clean (``-m fast``) or a crash (``-m immediate``), are strictly above
  every fence before it;
* down when a task starts: ``lock_on_backend_error="retry"`` (the default) sends it again with
  an ERROR naming the server, and once PostgreSQL is back the task runs and the lock is free.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import pytest

from celery_singleton_lock.engine.acquire_request import AcquireRequest
from celery_singleton_lock.engine.postgres.locker import PostgresLocker
from tests.celery.pg_workers import (
    APP,
    GATED,
    Setup,
    postgres_setup,
    rabbitmq_answers,
    skipped,
    two_prefork_workers,
)
from tests.celery.workers import WorkerGroup, unique
from tests.postgres_servers import PrivatePostgres, private_postgres
from tests.support import wait_until

TTL = 10.0  # postgresapp.OUTAGE_TTL

pytestmark = pytest.mark.skipif(not rabbitmq_answers(), reason="no RabbitMQ at 127.0.0.1:5672")


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    with private_postgres() as started:
        yield started


@pytest.fixture(scope="module")
def setup(server: PrivatePostgres) -> Iterator[Setup]:
    with postgres_setup(f"{server.url}?schema=locks") as made:
        yield made


@pytest.fixture(scope="module")
def workers(setup: Setup) -> Iterator[tuple[WorkerGroup, str]]:
    """Two prefork workers (-c 2) on one queue, shared by the tests of the module."""
    with two_prefork_workers(setup) as shared:
        yield shared


@pytest.fixture(autouse=True)
def server_up(server: PrivatePostgres) -> Iterator[None]:
    """Each test starts, and leaves, with the lock server running."""
    if not server.running():
        server.start()
    yield
    if not server.running():
        server.start()


def lease_until(server: PrivatePostgres, task_id: str) -> Any:
    """The lease end of the lock ``task_id`` holds (None if it holds none)."""
    import psycopg

    with psycopg.connect(server.url, autocommit=True) as connection:
        row = connection.execute(
            "SELECT lease_until FROM locks.singleton_lock_leases "
            "WHERE task_id = %s AND lease_until > now()",
            (task_id,),
        ).fetchone()
    return None if row is None else row[0]


def restart(server: PrivatePostgres, down_for: float, mode: str = "fast") -> tuple[float, float]:
    """Stop ``server`` (``mode``), keep it down ``down_for`` s, start it; the monotonic times
    it was down from and up again."""
    server.stop(mode)
    down = time.monotonic()
    time.sleep(down_for)
    server.start()
    return down, time.monotonic()


@pytest.mark.timeout(300)
def test_down_for_less_than_the_lease_the_holder_keeps_it_and_a_duplicate_is_skipped(
    server: PrivatePostgres,
    setup: Setup,
    workers: tuple[WorkerGroup, str],
    chaos_figures: Callable[[dict[str, Any]], None],
) -> None:
    group, queue = workers
    key = unique("keep")
    sent = setup.client.send_task(f"{APP}.pg_hold", args=[key, 0, GATED], queue=queue)
    wait_until(lambda: setup.records(key), timeout=60)
    before = wait_until(lambda: lease_until(server, sent.id), timeout=30)
    down, up = restart(server, down_for=2.0)
    # the renewal reconnects: the holder's lease runs further than before the restart
    wait_until(lambda: (lambda until: until is not None and until > before)(
        lease_until(server, sent.id)), timeout=TTL, interval=0.05)  # fmt: skip
    renewed = time.monotonic()
    duplicate = setup.client.send_task(f"{APP}.pg_hold", args=[key, 1, 0.1], queue=queue)
    # the holder runs until the duplicate was skipped (or ran, which the assertion shows)
    wait_until(lambda: skipped(group, duplicate.id) or len(setup.records(key)) > 1, timeout=90)
    setup.open_gate(key)
    rows = wait_until(lambda: setup.settled(key), timeout=90)
    chaos_figures(
        {
            "backend": "postgresql",
            "restart": "pg_ctl stop -m fast; start",
            "lock_ttl_s": TTL,
            "down_s": round(up - down, 2),
            "renewed_after_up_s": round(renewed - up, 2),
        }
    )
    assert [row[0] for row in rows] == [0]  # the duplicate was skipped: one body, the holder's
    assert rows[0][5] is False  # never reported lost


@pytest.mark.timeout(300)
def test_down_for_longer_than_the_lease_it_is_reported_lost_before_a_duplicate_runs(
    server: PrivatePostgres,
    setup: Setup,
    workers: tuple[WorkerGroup, str],
    chaos_figures: Callable[[dict[str, Any]], None],
) -> None:
    _, queue = workers
    key = unique("lose")
    setup.client.send_task(f"{APP}.pg_hold", args=[key, 0, GATED], queue=queue)
    started = wait_until(lambda: setup.records(key), timeout=60)[0][3]
    server.stop("fast")
    stopped = setup.now()
    # down past the lease: the holder's renewer gives it up at lock_ttl after its last renewal
    wait_until(lambda: setup.records(key)[0][6], timeout=TTL + 20, interval=0.2)
    time.sleep(1.0)
    server.start()
    setup.client.send_task(f"{APP}.pg_hold", args=[key, 1, 0.1], queue=queue)
    # the holder runs until the duplicate started
    wait_until(lambda: len(setup.records(key)) > 1, timeout=120)
    setup.open_gate(key)
    rows = wait_until(lambda: setup.settled(key, count=2), timeout=120)
    holder, duplicate = rows
    lost_after = (holder[6] - stopped).total_seconds()
    chaos_figures(
        {
            "backend": "postgresql",
            "restart": "pg_ctl stop -m fast; start after the lease ran out",
            "lock_ttl_s": TTL,
            "lost_reported_after_stop_s": round(lost_after, 2),
            "lost_reported_after_acquire_s": round((holder[6] - started).total_seconds(), 2),
        }
    )
    assert holder[5] is True  # request.lock.lost, seen by the body
    assert duplicate[0] == 1  # the lock was free again: the duplicate ran
    assert holder[6] < duplicate[3]  # the holder was told before the duplicate started
    assert lost_after <= TTL + 5


@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_fences_after_a_restart_are_above_every_fence_before_it(
    server: PrivatePostgres, mode: str, chaos_figures: Callable[[dict[str, Any]], None]
) -> None:
    locker = PostgresLocker(f"{server.url}?schema=fences_{mode}")
    try:
        before = []
        for n in range(20):
            lease = locker.acquire(AcquireRequest(f"f{n % 3}", 10, fencing=True, renew=False))
            before.append(lease.fence)
            locker.release(lease)
        restart(server, down_for=0.5, mode=mode)
        # the same locker: its kept connections died with the server and are not used
        after = [
            locker.acquire(AcquireRequest(f"g{n}", 10, fencing=True, renew=False)).fence
            for n in range(3)
        ]
    finally:
        locker.close()
    chaos_figures(
        {
            "backend": "postgresql",
            "restart": f"pg_ctl stop -m {mode}; start",
            "last_fence_before": before[-1],
            "first_fence_after": after[0],
        }
    )
    assert all(a < b for a, b in zip(before, before[1:])), before
    assert min(after) > max(before), (before, after)
    assert all(a < b for a, b in zip(after, after[1:])), after


@pytest.mark.timeout(300)
def test_down_when_a_task_starts_it_is_retried_with_the_server_named_and_runs_once_back(
    server: PrivatePostgres,
    setup: Setup,
    workers: tuple[WorkerGroup, str],
    chaos_figures: Callable[[dict[str, Any]], None],
) -> None:
    group, queue = workers
    key = unique("down")
    server.stop("fast")
    setup.client.send_task(f"{APP}.pg_retry", args=[key, 0, 0.1], queue=queue)
    said = f"PostgreSQL lock server 127.0.0.1:{server.port}/postgres"
    wait_until(lambda: said in group.logs() and "retrying later" in group.logs(), timeout=60)
    time.sleep(3.0)  # a few lock retries while it is down
    server.start()
    up = setup.now()
    first = wait_until(lambda: setup.records(key), timeout=60)[0]
    # the lock was released: the next call of the key runs too (no lock left behind)
    setup.client.send_task(f"{APP}.pg_retry", args=[key, 1, 0.1], queue=queue)
    rows = wait_until(lambda: setup.settled(key, count=2), timeout=60)
    after_up = (first[3] - up).total_seconds()
    chaos_figures(
        {
            "backend": "postgresql",
            "restart": "down when the task started; lock_on_backend_error='retry'",
            "lock_retry_backoff_max_s": 1.0,
            "ran_after_up_s": round(after_up, 2),
        }
    )
    assert [row[0] for row in rows] == [0, 1]
    assert rows[0][4] <= rows[1][3]
    assert after_up <= 30
