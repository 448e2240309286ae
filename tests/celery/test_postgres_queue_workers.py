"""Policies ``queue`` and ``replace`` with the PostgreSQL backend on real ``celery worker``
processes (RabbitMQ broker; tests/celery/postgresapp.py): parked calls are rows, the release
hands the lock on in its own transaction, and the sweeper of any worker hands on a lock whose
holder's worker was killed.

The bodies record their start and end by the database's clock, from inside the lock.
"""

from __future__ import annotations

import os
import signal
import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import pytest
from celery import Celery

from celery_singleton_lock.testing import RedisServer
from tests.celery.pg_workers import (
    APP,
    BROKER_URL,
    GATED,
    PostgresServers,
    Setup,
    drained,
    never_two_at_once,
    rabbitmq_answers,
)
from tests.celery.test_postgres_workers import setup  # noqa: F401 - the fixture
from tests.celery.workers import CeleryWorkerProcess, unique, worker_group
from tests.support import wait_until

pytestmark = pytest.mark.skipif(not rabbitmq_answers(), reason="no RabbitMQ at 127.0.0.1:5672")


@pytest.fixture
def pg(setup: Setup) -> Setup:  # noqa: F811 - the fixture of tests/celery/test_postgres_workers.py
    return setup


def parked_ids(pg: Setup) -> list[str]:
    return [
        row[0]
        for row in pg.admin.execute(
            f"SELECT task_id FROM {pg.schema}.singleton_lock_parked ORDER BY round, arrival"
        ).fetchall()
    ]


def started(pg: Setup, key: str, n: int) -> bool:
    return any(row[0] == n for row in pg.rows(key))


def park_in_order(pg: Setup, task: str, queue: str, key: str, first: int, count: int) -> Any:
    """Send calls ``first``... one by one, each once the one before is parked: their arrival
    order is their number order. Returns their task ids."""
    ids = []
    for n in range(first, first + count):
        sent = pg.client.send_task(f"{APP}.{task}", args=[key, n, 0.1], queue=queue)
        ids.append(sent.id)
        wait_until(lambda sent=sent: sent.id in parked_ids(pg), timeout=60, interval=0.05)
    return ids


def test_20_queued_calls_of_one_key_on_prefork_run_once_each_one_at_a_time_in_order(
    pg: Setup,
) -> None:
    queue, key = pg.queue(), unique("queue")
    with worker_group(pg.servers) as group:
        (worker,) = group.start(1, queue=queue, concurrency=4, app=APP)
        pg.client.send_task(f"{APP}.pg_queue", args=[key, 0, GATED], queue=queue)
        wait_until(lambda: started(pg, key, 0), timeout=60)
        park_in_order(pg, "pg_queue", queue, key, 1, 19)
        pg.open_gate(key)
        rows = drained(pg, queue, key)
        retries = worker.log().count("lock retry")
    assert [row[0] for row in rows] == list(range(20))  # each once, in arrival order
    never_two_at_once(rows)
    assert retries == 0  # handed on, never retried
    gaps = [(after[3] - before[4]).total_seconds() for before, after in zip(rows, rows[1:])]
    print(
        f"\n20 queued calls on PostgreSQL: hand-off (release to the next start) median "
        f"{statistics.median(gaps) * 1000:.1f} ms, max {max(gaps) * 1000:.1f} ms"
    )


# -- priority: the message's, read the broker's way (sql/turn.sql) -----------------------------


@pytest.fixture
def redis_broker(pg: Setup, redis_server: RedisServer) -> Iterator[tuple[PostgresServers, Celery]]:
    """Workers whose broker is Redis (0 is its highest priority: the tasks' ``priority_sign``
    is -1), their locks in the test's schema; and a client of that broker."""
    servers = PostgresServers(
        broker_url=redis_server.url,
        lock=None,
        backend_url="-",
        app=APP,
        lock_url=pg.servers.lock_url,
    )
    client = Celery(unique("pg-redis-broker"), set_as_current=False)
    client.conf.update(broker_url=redis_server.url, broker_connection_retry_on_startup=True)
    yield servers, client
    client.close()


