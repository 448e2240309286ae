"""The app of every test on ``celery worker`` processes with PostgreSQL locks: RabbitMQ as
the broker, PostgreSQL for the locks and for the bodies' records, no Redis URL anywhere
(tests/celery/test_postgres_*workers.py, tests/celery/test_pgbouncer_workers.py,
tests/chaos/test_postgres_kills.py, tests/chaos/test_postgres_restart.py).

Configured by the environment: ``CSL_BROKER_URL`` (AMQP), ``CSL_PG_URL`` (the lock URL, with
the test's ``?schema=``), ``CSL_QUEUE``, ``CSL_RESULT_BACKEND`` where a test reads states, and
``CSL_RECORDS_URL`` where the records live in ANOTHER database than the locks (the outage
tests: the lock server can then be stopped under a running body without the body's own writes
failing; unset, the records share the lock URL's schema). Each body writes a row of
``<schema>.records``: its key, pid, fence, and its start and end by the database's clock (one
clock for every worker), from inside the lock; the outage tasks (``pg_hold``, ``pg_retry``,
``pg_wait``) also whether their lease was reported lost (``self.request.lock.lost``) and when
they first saw that."""

from __future__ import annotations

import os
import time
from typing import Any, Optional

import psycopg
from celery import Celery

from celery_singleton_lock import LockedTask
from celery_singleton_lock.engine.postgres.connections import split_url

