"""Locks in PostgreSQL beside the Redis backend and the floors: ``python -m bench postgres``.

1. Engine level, alternated call by call (the paired loop): acquire + release of a free lock
   by ``floor`` (Redis ``SET NX PX`` + ``DEL``), ``locked-no-renew`` (the Redis engine),
   ``pg-floor`` (a row ``INSERT ... ON CONFLICT DO NOTHING`` + ``DELETE``, the least a row
   lease can do) and ``postgres`` (``PostgresLocker``). Statements per cycle are counted from
   the client (``Connections.statements``: one statement is one round trip, autocommit).
   The run uses a database of its own (created, then dropped). Server time is not shown:
   ``pg_stat_statements`` is not loaded on the test server, and ``pg_stat_database``'s
   ``active_time``, handed in by a backend as it exits, did not give stable figures here.
2. Worker level (``--worker``): no-op tasks through one in-process solo worker, alternated task
   by task: ``plain``, ``floor``, ``locked`` (LockedTask, locks in the Redis that is also the
   broker) and ``postgres`` (LockedTask, locks in PostgreSQL).

``--pgbouncer URL`` adds ``pgbouncer`` at both levels: ``PostgresLocker`` on the same database
through the PgBouncer at ``URL`` (``postgresql://user@host:port``, in transaction mode, with a
wildcard ``* = host=... port=...`` database entry so the run's own database is reached through
it), alternated with the direct one.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
import time
from typing import Any, Iterator, Optional, Sequence

import redis

from ._builds import EngineSetup, postgres_locker
from ._common import BenchError, delete_matching, med_iqr, median, new_prefix, redis_target
from ._contenders import pick
from ._paired import paired_calls
from ._report import print_requests, print_side_by_side

ENGINE_KEYS = ("floor", "locked-no-renew", "pg-floor", "postgres")
WORKER_KEYS = ("plain", "floor", "locked", "postgres")


def with_pgbouncer(keys: Sequence[str], args: argparse.Namespace) -> tuple[str, ...]:
    """``keys``, and ``pgbouncer`` after ``postgres`` with ``--pgbouncer``."""
    return (*keys, "pgbouncer") if args.pgbouncer else tuple(keys)


@contextlib.contextmanager
def own_database(pgbouncer: Optional[str] = None) -> Iterator[str]:
    """A database of the run's own on the server of ``$CSL_POSTGRES_URL`` (else the local
    one), set as ``$CSL_POSTGRES_URL`` while it lasts (and through the PgBouncer at
    ``pgbouncer``, as ``$CSL_PGBOUNCER_URL``), dropped at the end."""
    import psycopg

    base = os.environ.get("CSL_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
    name = f"csl_bench_{secrets.token_hex(4)}"
    with psycopg.connect(base, autocommit=True, connect_timeout=5) as admin:
        admin.execute(f"CREATE DATABASE {name}")
        url = base.rsplit("/", 1)[0] + f"/{name}"
        before = os.environ.get("CSL_POSTGRES_URL")
        os.environ["CSL_POSTGRES_URL"] = url
        if pgbouncer:
            os.environ["CSL_PGBOUNCER_URL"] = f"{pgbouncer.rstrip('/')}/{name}"
        try:
            yield url
        finally:
            os.environ.pop("CSL_PGBOUNCER_URL", None)
            if before is None:
                os.environ.pop("CSL_POSTGRES_URL", None)
            else:
                os.environ["CSL_POSTGRES_URL"] = before
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def statements_per_cycle(client: redis.Redis, prefix: str) -> float:
    """Statements (= round trips) per acquire + release of the PostgresLocker, counted by its
    own connections over 10 cycles after a first one (which creates the tables)."""
    closers: list[Any] = []
    locker = postgres_locker(f"{prefix}-count", closers)
    try:
        for i in range(11):
            if i == 1:
                sent = locker.connections.statements
            lease = locker.try_acquire(f"count:{i}", 30, renew=False)
            lease.release()
        return (locker.connections.statements - sent) / 10
    finally:
        for close in closers:
            close()


def engine_level(args: argparse.Namespace) -> None:
    prefix = new_prefix()
    keys = with_pgbouncer(ENGINE_KEYS, args)
    with own_database(args.pgbouncer) as url, redis_target() as target:
        client = redis.Redis.from_url(target.url)
        setup = EngineSetup(client, prefix)
        contenders = pick(keys, "engine")
        calls = [c.engine(setup, f"{prefix}:{c.key}") for c in contenders if c.engine]
        try:
            paired = paired_calls(keys, calls, rounds=args.rounds, cycles=args.cycles)
        finally:
            for close in setup.closers:
                close()
        statements = statements_per_cycle(client, prefix)
        delete_matching(client, [f"{prefix}*"])
        client.close()
        print(
            f"acquire + release of a free lock, {args.rounds} rounds x {args.cycles} cycles, "
            f"alternated call by call; redis: {target.description}; PostgreSQL: "
            f"{url.rsplit('@', 1)[-1]} (median over rounds; ratios per round)"
        )
        trips = {
            "floor": "2",
            "locked-no-renew": "2",
            "pg-floor": "2",
            "postgres": f"{statements:g}",
            "pgbouncer": f"{statements:g}",
        }
        for c in contenders:
            us = median(paired.values("wall", c.key))
            cpu = median(paired.values("cpu", c.key))
            line = (
                f"   {c.engine_label:<58}{us:8.1f} us/cycle  client CPU {cpu:6.1f} us  "
                f"{med_iqr(paired.ratios('wall', c.key, 'floor'), '.2f')}x redis floor  "
                f"{trips[c.key]} round trips"
            )
            print(line)
        print(
            "   PostgresLocker vs the PostgreSQL floor: "
            f"{med_iqr(paired.ratios('wall', 'postgres', 'pg-floor'), '.2f')}x; vs the Redis "
            f"engine: {med_iqr(paired.ratios('wall', 'postgres', 'locked-no-renew'), '.2f')}x",
            flush=True,
        )
        if args.pgbouncer:
            print(
                "   PostgresLocker through PgBouncer vs directly: "
                f"{med_iqr(paired.ratios('wall', 'pgbouncer', 'postgres'), '.2f')}x",
                flush=True,
            )


def worker_level(args: argparse.Namespace) -> None:
    from ._worker import run_worker_bench

    with own_database(args.pgbouncer):
        keys = with_pgbouncer(WORKER_KEYS, args)
        lane, paired, _ = run_worker_bench("postgres", keys, args, args.tasks)
    print_side_by_side(paired, lane)
    print_requests(paired, lane)
    print(
        "   (postgres: its lock requests go to PostgreSQL, 2 statements per task, not counted "
        "above)"
    )


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench postgres", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="5 rounds x 100 cycles")
    parser.add_argument("--rounds", type=int, help="engine rounds (15; --quick 5)")
    parser.add_argument("--cycles", type=int, help="engine cycles per round (300; --quick 100)")
    parser.add_argument("--worker", action="store_true", help="also the worker-level run")
    parser.add_argument("--tasks", type=int, help="worker tasks per contender and round (500)")
    parser.add_argument(
        "--pgbouncer",
        metavar="URL",
        help="also through the PgBouncer at URL (transaction mode, a '*' database entry)",
    )
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=9)
    args = parser.parse_args(list(argv))
    args.rounds = args.rounds or (5 if args.quick else 15)
    args.cycles = args.cycles or (100 if args.quick else 300)
    args.tasks = args.tasks or (200 if args.quick else 500)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        import psycopg  # noqa: F401
    except ImportError:
        print("postgres benchmark: psycopg is not installed (extra [postgres])", file=sys.stderr)
        return 1
    started = time.perf_counter()
    try:
        engine_level(args)
        if args.worker:
            worker_level(args)
    except BenchError as exc:
        print(f"postgres benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    return 0
