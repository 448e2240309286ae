"""Queue benchmark: per-key throughput of ``on_duplicate="queue"`` vs ``retry`` vs ``wait``.

``python -m bench queue [--quick]``. Throwaway servers on loopback (whatever ``$REDIS_URL``
says): a broker and a lock server (which also holds the bodies' records). ONE real ``celery
worker`` process (prefork, ``--concurrency`` 4, ``worker_prefetch_multiplier=1``;
``tests/celery/workers.py``) runs ``bench/_queueapp.py``: the same body (sleeps S seconds,
records its start and end) under four policies:

- ``queue``: a duplicate parks its message and ends; the release hands the lock on;
- ``retry``: lock retries with the default backoff (``lock_retry_backoff=1.0``, max 60 s), as
  a user who sets nothing gets;
- ``retry 0.05/0.5``: lock retries tuned (backoff 0.05 s, max 0.5 s);
- ``wait``: the duplicate holds its worker slot until the release (``lock_wait_timeout=900``).

Scenarios: N identical calls on ONE key (N=40, S=0.05 s and N=10, S=0.5 s), and 4 keys at once
(10 calls of 0.5 s each, sent key after key) on the same 4-slot worker. Each round runs every
scenario, and within it every policy in turn (order rotated every round), on keys of its own;
a batch is all calls sent at once (``send_task``, no worker idle time in between), and ends
when every body has run and no lock or parked list is left. Figures per batch: total time
(first send to last body end), calls/s per key, total over the summed body time (N x S, the
floor when one key runs one call at a time), slot-seconds held without running a body (slot
time, ``task_prerun`` to ``task_postrun`` of every execution, minus body time), lock retries
sent, waiters, calls parked; and checks: each call ran exactly once, no two bodies of a key
overlapped. Medians over rounds; ratios to ``queue`` are taken per round.
"""

from __future__ import annotations

import argparse
import contextlib
import secrets
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import redis
from celery import Celery

from celery_singleton_lock.testing import RedisServer

from ._common import (
    BenchError,
    fill_defaults,
    med_iqr,
    median,
    new_prefix,
    server_version,
    stop_workers,
    text,
    versions,
)
from ._paired import rotated, run_rounds

APP = "bench._queueapp"
POLL = 0.01  # seconds between two looks at the records
#: Seconds a batch may take at most (the default retry backoff reaches 60 s per retry).
BATCH_DEADLINE = 900.0
#: Seconds the lock and parked lists may take to go after the last body ended.
SETTLE = 10.0


@dataclass(frozen=True)
class Policy:
    key: str  # task name suffix in bench/_queueapp.py
    label: str


POLICIES = [
    Policy("queue", "queue"),
    Policy("retry_tuned", "retry 0.05/0.5"),
    Policy("wait", "wait"),
    Policy("retry", "retry (defaults 1/60)"),
]


@dataclass(frozen=True)
class Scenario:
    keys: int
    calls: int  # per key
    seconds: float  # body

    @property
    def label(self) -> str:
        where = "one key" if self.keys == 1 else f"{self.keys} keys at once"
        return f"{where}: {self.calls} calls x {self.seconds} s"

    @property
    def floor(self) -> float:
        """Summed body time of one key: the least time a key's calls take one at a time."""
        return self.calls * self.seconds


@dataclass
class Batch:
    total: float  # first send to last body end
    calls_per_s: float  # per key: calls / total
    slot_idle: float  # slot-seconds held without running a body
    executions: int
    duplicates: Dict[str, int]
    first_start: float  # latest first body start over the keys (starvation), from first send
    slowest_key: float  # latest last body end over the keys, from first send
    in_order: int  # keys whose calls ran in sending order


@dataclass
class Result:
    policy: Policy
    batches: List[Batch] = field(default_factory=list)


def send_batch(client: Celery, queue: str, policy: Policy, batch: str, scenario: Scenario) -> None:
    """All calls at once, key after key (the calls of key 0, then key 1...)."""
    with client.producer_or_acquire() as producer:
        for k in range(scenario.keys):
            for index in range(scenario.calls):
                client.send_task(
                    f"bench_queue.{policy.key}",
                    args=(batch, f"{batch}-k{k}", index, scenario.seconds),
                    queue=queue,
                    producer=producer,
                )