LOCK_URL = os.environ.get("CSL_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
CONNINFO, SCHEMA = split_url(os.environ.get("CSL_RECORDS_URL") or LOCK_URL)
#: the lock_ttl of the outage tasks (pg_hold, pg_retry, pg_wait)
OUTAGE_TTL = 10.0

app = Celery("postgresapp")
app.conf.update(
    broker_url=os.environ.get("CSL_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    broker_connection_retry_on_startup=True,
    task_default_queue=os.environ.get("CSL_QUEUE", "celery"),
    # a result backend only where a test reads states (policy replace: REVOKED superseded)
    result_backend=os.environ.get("CSL_RESULT_BACKEND") or None,
    task_ignore_result=not os.environ.get("CSL_RESULT_BACKEND"),
    worker_prefetch_multiplier=1,
    singleton_lock_url=LOCK_URL,
)

_records: Optional[psycopg.Connection[Any]] = None
_records_pid = 0


def records() -> psycopg.Connection[Any]:
    """This process's connection to the records table (a forked child opens its own)."""
    global _records, _records_pid
    if _records is None or _records_pid != os.getpid():
        _records = psycopg.connect(CONNINFO, autocommit=True)
        _records_pid = os.getpid()
    return _records


def record_table(connection: psycopg.Connection[Any], schema: str) -> None:
    """Create the records table in ``schema`` (the test does, before any worker starts)."""
    connection.execute(
        f"CREATE TABLE IF NOT EXISTS {schema}.records (id bigserial PRIMARY KEY, key text, "
        "n integer, pid integer, fence bigint, started timestamptz, ended timestamptz, "
        "lost boolean, lost_seen timestamptz)"
    )
    connection.execute(f"CREATE TABLE IF NOT EXISTS {schema}.gates (key text PRIMARY KEY)")


def wait_for_gate(connection: psycopg.Connection[Any], key: str) -> None:
    """Until the test opens the gate of ``key`` (a row of ``<schema>.gates``), at most 120 s."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        query = f"SELECT 1 FROM {SCHEMA}.gates WHERE key = %s"
        if connection.execute(query, (key,)).fetchone():
            return
        time.sleep(0.05)


def run_recorded(key: str, n: int, fence: Optional[int], seconds: float) -> None:
    """Record the body's start, sleep ``seconds`` (a negative number: until the gate of
    ``key`` opens), record its end."""
    connection = records()
    (row_id,) = connection.execute(
        f"INSERT INTO {SCHEMA}.records (key, n, pid, fence, started) "
        "VALUES (%s, %s, %s, %s, clock_timestamp()) RETURNING id",
        (key, n, os.getpid(), fence),
    ).fetchone() or (0,)
    if seconds < 0:
        wait_for_gate(connection, key)
    else:
        time.sleep(seconds)
    connection.execute(
        f"UPDATE {SCHEMA}.records SET ended = clock_timestamp() WHERE id = %s", (row_id,)
    )


@app.task(base=LockedTask, bind=True, on_duplicate="skip", lock_ttl=10, lock_on=["key"])
def pg_skip(self: Any, key: str, n: int) -> None:
    run_recorded(key, n, None, 0.02)


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="retry",
    lock_fencing=True,
    lock_ttl=10,
    lock_on=["key"],
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.2,
)
def pg_fenced(self: Any, key: str, n: int) -> None:
    run_recorded(key, n, self.request.lock.fence, 0.02)


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="wait",
    lock_ttl=3,
    lock_wait_timeout=120,
    lock_on=["key"],
)
def pg_long(self: Any, key: str, n: int, seconds: float) -> None:
    run_recorded(key, n, None, seconds)


def account_table(connection: psycopg.Connection[Any], schema: str) -> None:
    """Create the business table of ``pg_fenced_write`` in ``schema`` (the test does): one row
    per key, the fence of the last holder that wrote it, and how many writes it took."""
    connection.execute(
        f"CREATE TABLE IF NOT EXISTS {schema}.accounts (key text PRIMARY KEY, "
        "writes integer NOT NULL DEFAULT 0, fence bigint)"
    )


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="retry",
    lock_fencing=True,
    lock_ttl=10,
    lock_on=["key"],
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.2,
)
def pg_fenced_write(self: Any, key: str, n: int) -> None:
    """Record the run, then a read-modify-write of the key's row, fenced in its transaction."""
    from celery_singleton_lock.contrib.fencing.psycopg import fenced_update

    run_recorded(key, n, self.request.lock.fence, 0.0)
    connection = records()
    with connection.transaction():
        (writes,) = connection.execute(
            f"SELECT writes FROM {SCHEMA}.accounts WHERE key = %s FOR UPDATE", (key,)
        ).fetchone() or (0,)
        fenced_update(
            connection,
            f"{SCHEMA}.accounts",
            {"key": key},
            {"writes": writes + 1},
            self.request.lock.fence,
        )


# -- admission (lock_limit, lock_rate, lock_cooldown, dedupe_on_enqueue) ----------------------


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="retry",
    lock_limit=3,
    lock_ttl=10,
    lock_on=["key"],
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.2,
    lock_max_retries=None,
)
def pg_limited(self: Any, key: str, n: int) -> None:
    run_recorded(key, n, None, 0.3)


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="retry",
    lock_limit=2,
    lock_ttl=3,
    lock_on=["key"],
    lock_retry_backoff=0.2,
    lock_retry_backoff_max=0.5,
)
def pg_limited_long(self: Any, key: str, n: int, seconds: float) -> None:
    run_recorded(key, n, None, seconds)


@app.task(base=LockedTask, bind=True, lock_rate="2/30s", lock_ttl=10, lock_on=["key"])
def pg_rated(self: Any, key: str, n: int) -> None:
    run_recorded(key, n, None, 0.01)


@app.task(base=LockedTask, bind=True, lock_cooldown=30, lock_ttl=10, lock_on=["key"])
def pg_cooled(self: Any, key: str, n: int) -> None:
    run_recorded(key, n, None, 0.01)


@app.task(base=LockedTask, bind=True, dedupe_on_enqueue=True, lock_ttl=10, lock_on=["key"])
def pg_deduped(self: Any, key: str, n: int) -> None:
    run_recorded(key, n, None, 0.01)


@app.task(base=LockedTask, bind=True, on_duplicate="queue", lock_ttl=5, lock_on=["key"])
def pg_queue(self: Any, key: str, n: int, seconds: float) -> None:
    run_recorded(key, n, None, seconds)


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="queue",
    lock_ttl=5,
    lock_on=["key"],
    lock_fair_by=["tenant"],
)
def pg_queue_fair(self: Any, key: str, tenant: str, n: int, seconds: float) -> None:
    """One lock per key; its parked calls served round robin across tenants, each tenant's
    turn to its call of the highest priority."""
    run_recorded(key, n, None, seconds)


