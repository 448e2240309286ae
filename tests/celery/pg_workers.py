"""The harness of every test on real ``celery worker`` processes with PostgreSQL locks
(tests/celery/test_postgres_*workers.py, tests/celery/test_pgbouncer_workers.py,
tests/chaos/test_postgres_*.py): workers of tests/celery/postgresapp.py on RabbitMQ, no Redis
URL anywhere, their locks at a URL of the test's choosing (by default the test's own schema of
the shared PostgreSQL), their records in the test's own schema of the shared PostgreSQL (which
is never stopped, so an outage of a private lock server leaves the records readable).

The bodies write their start and end by the database's clock, from inside the lock, so "never
two at once" is read from one clock whatever process ran them."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import pytest
from celery import Celery

from tests.celery.workers import Servers, WorkerGroup, unique, worker_group
from tests.postgres_support import postgres_schema
from tests.support import wait_until

psycopg = pytest.importorskip("psycopg")

APP = "tests.celery.postgresapp"
BROKER_URL = os.environ.get("CSL_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
#: the ``seconds`` of a body that runs until the test opens its gate (:meth:`Setup.open_gate`)
GATED = -1.0


def rabbitmq_answers() -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 5672), 2):
        return True
    return False


@dataclass
class PostgresServers(Servers):
    """A RabbitMQ broker and the PostgreSQL lock URL: the workers get no Redis URL at all;
    ``records_url`` where the records live apart from the locks."""

    lock_url: str = ""
    records_url: str = ""

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("CSL_")}
        env.update(
            CSL_BROKER_URL=self.broker_url,
            CSL_PG_URL=self.lock_url,
            CSL_QUEUE=queue,
            PYTHONUNBUFFERED="1",
            **extra,
        )
        if self.records_url:
            env["CSL_RECORDS_URL"] = self.records_url
        return env


@dataclass
class Setup:
    servers: PostgresServers
    schema: str
    admin: Any  # a psycopg connection to the database of the test's records schema
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
        return [row[:5] for row in self.records(key)]

    def records(self, key: str) -> list[tuple[Any, ...]]:
        """``(n, pid, fence, started, ended, lost, lost_seen)`` of each run of ``key``."""
        return list(
            self.admin.execute(
                f"SELECT n, pid, fence, started, ended, lost, lost_seen FROM {self.schema}.records "
                "WHERE key = %s ORDER BY started",
                (key,),
            ).fetchall()
        )

    def settled(self, key: str, count: Optional[int] = None, quiet: float = 2.0) -> Any:
        """The runs of ``key`` if every one has ended and none came for ``quiet`` seconds
        (and there are ``count`` of them, if given); else None (for ``wait_until``)."""
        first = self.records(key)
        if count is not None and len(first) < count:
            return None
        time.sleep(quiet)
        second = self.records(key)
        if first == second and second and all(row[4] for row in second):
            return second
        return None

    def open_gate(self, key: str) -> None:
        """End the gated bodies of ``key`` (``seconds`` < 0: postgresapp.run_recorded and
        run_watched wait for it)."""
        self.admin.execute(f"INSERT INTO {self.schema}.gates (key) VALUES (%s)", (key,))

    def now(self) -> Any:
        return self.admin.execute("SELECT clock_timestamp()").fetchone()[0]

    def queue_empty(self, queue: str) -> bool:
        with self.client.connection_for_write() as connection:
            declared = connection.default_channel.queue_declare(queue, passive=True)
            return bool(declared.message_count == 0)


@contextlib.contextmanager
def postgres_setup(lock_url: Optional[str] = None) -> Iterator[Setup]:
    """A :class:`Setup` with a records schema of its own in the shared PostgreSQL; the workers
    take their locks at ``lock_url``, or in that schema if None."""
    from tests.celery.postgresapp import record_table

    with postgres_schema() as url:
        base, schema = url.rsplit("?schema=", 1)
        admin = psycopg.connect(base, autocommit=True)
        admin.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        record_table(admin, schema)
        client = Celery(unique("pg-client"), set_as_current=False)
        client.conf.update(broker_url=BROKER_URL, broker_connection_retry_on_startup=True)
        servers = PostgresServers(
            broker_url=BROKER_URL,
            lock=None,  # type: ignore[arg-type]
            backend_url="-",
            app=APP,
            lock_url=lock_url or url,
            records_url=url if lock_url else "",
        )
        setup = Setup(servers, schema, admin, client)
        try:
            yield setup
        finally:
            setup.delete_queues()
            client.close()
            admin.close()


@contextlib.contextmanager
def two_prefork_workers(setup: Setup) -> Iterator[tuple[WorkerGroup, str]]:
    """Two prefork workers (-c 2) on one queue: a module's, shared by its tests."""
    queue = setup.queue()
    with worker_group(setup.servers) as group:
        group.start(2, queue=queue, concurrency=2, app=APP)
        yield group, queue


def skipped(group: WorkerGroup, task_id: str) -> bool:
    """True once a worker of ``group`` logged the call ``task_id`` skipped as a duplicate."""
    return any(f"[{task_id}] skipped: lock" in worker.log() for worker in group.workers)


@contextlib.contextmanager
def worker_of_its_own(concurrency: int) -> Iterator[tuple[Setup, str]]:
    """One prefork worker (``-c concurrency``) on a queue of its own, in a :class:`Setup` of its
    own: a module's, shared by its tests that send it calls of their own keys."""
    with postgres_setup() as made:
        queue = made.queue()
        with worker_group(made.servers) as group:
            group.start(1, queue=queue, concurrency=concurrency, app=APP)
            yield made, queue


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
