"""The app of the PostgreSQL outage tests (tests/chaos/test_postgres_restart.py and
tests/celery/test_pgbouncer_workers.py): RabbitMQ as the broker, the locks in the PostgreSQL
(or PgBouncer) that ``CSL_PG_URL`` names, the bodies' records in ANOTHER database
(``CSL_RECORDS_URL``, with its ``?schema=``): the lock server can then be stopped under a
running body without the body's own writes failing.

Each body writes a row of ``<schema>.records`` (key, n, pid, fence, start, end by the records
database's clock: one clock for every worker), and at its end whether its lease was reported
lost (``self.request.lock.lost``) and when it first saw that.
"""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import psycopg
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.engine.postgres.connections import split_url

LOCK_URL = os.environ.get("CSL_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
RECORDS_CONNINFO, SCHEMA = split_url(os.environ.get("CSL_RECORDS_URL", LOCK_URL))
#: the lock_ttl of every task here
TTL = 10.0

app = Celery("pgrestartapp")
app.conf.update(
    broker_url=os.environ.get("CSL_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("CSL_QUEUE", "celery"),
    task_ignore_result=True,
    worker_prefetch_multiplier=1,
    singleton_lock_url=LOCK_URL,
)

_records: Optional[psycopg.Connection[Any]] = None
_records_pid = 0


def records() -> psycopg.Connection[Any]:
    """This process's connection to the records table (a forked child opens its own)."""
    global _records, _records_pid
    if _records is None or _records_pid != os.getpid():
        _records = psycopg.connect(RECORDS_CONNINFO, autocommit=True)
        _records_pid = os.getpid()
    return _records


def record_table(connection: psycopg.Connection[Any], schema: str) -> None:
    """Create the records table in ``schema`` (the test does, before any worker starts)."""
    connection.execute(
        f"CREATE TABLE IF NOT EXISTS {schema}.records (id bigserial PRIMARY KEY, key text, "
        "n integer, pid integer, fence bigint, started timestamptz, ended timestamptz, "
        "lost boolean, lost_seen timestamptz)"
    )


def run_recorded(task: Any, key: str, n: int, seconds: float) -> None:
    """Record the start, run ``seconds`` in 0.1 s steps noting when the lease is first seen
    lost, record the end."""
    connection, lock = records(), task.request.lock
    (row_id,) = connection.execute(
        f"INSERT INTO {SCHEMA}.records (key, n, pid, fence, started) "
        "VALUES (%s, %s, %s, %s, clock_timestamp()) RETURNING id",
        (key, n, os.getpid(), lock.fence),
    ).fetchone() or (0,)
    deadline = time.monotonic() + seconds
    seen = False
    for _ in range(int(seconds * 10) + 1):
        if lock.lost and not seen:
            seen = True
            connection.execute(
                f"UPDATE {SCHEMA}.records SET lost_seen = clock_timestamp() WHERE id = %s",
                (row_id,),
            )
        if time.monotonic() >= deadline:
            break
        time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))
    connection.execute(
        f"UPDATE {SCHEMA}.records SET ended = clock_timestamp(), lost = %s WHERE id = %s",
        (lock.lost, row_id),
    )


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="skip",
    lock_fencing=True,
    lock_ttl=TTL,
    lock_on=["key"],
    lock_retry_backoff=0.5,
    lock_retry_backoff_max=1.0,
)
def pg_hold(self: Any, key: str, n: int, seconds: float) -> None:
    run_recorded(self, key, n, seconds)


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="retry",
    lock_fencing=True,
    lock_ttl=TTL,
    lock_on=["key"],
    lock_retry_backoff=0.5,
    lock_retry_backoff_max=1.0,
    lock_max_retries=1000,
)
def pg_retry(self: Any, key: str, n: int, seconds: float) -> None:
    run_recorded(self, key, n, seconds)


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="wait",
    lock_fencing=True,
    lock_ttl=TTL,
    lock_on=["key"],
    lock_wait_timeout=120,
)
def pg_wait(self: Any, key: str, n: int, seconds: float) -> None:
    run_recorded(self, key, n, seconds)