@app.task(base=LockedTask, bind=True, on_duplicate="replace", lock_ttl=5, lock_on=["key"])
def pg_replace(self: Any, key: str, n: int, seconds: float) -> None:
    run_recorded(key, n, None, seconds)


@app.task(base=LockedTask, bind=True, on_duplicate="restart", lock_ttl=5, lock_on=["key"])
def pg_restart(self: Any, key: str, n: int, seconds: float) -> None:
    """Looks at its lock's ``cancelled`` every 0.1 s: recorded as ended, then stops."""
    connection = records()
    (row_id,) = connection.execute(
        f"INSERT INTO {SCHEMA}.records (key, n, pid, started) "
        "VALUES (%s, %s, %s, clock_timestamp()) RETURNING id",
        (key, n, os.getpid()),
    ).fetchone() or (0,)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not self.request.lock.cancelled:
        time.sleep(0.1)
    connection.execute(
        f"UPDATE {SCHEMA}.records SET ended = clock_timestamp() WHERE id = %s", (row_id,)
    )
    self.request.lock.raise_if_cancelled()


@app.task(
    base=LockedTask, bind=True, on_duplicate="queue", lock_ttl=3, lock_on=["key"], acks_late=True
)
def pg_queue_late(self: Any, key: str, n: int, seconds: float) -> None:
    run_recorded(key, n, None, seconds)


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="replace",
    lock_debounce=1.0,
    lock_ttl=5,
    lock_on=["key"],
)
def pg_debounced(self: Any, key: str, n: int, seconds: float) -> None:
    run_recorded(key, n, None, seconds)


# -- PostgreSQL outages (the lock server stopped or restarted under running bodies) ----------


def run_watched(task: Any, key: str, n: int, seconds: float) -> None:
    """Record the start, run ``seconds`` (a negative number: until the gate of ``key`` opens,
    at most 120 s) in 0.1 s steps noting when the lease is first seen lost, record the end."""
    connection, lock = records(), task.request.lock
    (row_id,) = connection.execute(
        f"INSERT INTO {SCHEMA}.records (key, n, pid, fence, started) "
        "VALUES (%s, %s, %s, %s, clock_timestamp()) RETURNING id",
        (key, n, os.getpid(), lock.fence),
    ).fetchone() or (0,)
    gated = seconds < 0
    deadline = time.monotonic() + (120.0 if gated else seconds)
    seen = False
    gate = f"SELECT 1 FROM {SCHEMA}.gates WHERE key = %s"
    for _ in range(int((deadline - time.monotonic()) * 10) + 1):
        if lock.lost and not seen:
            seen = True
            connection.execute(
                f"UPDATE {SCHEMA}.records SET lost_seen = clock_timestamp() WHERE id = %s",
                (row_id,),
            )
        if time.monotonic() >= deadline or (gated and connection.execute(gate, (key,)).fetchone()):
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
    lock_ttl=OUTAGE_TTL,
    lock_on=["key"],
    lock_retry_backoff=0.5,
    lock_retry_backoff_max=1.0,
)
def pg_hold(self: Any, key: str, n: int, seconds: float) -> None:
    run_watched(self, key, n, seconds)


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="retry",
    lock_fencing=True,
    lock_ttl=OUTAGE_TTL,
    lock_on=["key"],
    lock_retry_backoff=0.5,
    lock_retry_backoff_max=1.0,
    lock_max_retries=1000,
)
def pg_retry(self: Any, key: str, n: int, seconds: float) -> None:
    run_watched(self, key, n, seconds)


@app.task(
    base=LockedTask,
    bind=True,
    on_duplicate="wait",
    lock_fencing=True,
    lock_ttl=OUTAGE_TTL,
    lock_on=["key"],
    lock_wait_timeout=120,
)
def pg_wait(self: Any, key: str, n: int, seconds: float) -> None:
    run_watched(self, key, n, seconds)
