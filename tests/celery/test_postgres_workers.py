"""Issue 34's acceptance on real ``celery worker`` processes: RabbitMQ as the broker,
PostgreSQL for the locks, no Redis URL anywhere (tests/celery/postgresapp.py).

The bodies write their start and end by the database's clock, from inside the lock, so "never
two at once" is read from one clock whatever process ran them.
"""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import pytest
from celery import Celery

from tests.celery.workers import CeleryWorkerProcess, Servers, unique, worker_group
from tests.postgres_support import postgres_schema
from tests.support import wait_until

psycopg = pytest.importorskip("psycopg")

APP = "tests.celery.postgresapp"
BROKER_URL = os.environ.get("CSL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def _rabbitmq_answers() -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 5672), 2):
        return True
    return False


pytestmark = pytest.mark.skipif(not _rabbitmq_answers(), reason="no RabbitMQ at 127.0.0.1:5672")


@dataclass
class PostgresServers(Servers):
    """A RabbitMQ broker and the PostgreSQL lock URL: the workers get no Redis URL at all."""

    lock_url: str = ""

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CSL_")}
        env.update(
            CSL_BROKER_URL=self.broker_url,
            CSL_PG_URL=self.lock_url,
            CSL_QUEUE=queue,
            PYTHONUNBUFFERED="1",
            **extra,
        )
        return env


@dataclass
class Setup:
    servers: PostgresServers
    schema: str
    admin: Any  # a psycopg connection to the test's schema
    client: Celery
    #: the RabbitMQ queues the test used, deleted at its end
    queues: list[str] = field(default_factory=list)

    def queue(self) -> str:
        name = unique("pgq")
        self.queues.append(name)
        return name

    def delete_queues(self) -> None:
        with self.client.connection_for_write() as connection:
            for name in self.queues:
                with contextlib.suppress(Exception):
                    connection.default_channel.queue_delete(name)

    def rows(self, key: str) -> list[tuple[Any, ...]]:
        """``(n, pid, fence, started, ended)`` of each body run under ``key``, by start."""
        return list(
            self.admin.execute(
                f"SELECT n, pid, fence, started, ended FROM {self.schema}.records "
                "WHERE key = %s ORDER BY started",
                (key,),
            ).fetchall()
        )

    def now(self) -> Any:
        return self.admin.execute("SELECT clock_timestamp()").fetchone()[0]

    def queue_empty(self, queue: str) -> bool:
        with self.client.connection_for_write() as connection:
            declared = connection.default_channel.queue_declare(queue, passive=True)
            return bool(declared.message_count == 0)


@pytest.fixture
def setup() -> Iterator[Setup]:
    from tests.celery.postgresapp import record_table

    with postgres_schema() as url:
        schema = url.rsplit("schema=", 1)[1]
        admin = psycopg.connect(url.rsplit("?", 1)[0], autocommit=True)
        admin.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        record_table(admin, schema)
        client = Celery(unique("pg-client"), set_as_current=False)
        client.conf.update(broker_url=BROKER_URL, broker_connection_retry_on_startup=True)
        servers = PostgresServers(
            broker_url=BROKER_URL, lock=None, backend_url="-", app=APP, lock_url=url
        )
        setup = Setup(servers, schema, admin, client)
        try:
            yield setup
        finally:
            setup.delete_queues()
            client.close()
            admin.close()


def never_two_at_once(rows: list[tuple[Any, ...]]) -> None:
    """Each run (by start) started after the one before it ended."""
    for before, after in zip(rows, rows[1:]):
        assert before[4] is not None and before[4] <= after[3], (before, after)


def drained(setup: Setup, queue: str, key: str) -> list[tuple[Any, ...]]:
    """The runs under ``key`` once the queue is empty and every run has ended."""
    wait_until(lambda: setup.queue_empty(queue), timeout=120, interval=0.5)

    def settled() -> Any:
        first = setup.rows(key)
        time.sleep(2)
        second = setup.rows(key)
        return second if first == second and all(row[4] for row in second) else None

    rows: list[tuple[Any, ...]] = wait_until(settled, timeout=60)
    return rows


def test_200_same_argument_skip_calls_never_run_two_at_once(setup: Setup) -> None:
    queue, key = setup.queue(), unique("skip")
    with worker_group(setup.servers) as group:
        group.start(1, queue=queue, concurrency=4, app=APP)
        for _ in range(200):
            setup.client.send_task(f"{APP}.pg_skip", args=[key, 0], queue=queue)
        rows = drained(setup, queue, key)
    assert rows  # some ran
    print(f"200 skip calls: {len(rows)} ran, never two at once")
    never_two_at_once(rows)


def test_50_fenced_retry_calls_get_fences_increasing_in_start_order(setup: Setup) -> None:
    queue, key = setup.queue(), unique("fenced")
    with worker_group(setup.servers) as group:
        group.start(1, queue=queue, concurrency=4, app=APP)
        for n in range(50):
            setup.client.send_task(f"{APP}.pg_fenced", args=[key, n], queue=queue)
        rows = wait_until(lambda: (lambda r: r if len(r) == 50 else None)(setup.rows(key)), 180)
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


def test_after_a_kill_9_of_the_holders_worker_a_duplicate_runs_within_ttl_plus_3s(
    setup: Setup,
) -> None:
    queue, key = setup.queue(), unique("long")
    ttl = 3.0  # pg_long's lock_ttl
    with worker_group(setup.servers) as group:
        workers = group.start(2, queue=queue, concurrency=2, app=APP)
        setup.client.send_task(f"{APP}.pg_long", args=[key, 0, 300.0], queue=queue)
        first = wait_until(lambda: setup.rows(key), timeout=60)[0]
        holder: CeleryWorkerProcess = next(w for w in workers if first[1] in w.children())
        holder.crash()
        killed = setup.now()
        setup.client.send_task(f"{APP}.pg_long", args=[key, 1, 0.1], queue=queue)
        rows = wait_until(lambda: (lambda r: r if len(r) == 2 else None)(setup.rows(key)), 60)
    duplicate = rows[1]
    assert duplicate[0] == 1
    delay = (duplicate[3] - killed).total_seconds()
    print(f"the duplicate started {delay:.2f}s after the kill -9 (lock_ttl {ttl:g}s)")
    assert delay <= ttl + 3
