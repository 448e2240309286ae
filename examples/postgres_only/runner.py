"""Run the no-Redis example: RabbitMQ as the broker, PostgreSQL for the locks and the data.

    python -m examples.postgres_only --accounts 3 --updates 60
    python -m examples.postgres_only --broker-url amqp://guest:guest@rabbit:5672// \\
        --database-url postgresql://app@db:5432/app

Starts 2 real ``celery worker`` processes given no Redis URL at all, sends random deposits and
withdrawals (fenced, one lock per account) and, like two beats, each tick of a ~2 s report job
twice every 0.5 s (skipped while it runs). Every table, lock row and the queue of the run are
in a schema and a queue of its own, dropped at the end. Prints a summary, then one JSON line.
Exit code 0 when every update was applied exactly once and no two reports overlapped, 1 when
not, 2 when it could not run (no PostgreSQL or RabbitMQ: it says which).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from examples.common import (
    ChildDied,
    Supervisor,
    Terminated,
    delete_queue,
    redact,
    terminate_as_exception,
    worker_command,
)

APP = "examples.postgres_only.app"
DEFAULT_BROKER = "amqp://guest:guest@127.0.0.1:5672//"
DEFAULT_DATABASE = "postgresql://postgres@127.0.0.1:5432/test"

TABLES = (
    "CREATE TABLE accounts (id integer PRIMARY KEY, balance bigint NOT NULL, fence bigint)",
    "CREATE TABLE applied (task_id text PRIMARY KEY, account_id integer NOT NULL, "
    "cents bigint NOT NULL, fence bigint, at timestamptz NOT NULL)",
    "CREATE TABLE runs (id bigserial PRIMARY KEY, task_id text, pid integer, "
    "started timestamptz NOT NULL, ended timestamptz)",
    "CREATE TABLE skipped (id bigserial PRIMARY KEY)",
    "CREATE TABLE workers (name text)",
)


class Unreachable(RuntimeError):
    """PostgreSQL or RabbitMQ does not answer."""


@dataclass
class Options:
    accounts: int = 3
    updates: int = 60
    workers: int = 2
    concurrency: int = 2
    work_ms: float = 5.0
    report_seconds: float = 2.0
    ticks: int = 12  # ticks of the report job, every 0.5 s, each sent twice
    seed: Optional[int] = None
    timeout: float = 180.0
    broker_url: str = DEFAULT_BROKER
    database_url: str = DEFAULT_DATABASE


@dataclass
class Report:
    options: Options
    seconds: float
    expected: dict[int, int]
    actual: dict[int, int]
    applied: int
    fences_in_order: bool
    report_runs: int
    report_overlaps: int
    skipped: int
    notes: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.applied == self.options.updates and self.expected == self.actual

    @property
    def ok(self) -> bool:
        return self.exact and self.fences_in_order and self.report_overlaps == 0

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def text(self) -> str:
        o = self.options
        lines = [
            f"postgres_only: broker {redact(o.broker_url)}, locks and data in "
            f"{redact(o.database_url)}, no Redis; {o.workers} workers x {o.concurrency}",
            f"  updates: {o.updates} on {o.accounts} accounts in {self.seconds:.1f}s, "
            f"{self.applied} applied",
            "  account     expected       actual",
        ]
        for account in sorted(self.expected):
            mark = "" if self.expected[account] == self.actual.get(account) else "  <- wrong"
            lines.append(
                f"  {account:7d} {self.expected[account]:12d} {self.actual.get(account, 0):12d}"
                f"{mark}"
            )
        lines += [
            "  fences of each account increase in the order its updates were applied"
            if self.fences_in_order
            else "  FENCES OUT OF ORDER",
            f"  report job: {self.report_runs} runs, {self.skipped} ticks skipped, "
            f"{self.report_overlaps} overlaps",
        ]
        lines += [f"  note: {note}" for note in self.notes]
        lines.append("  OK" if self.ok else "  FAILED")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "example": "postgres_only",
            "ok": self.ok,
            "exact": self.exact,
            "updates": self.options.updates,
            "applied": self.applied,
            "wrong_accounts": sum(
                1 for a in self.expected if self.expected[a] != self.actual.get(a)
            ),
            "fences_in_order": self.fences_in_order,
            "report_runs": self.report_runs,
            "report_overlaps": self.report_overlaps,
            "skipped": self.skipped,
            "seconds": round(self.seconds, 2),
            "options": {
                k: redact(v) if k.endswith("_url") else v for k, v in asdict(self.options).items()
            },
        }


def reachable(options: Options) -> None:
    """Raise ``Unreachable`` naming the server that does not answer."""
    import psycopg
    from kombu import Connection

    try:
        psycopg.connect(options.database_url, connect_timeout=3).close()
    except psycopg.Error as exc:
        raise Unreachable(f"no PostgreSQL at {redact(options.database_url)}: {exc}") from None
    with Connection(options.broker_url, connect_timeout=3) as conn:
        try:
            conn.ensure_connection(max_retries=1)
        except Exception as exc:  # noqa: BLE001  (kombu raises many kinds)
            raise Unreachable(f"no broker at {redact(options.broker_url)}: {exc}") from None


def run(options: Options) -> Report:
    """Create the run's schema, start the workers, send the work, wait, stop, check."""
    import psycopg
    from celery import Celery

    from examples.postgres_only.app import APPLY, REPORT

    reachable(options)
    schema = f"pgonly_{uuid.uuid4().hex[:8]}"
    admin = psycopg.connect(options.database_url, autocommit=True, connect_timeout=5)
    work_dir = Path(tempfile.mkdtemp(prefix=f"csl-{schema}-"))
    supervisor = Supervisor(work_dir)
    client = Celery("postgres_only-client", set_as_current=False)
    client.conf.update(broker_url=options.broker_url, broker_connection_retry_on_startup=True)
    ok = False
    try:
        admin.execute(f"CREATE SCHEMA {schema}")
        admin.execute(f"SET search_path TO {schema}")
        for statement in TABLES:
            admin.execute(statement)
        with admin.cursor() as cur:
            cur.executemany(
                "INSERT INTO accounts (id, balance) VALUES (%s, 0)",
                [(a,) for a in range(1, options.accounts + 1)],
            )
        # no REDIS_URL, no redis:// setting: the workers get these and nothing else of ours
        env = {k: v for k, v in os.environ.items() if "REDIS" not in k.upper()}
        env.update(
            CELERY_BROKER_URL=options.broker_url,
            DATABASE_URL=options.database_url,
            EXAMPLE_SCHEMA=schema,
            EXAMPLE_WORK_MS=str(options.work_ms),
            EXAMPLE_REPORT_SECONDS=str(options.report_seconds),
        )
        workers = [
            supervisor.start(
                f"worker-{i}",
                worker_command(
                    APP,
                    f"{schema}-w{i}@%h",
                    pool="prefork",
                    concurrency=options.concurrency,
                    loglevel="INFO",
                ),
                env,
            )
            for i in range(1, options.workers + 1)
        ]
        wait(
            lambda: count(admin, "workers") >= options.workers,
            supervisor,
            90,
            "the workers to start",
        )
        began = time.monotonic()
        rng = random.Random(options.seed)
        expected = dict.fromkeys(range(1, options.accounts + 1), 0)
        for _ in range(options.updates):
            account, cents = rng.randint(1, options.accounts), rng.randint(-5000, 5000)
            expected[account] += cents
            client.send_task(APPLY, args=[account, cents], queue=schema)
        for _ in range(options.ticks):  # two beats: each tick sent twice
            for _beat in range(2):
                client.send_task(REPORT, queue=schema)
            time.sleep(0.5)
        wait(
            lambda: (
                count(admin, "applied") >= options.updates
                and count(admin, "runs") == count(admin, "runs WHERE ended IS NOT NULL")
            ),
            supervisor,
            options.timeout,
            f"{options.updates} updates to be applied",
        )
        seconds = time.monotonic() - began
        supervisor.stop(workers, timeout=options.report_seconds + 10)
        report = check(admin, options, expected, seconds)
        ok = report.ok
        return report
    finally:
        supervisor.stop(timeout=3)
        admin.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.close()
        delete_queue(options.broker_url, schema)
        client.close()
        if ok:
            shutil.rmtree(work_dir, ignore_errors=True)
        else:
            print(f"logs kept in {work_dir}", file=sys.stderr)