def run_order(
    pg: Setup, servers: PostgresServers, client: Celery, task: str, calls: list[list[Any]]
) -> list[int]:
    """A gated call of ``task`` (args ``calls[0]``) holds the lock; each of the others (args,
    then its priority last) is sent once the one before is parked; then the gate opens. The
    ``n`` of each run, in start order. Every args list is ``[key, ..., n, seconds]``."""
    queue, key = pg.queue(), calls[0][0]
    with worker_group(servers) as group:
        group.start(1, queue=queue, concurrency=2, app=APP)
        client.send_task(f"{APP}.{task}", args=calls[0], queue=queue)
        wait_until(lambda: started(pg, key, calls[0][-2]), timeout=60)
        for *args, priority in calls[1:]:
            sent = client.send_task(f"{APP}.{task}", args=args, queue=queue, priority=priority)
            wait_until(lambda sent=sent: sent.id in parked_ids(pg), timeout=60, interval=0.05)
        pg.open_gate(key)

        def all_ended() -> Optional[list[tuple[Any, ...]]]:
            rows = pg.rows(key)
            return rows if len(rows) == len(calls) and all(row[4] for row in rows) else None

        rows = wait_until(all_ended, timeout=120, interval=0.2)
    never_two_at_once(rows)
    return [row[0] for row in rows]


def test_parked_calls_run_by_their_messages_priority_lower_first_on_a_redis_broker(
    pg: Setup, redis_broker: tuple[PostgresServers, Celery]
) -> None:
    """Priorities 9, 0, 5, parked in that order (n 1, 2, 3): 0 runs first, then 5, then 9."""
    key = unique("prio")
    calls = [[key, 0, GATED]] + [[key, n, 0.1, p] for n, p in ((1, 9), (2, 0), (3, 5))]
    assert run_order(pg, *redis_broker, "pg_queue", calls) == [0, 2, 3, 1]


def test_parked_calls_run_by_their_messages_priority_higher_first_on_rabbitmq(
    pg: Setup,
) -> None:
    """Priorities 9, 0, 5, parked in that order (n 1, 2, 3): 9 runs first, then 5, then 0."""
    key = unique("prio")
    calls = [[key, 0, GATED]] + [[key, n, 0.1, p] for n, p in ((1, 9), (2, 0), (3, 5))]
    assert run_order(pg, pg.servers, pg.client, "pg_queue", calls) == [0, 1, 3, 2]


def test_fair_parked_calls_go_round_robin_across_tenants_each_turn_by_priority(
    pg: Setup, redis_broker: tuple[PostgresServers, Celery]
) -> None:
    """Redis broker: 0 first. Tenant a parks priorities 9, 0, 5 (n 1, 2, 3), then tenant b
    one call (n 4): a's turn goes to its 0, then b's turn, then a's 5 and 9."""
    key = unique("fair")
    calls = [[key, "h", 0, GATED]]
    calls += [
        [key, t, n, 0.1, p] for t, n, p in (("a", 1, 9), ("a", 2, 0), ("a", 3, 5), ("b", 4, 9))
    ]
    assert run_order(pg, *redis_broker, "pg_queue_fair", calls) == [0, 2, 4, 3, 1]


def test_parked_calls_run_once_each_after_a_kill_9_of_the_holders_worker(pg: Setup) -> None:
    queue, key = pg.queue(), unique("killed")
    with worker_group(pg.servers) as group:
        (doomed,) = group.start(1, queue=queue, concurrency=2, app=APP)
        pg.client.send_task(f"{APP}.pg_queue", args=[key, 0, GATED], queue=queue)
        wait_until(lambda: started(pg, key, 0), timeout=60)
        park_in_order(pg, "pg_queue", queue, key, 1, 4)
        doomed.crash()  # the lock is left to its TTL (5 s): the holder never releases it
        group.start(1, queue=queue, concurrency=2, app=APP)  # its sweeper hands the lock on
        wait_until(lambda: pg.queue_empty(queue), timeout=90, interval=0.5)
        rows = wait_until(lambda: settled(pg, key, 5), timeout=90, interval=0.5)
        time.sleep(3)  # a call run twice would show now
        rows = pg.rows(key)
    assert [row[0] for row in rows] == [0, 1, 2, 3, 4]
    assert rows[0][4] is None  # the holder's own run was cut short by the kill
    never_two_at_once(rows[1:])
    assert parked_ids(pg) == []