def leftovers(store: redis.Redis, batch: str) -> List[bytes]:
    """Locks and parked lists of ``batch`` still in Redis (finish records do not count)."""
    return [
        key
        for key in store.scan_iter(f"singleton-lock:*{batch}*", count=1000)
        if key.endswith((b"}", b"}:parked", b"}:parked-messages"))
    ]


def run_batch(
    client: Celery, store: redis.Redis, queue: str, policy: Policy, scenario: Scenario
) -> Batch:
    batch = secrets.token_hex(4)
    keys = [f"{batch}-k{k}" for k in range(scenario.keys)]
    wanted = scenario.keys * scenario.calls
    began = time.time()
    send_batch(client, queue, policy, batch, scenario)
    deadline = time.monotonic() + BATCH_DEADLINE
    while sum(store.llen(f"qb:{batch}:runs:{key}") for key in keys) < wanted:
        if time.monotonic() > deadline:
            raise BenchError(f"{policy.key}: not every call ran within {BATCH_DEADLINE:.0f} s")
        time.sleep(POLL)
    settle = time.monotonic() + SETTLE
    while leftovers(store, batch):
        if time.monotonic() > settle:
            raise BenchError(f"{policy.key}: left in Redis: {leftovers(store, batch)}")
        time.sleep(POLL)
    time.sleep(0.2)  # the last executions' task_postrun records
    starts, ends, body_time, in_order = [], [], 0.0, 0
    for key in keys:
        runs = [text(r).split("|") for r in store.lrange(f"qb:{batch}:runs:{key}", 0, -1)]
        indices = [int(run[0]) for run in runs]
        if sorted(indices) != list(range(scenario.calls)):
            raise BenchError(f"{policy.key}: key {key} ran {sorted(indices)}, not each call once")
        in_order += indices == list(range(scenario.calls))
        starts.append(min(float(run[1]) for run in runs) - began)
        ends.append(max(float(run[2]) for run in runs) - began)
        body_time += sum(float(run[2]) - float(run[1]) for run in runs)
    overlaps = int(store.get(f"qb:{batch}:overlaps") or 0)
    if overlaps:
        raise BenchError(f"{policy.key}: {overlaps} bodies started while another of their key ran")
    total = max(ends)
    duplicates = {text(k): int(v) for k, v in store.hgetall(f"qb:{batch}:duplicates").items()}
    batch_keys = list(store.scan_iter(f"qb:{batch}:*", count=1000))
    slot = float(store.get(f"qb:{batch}:slot") or 0)
    executions = int(store.get(f"qb:{batch}:executions") or 0)
    if batch_keys:
        store.delete(*batch_keys)
    return Batch(
        total=total,
        calls_per_s=scenario.calls / total,
        slot_idle=slot - body_time,
        executions=executions,
        duplicates=duplicates,
        first_start=max(starts),
        slowest_key=max(ends),
        in_order=in_order,
    )


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench queue", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="1 round (~2 min)")
    parser.add_argument("--rounds", type=int, help="rounds (default 3; --quick 1)")
    parser.add_argument("--concurrency", type=int, default=4, help="prefork children (4)")
    parser.add_argument(
        "--only",
        help="comma-separated policies among " + ",".join(p.key for p in POLICIES),
    )
    args = parser.parse_args(list(argv))
    fill_defaults(parser, args, {"rounds": (1, 3)}, ("rounds", "concurrency"))
    if args.only:
        known = {p.key for p in POLICIES}
        wanted = args.only.split(",")
        if not set(wanted) <= known:
            parser.error(f"--only: unknown policy among {wanted}")
    return args


SCENARIOS = [Scenario(1, 40, 0.05), Scenario(1, 10, 0.5), Scenario(4, 10, 0.5)]


def _duplicates(batches: List[Batch], action: str) -> str:
    return f"{median([b.duplicates.get(action, 0) for b in batches]):.0f}"


