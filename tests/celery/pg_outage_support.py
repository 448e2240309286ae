"""The set-up of the tests whose lock server is a private PostgreSQL or a PgBouncer
(tests/chaos/test_postgres_restart.py, tests/celery/test_pgbouncer_workers.py): workers of
tests/celery/pgrestartapp.py on RabbitMQ, their locks at a URL of the test's choosing, their
records in a schema of the shared PostgreSQL (which is never stopped)."""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import pytest
from celery import Celery

from tests.celery.test_postgres_workers import BROKER_URL, PostgresServers, Setup
from tests.celery.workers import unique
from tests.postgres_support import postgres_schema

APP = "tests.celery.pgrestartapp"

psycopg = pytest.importorskip("psycopg")


def rabbitmq_answers() -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", 5672), 2):
        return True
    return False


@dataclass
class OutageServers(PostgresServers):
    """RabbitMQ, the lock URL, and the records database's URL (no Redis URL at all)."""

    records_url: str = ""

    def env(self, queue: str, **extra: str) -> dict[str, str]:
        return super().env(queue, CSL_RECORDS_URL=self.records_url, **extra)


@dataclass
class OutageSetup(Setup):
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


@contextlib.contextmanager
def outage_setup(lock_url: str) -> Iterator[OutageSetup]:
    """An :class:`OutageSetup` whose workers take their locks at ``lock_url``."""
    from tests.celery.pgrestartapp import record_table

    with postgres_schema() as records_url:
        base, schema = records_url.rsplit("?schema=", 1)
        admin = psycopg.connect(base, autocommit=True)
        admin.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
        record_table(admin, schema)
        client = Celery(unique("pg-client"), set_as_current=False)
        client.conf.update(broker_url=BROKER_URL, broker_connection_retry_on_startup=True)
        servers = OutageServers(
            broker_url=BROKER_URL,
            lock=None,  # type: ignore[arg-type]
            backend_url="-",
            app=APP,
            lock_url=lock_url,
            records_url=records_url,
        )
        setup = OutageSetup(servers, schema, admin, client)
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