def settled(pg: Setup, key: str, count: int) -> Any:
    """The runs under ``key`` once ``count`` started and all but the first ended."""
    rows = pg.rows(key)
    return rows if len(rows) >= count and all(row[4] for row in rows[1:]) else None


def test_parked_calls_run_once_each_after_a_kill_9_of_the_holders_pool_child(pg: Setup) -> None:
    queue, key = pg.queue(), unique("child")
    with worker_group(pg.servers) as group:
        group.start(1, queue=queue, concurrency=2, app=APP)
        pg.client.send_task(f"{APP}.pg_queue", args=[key, 0, GATED], queue=queue)
        holder_pid = wait_until(lambda: pg.rows(key), timeout=60)[0][1]
        park_in_order(pg, "pg_queue", queue, key, 1, 3)
        os.kill(holder_pid, signal.SIGKILL)  # its worker's main process reclaims the lock
        wait_until(lambda: pg.queue_empty(queue), timeout=90, interval=0.5)
        wait_until(lambda: settled(pg, key, 4), timeout=90, interval=0.5)
        time.sleep(3)  # a call run twice would show now
        rows = pg.rows(key)
    assert [row[0] for row in rows] == [0, 1, 2, 3]
    never_two_at_once(rows[1:])


@dataclass
class ResultServers(PostgresServers):
    """As :class:`PostgresServers`, with a result backend (the states of superseded calls)."""

    result_url: str = ""

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        return super().env(queue, CSL_RESULT_BACKEND=self.result_url, **extra)


@pytest.fixture
def results(pg: Setup, redis_server: RedisServer) -> Iterator[tuple[ResultServers, Celery]]:
    servers = ResultServers(
        broker_url=BROKER_URL,
        lock=None,
        backend_url="-",
        app=APP,
        lock_url=pg.servers.lock_url,
        result_url=redis_server.url,
    )
    client = Celery(unique("pg-results"), set_as_current=False)
    client.conf.update(
        broker_url=BROKER_URL,
        broker_connection_retry_on_startup=True,
        result_backend=redis_server.url,
    )
    yield servers, client
    client.close()


def test_replace_runs_the_running_call_and_the_newest_and_supersedes_the_8_between(
    pg: Setup, results: tuple[ResultServers, Celery]
) -> None:
    servers, client = results
    queue, key = pg.queue(), unique("replace")
    with worker_group(servers) as group:
        group.start(1, queue=queue, concurrency=4, app=APP)
        running = client.send_task(f"{APP}.pg_replace", args=[key, 0, GATED], queue=queue)
        wait_until(lambda: started(pg, key, 0), timeout=60)
        calls = []
        for n in range(1, 10):  # each sent once the one before waits behind the lock
            call = client.send_task(f"{APP}.pg_replace", args=[key, n, 0.1], queue=queue)
            calls.append(call)
            wait_until(lambda call=call: parked_ids(pg) == [call.id], timeout=60)
        pg.open_gate(key)
        running.get(timeout=60)
        calls[-1].get(timeout=60)
        wait_until(lambda: all(call.state == "REVOKED" for call in calls[:-1]), timeout=60)
        rows = drained(pg, queue, key)
    assert [row[0] for row in rows] == [0, 9]
    never_two_at_once(rows)
    for call in calls[:-1]:
        assert call.state == "REVOKED"
        assert "superseded" in str(call.result)


def test_restart_stops_the_running_call_which_ends_superseded_before_the_newest_starts(
    pg: Setup, results: tuple[ResultServers, Celery]
) -> None:
    servers, client = results
    queue, key = pg.queue(), unique("restart")
    with worker_group(servers) as group:
        group.start(1, queue=queue, concurrency=2, app=APP)
        first = client.send_task(f"{APP}.pg_restart", args=[key, 0, 60.0], queue=queue)
        wait_until(lambda: started(pg, key, 0), timeout=60)
        newest = client.send_task(f"{APP}.pg_restart", args=[key, 1, 0.1], queue=queue)
        newest.get(timeout=60)
        wait_until(lambda: first.state == "REVOKED", timeout=30)
        rows = drained(pg, queue, key)
    assert "superseded" in str(first.result)
    assert [row[0] for row in rows] == [0, 1]
    never_two_at_once(rows)