def report(results: Dict[Scenario, List[Result]], args: argparse.Namespace, took: float) -> None:
    print(
        f"\nONE worker, prefork -c {args.concurrency}, prefetch 1; {args.rounds} round(s), "
        "policies in rotated order; medians over rounds [IQR of per-round ratios]"
    )
    for scenario, per_policy in results.items():
        queue = next((r for r in per_policy if r.policy.key == "queue"), None)
        print(f"\n{scenario.label} (summed body time per key {scenario.floor:.1f} s)")
        header = (
            f"   {'policy':<22} {'total s':>8} {'calls/s/key':>11} {'x floor':>8} "
            f"{'x queue':>22} {'idle slot-s':>11} {'execs':>6} {'retries':>7} {'waiters':>7} "
            f"{'parked':>6} {'in order':>8}"
        )
        if scenario.keys > 1:
            header += f" {'last key starts':>15}"
        print(header)
        for result in per_policy:
            b = result.batches
            total = median([x.total for x in b])
            if queue is not None and queue.batches:
                vs_queue = med_iqr([x.total / q.total for x, q in zip(b, queue.batches)], ".2f")
            else:
                vs_queue = "-"
            line = (
                f"   {result.policy.label:<22} {total:>8.2f} "
                f"{median([x.calls_per_s for x in b]):>11.2f} {total / scenario.floor:>8.2f} "
                f"{vs_queue:>22} {median([x.slot_idle for x in b]):>11.2f} "
                f"{median([x.executions for x in b]):>6.0f} {_duplicates(b, 'retry'):>7} "
                f"{_duplicates(b, 'wait'):>7} {_duplicates(b, 'queue'):>6} "
                f"{median([x.in_order for x in b]):>5.0f}/{scenario.keys:<2}"
            )
            if scenario.keys > 1:
                line += f" {median([x.first_start for x in b]):>13.2f} s"
            print(line)
    print(
        "\n   total: first send to last body end; calls/s/key: calls per key / total; x floor: "
        "total / summed body\n   time of one key (calls x S); x queue: per-round ratio of "
        "totals; idle slot-s: worker slot-seconds\n   held without running a body (every "
        "execution's task_prerun..task_postrun, minus body time);\n   execs: executions "
        "(bodies + duplicates' visits); retries: lock retries sent; waiters: duplicates\n   "
        "that waited; parked: duplicates parked; in order: keys whose calls ran in sending "
        "order;\n   last key starts: seconds from the first send to the first body of the key "
        "that started last.\n   Every batch checked: each call ran exactly once, no two bodies "
        "of a key overlapped, no lock\n   or parked list left."
    )
    print(f"\ndone in {took:.1f} s")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from tests.celery.workers import Servers, WorkerGroup, unique

    policies = [p for p in POLICIES if not args.only or p.key in args.only.split(",")]
    results: Dict[Scenario, List[Result]] = {s: [Result(p) for p in policies] for s in SCENARIOS}
    began = time.perf_counter()
    try:
        with contextlib.ExitStack() as stack:
            broker_server = stack.enter_context(RedisServer.running())
            lock_server = stack.enter_context(RedisServer.running())
            store = lock_server.client()
            print(
                f"queue benchmark: redis {server_version(store)}, "
                f"{versions('celery', 'redis')}; broker and locks on throwaway redis-servers of "
                "their own",
                flush=True,
            )
            servers = Servers(
                broker_url=broker_server.url, lock=lock_server, backend_url=broker_server.url
            )
            group = WorkerGroup(servers)
            queue = unique("queuebench")
            client = Celery(new_prefix(), broker=broker_server.url)
            client.conf.broker_connection_retry_on_startup = True

            def measure(index: int) -> None:
                for scenario in SCENARIOS:
                    figures = []
                    for result in rotated(results[scenario], index):
                        batch = run_batch(client, store, queue, result.policy, scenario)
                        result.batches.append(batch)
                        figures.append(f"{result.policy.label} {batch.total:.2f} s")
                    print(
                        f"   round {index + 1}/{args.rounds}, {scenario.label}: "
                        + ", ".join(figures),
                        flush=True,
                    )

            try:
                group.start(1, queue=queue, pool="prefork", concurrency=args.concurrency, app=APP)
                for policy in policies:  # unmeasured: imports, connections, scripts
                    run_batch(client, store, queue, policy, Scenario(1, 4, 0.01))
                run_rounds(measure, args.rounds)
            finally:
                stop_workers(group, failed=sys.exc_info()[0] is not None)
                client.close()
    except BenchError as exc:
        print(f"queue benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    report(results, args, time.perf_counter() - began)
    return 0