def count(admin: Any, table: str) -> int:
    row = admin.execute(f"SELECT count(*) FROM {table}").fetchone()
    return int(row[0])


def wait(done: Any, supervisor: Supervisor, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not done():  # bounded by the deadline
        supervisor.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g}s for {what}")
        time.sleep(0.2)


def check(admin: Any, options: Options, expected: dict[int, int], seconds: float) -> Report:
    actual = {int(a): int(b) for a, b in admin.execute("SELECT id, balance FROM accounts")}
    rows = admin.execute("SELECT account_id, fence FROM applied ORDER BY at").fetchall()
    fences: dict[int, list[int]] = {}
    for account, fence in rows:
        fences.setdefault(int(account), []).append(int(fence))
    in_order = all(all(a < b for a, b in zip(f, f[1:])) for f in fences.values())
    runs = admin.execute("SELECT started, ended FROM runs ORDER BY started").fetchall()
    overlaps = sum(1 for before, after in zip(runs, runs[1:]) if after[0] < before[1])
    return Report(
        options=options,
        seconds=seconds,
        expected=expected,
        actual=actual,
        applied=len(rows),
        fences_in_order=in_order,
        report_runs=len(runs),
        report_overlaps=overlaps,
        skipped=count(admin, "skipped"),
        notes=[] if runs else ["the report job never ran: see the worker logs"],
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m examples.postgres_only", description=__doc__.split("\n\n")[0]
    )
    d = Options()
    p.add_argument("--accounts", type=int, default=d.accounts)
    p.add_argument("--updates", type=int, default=d.updates)
    p.add_argument("--workers", type=int, default=d.workers)
    p.add_argument("--concurrency", type=int, default=d.concurrency)
    p.add_argument("--work-ms", type=float, default=d.work_ms, help="between read and write")
    p.add_argument("--ticks", type=int, default=d.ticks, help="report ticks, every 0.5 s")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--timeout", type=float, default=d.timeout)
    p.add_argument("--broker-url", default=os.environ.get("CELERY_BROKER_URL") or DEFAULT_BROKER)
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL") or DEFAULT_DATABASE)
    # accepted for the shape of the other runners; this one draws no progress bar
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=False)
    return p


def options_from(args: argparse.Namespace) -> Options:
    return Options(
        accounts=args.accounts,
        updates=args.updates,
        workers=args.workers,
        concurrency=args.concurrency,
        work_ms=args.work_ms,
        ticks=args.ticks,
        seed=args.seed,
        timeout=args.timeout,
        broker_url=args.broker_url,
        database_url=args.database_url,
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    import json

    options = options_from(parser().parse_args(argv))
    with terminate_as_exception():
        try:
            report = run(options)
        except KeyboardInterrupt:
            print("interrupted: every process was stopped", file=sys.stderr)
            return 130
        except Terminated as exc:
            print("terminated: every process was stopped", file=sys.stderr)
            return int(exc.code or 1)
        except (Unreachable, ChildDied, TimeoutError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
    print(report.text())
    print(json.dumps(report.as_json()), flush=True)
    return report.exit_code