def test_kill_9_of_holders_workers_again_and_again_runs_each_parked_call_to_its_end_once(
    pg: Setup,
) -> None:
    """Chaos: 16 acks_late calls of one key on two workers; three times the worker whose
    child runs the lock's body is killed with ``kill -9`` (its unacknowledged messages go
    back to the broker, its lease runs out) and a fresh worker joins. Every call runs to its
    end exactly once, never beside another, but a holder cut short by a kill (its copy,
    redelivered while its dead lease still holds the lock, is skipped, as on Redis)."""
    queue, key, calls = pg.queue(), unique("chaos"), 16
    killed_pids: set[int] = set()
    with worker_group(pg.servers) as group:
        workers = group.start(2, queue=queue, concurrency=2, app=APP)
        for n in range(calls):
            pg.client.send_task(f"{APP}.pg_queue_late", args=[key, n, 0.3], queue=queue)
        for kill in range(3):
            wait_until(lambda kill=kill: len(ended_runs(pg, key)) >= 3 * (kill + 1), 120)
            holder = wait_until(lambda w=workers: running_in(pg, key, w, killed_pids), 60, 0.05)
            killed_pids.update(holder.children())
            holder.crash()
            workers.remove(holder)
            workers += group.start(1, queue=queue, concurrency=2, app=APP)
        wait_until(lambda: all_seen(pg, key, calls), timeout=180, interval=0.5)
        time.sleep(5)  # a call run twice would show now
        rows = pg.rows(key)
    done = [row for row in rows if row[4] is not None]
    cut_short = {row[0] for row in rows if row[4] is None}
    assert all(row[1] in killed_pids for row in rows if row[4] is None)
    assert len(cut_short) <= 3  # at most the holder of each kill
    ended = sorted(row[0] for row in done)
    assert len(ended) == len(set(ended))  # none ran to its end twice
    assert set(ended) | cut_short == set(range(calls))  # every call ran
    never_two_at_once(done)
    assert parked_ids(pg) == []
    print(f"\nchaos: 3 kills cut {len(cut_short)} run(s) short; {len(ended)} ran to their end")


def running_in(
    pg: Setup, key: str, workers: list[CeleryWorkerProcess], killed_pids: set[int]
) -> Optional[CeleryWorkerProcess]:
    """The worker whose pool child runs a body of ``key`` now, if one does."""
    running = [row[1] for row in pg.rows(key) if row[4] is None and row[1] not in killed_pids]
    return next((w for w in workers for pid in running if pid in w.children()), None)


def all_seen(pg: Setup, key: str, calls: int) -> bool:
    """Every call of ``key`` started, and every run ended but those cut short by a kill."""
    rows = pg.rows(key)
    return {row[0] for row in rows} == set(range(calls)) and all(
        row[4] is not None for row in rows if row[0] not in {r[0] for r in rows if r[4] is None}
    )


def ended_runs(pg: Setup, key: str) -> list[Any]:
    return [row for row in pg.rows(key) if row[4] is not None]


def test_debounce_runs_only_the_last_call_of_a_burst_once_it_is_quiet(
    pg: Setup, results: tuple[ResultServers, Celery]
) -> None:
    servers, client = results
    queue, key = pg.queue(), unique("debounce")
    with worker_group(servers) as group:
        group.start(1, queue=queue, concurrency=2, app=APP)
        calls = []
        for n in range(5):  # each sent once the one before waits (held back by the debounce)
            call = client.send_task(f"{APP}.pg_debounced", args=[key, n, 0.1], queue=queue)
            calls.append(call)
            wait_until(lambda call=call: parked_ids(pg) == [call.id], timeout=60)
        last_sent = pg.now()
        calls[-1].get(timeout=60)
        wait_until(lambda: all(call.state == "REVOKED" for call in calls[:-1]), timeout=60)
        rows = drained(pg, queue, key)
    assert [row[0] for row in rows] == [4]
    delay = (rows[0][3] - last_sent).total_seconds()
    print(f"\ndebounce 1 s: the last call started {delay:.2f}s after it was seen waiting")
    assert delay > 0  # held back until the burst was quiet, never run on arrival
