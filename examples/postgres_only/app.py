"""No Redis anywhere: RabbitMQ is the broker, PostgreSQL holds the locks and the data.

``apply_delta`` reads an account's balance and writes balance + cents, one lock per account
(``lock_on``), a busy account's update retried (``on_duplicate="retry"``). Its write is fenced
in its own transaction (``fenced_update``): the account row carries the fence of the last
holder that wrote it, and the database refuses the write of an older holder, whose lock ran
out while it stalled. ``rebuild_report`` is a beat-style job: a tick that finds it running is
skipped.

Settings come from the environment: ``CELERY_BROKER_URL`` (AMQP), ``DATABASE_URL`` (a
``postgresql://`` URL), ``EXAMPLE_SCHEMA`` (the schema of this run's locks and tables),
``EXAMPLE_WORK_MS`` and ``EXAMPLE_REPORT_SECONDS``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg
from celery import Celery
from celery.signals import worker_ready

from celery_singleton_lock import LockedTask, StaleFenceError, lock_duplicate
from celery_singleton_lock.contrib.fencing.psycopg import fenced_update

BROKER_URL = os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
DATABASE_URL = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
SCHEMA = os.environ.get("EXAMPLE_SCHEMA", "postgres_only")
WORK_SECONDS = float(os.environ.get("EXAMPLE_WORK_MS", "5")) / 1000.0
REPORT_SECONDS = float(os.environ.get("EXAMPLE_REPORT_SECONDS", "2"))
APPLY = "examples.postgres_only.apply_delta"
REPORT = "examples.postgres_only.rebuild_report"


def lock_url(database_url: str, schema: str) -> str:
    """The lock server: the same database, the lock tables in ``schema``."""
    return f"{database_url}{'&' if '?' in database_url else '?'}schema={schema}"


app = Celery("postgres_only")
app.conf.update(
    broker_url=BROKER_URL,
    # --8<-- [start:settings]
    singleton_lock_url=lock_url(DATABASE_URL, SCHEMA),  # the locks live in PostgreSQL
    # --8<-- [end:settings]
    singleton_lock_prefix=SCHEMA,
    task_default_queue=SCHEMA,
    task_ignore_result=True,  # no result backend: nothing to store results in but the broker
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
)

_connections: dict[int, psycopg.Connection[Any]] = {}


def db() -> psycopg.Connection[Any]:
    """This process's connection (a prefork child opens its own), in the run's schema."""
    connection = _connections.get(os.getpid())
    if connection is None or connection.closed:
        connection = _connections[os.getpid()] = psycopg.connect(
            DATABASE_URL, autocommit=True, options=f"-c search_path={SCHEMA}"
        )
    return connection


# --8<-- [start:task]
@app.task(
    bind=True,
    name=APPLY,
    base=LockedTask,
    lock_on=("account_id",),  # one lock per account: other accounts run in parallel
    on_duplicate="retry",  # a busy account: retry the update shortly
    lock_retry_backoff=0.05,
    lock_retry_backoff_max=0.5,
    lock_max_retries=None,  # until the account is free
    lock_fencing=True,  # self.request.lock.fence: strictly increasing
    autoretry_for=(StaleFenceError,),  # a refused write: retried with a new lock and fence
    max_retries=5,
    default_retry_delay=0.1,
)
def apply_delta(self: Any, account_id: int, cents: int) -> str:
    conn = db()
    with conn.transaction():  # the read, the fenced write and the record: one transaction
        if conn.execute("SELECT 1 FROM applied WHERE task_id = %s", [self.request.id]).fetchone():
            return "already applied"  # a redelivered message: applied once
        (balance,) = conn.execute(
            "SELECT balance FROM accounts WHERE id = %s FOR UPDATE", [account_id]
        ).fetchone() or (0,)
        time.sleep(WORK_SECONDS)  # the window an unlocked concurrent update would be lost in
        fenced_update(
            conn, "accounts", {"id": account_id}, {"balance": balance + cents},
            self.request.lock.fence,
        )  # fmt: skip
        conn.execute(
            "INSERT INTO applied (task_id, account_id, cents, fence, at) "
            "VALUES (%s, %s, %s, %s, clock_timestamp())",
            [self.request.id, account_id, cents, self.request.lock.fence],
        )
    return "applied"


@app.task(bind=True, name=REPORT, base=LockedTask, on_duplicate="skip", lock_ttl=30)
def rebuild_report(self: Any) -> None:
    conn = db()
    (run,) = conn.execute(
        "INSERT INTO runs (task_id, pid, started) VALUES (%s, %s, clock_timestamp()) RETURNING id",
        [self.request.id, os.getpid()],
    ).fetchone() or (0,)
    time.sleep(REPORT_SECONDS)
    conn.execute("UPDATE runs SET ended = clock_timestamp() WHERE id = %s", [run])


# --8<-- [end:task]


def count_skips(sender: Any = None, action: str = "?", **_: Any) -> None:
    """``lock_duplicate`` receiver: a tick that found the report running."""
    if getattr(sender, "name", None) == REPORT and action == "skip":
        db().execute("INSERT INTO skipped DEFAULT VALUES")


lock_duplicate.connect(count_skips, weak=False)


def announce(sender: Any = None, **_: Any) -> None:
    db().execute("INSERT INTO workers (name) VALUES (%s)", [getattr(sender, "hostname", "?")])


worker_ready.connect(announce, weak=False)
