"""Cluster benchmark: throughput of 2 workers whose locks are on a 3-primary Redis Cluster vs on
one Redis server, side by side in one run.

``python -m bench cluster [--quick]``. Throwaway servers on loopback: a broker (plain
``redis-server``), a single lock server, and a Redis Cluster of 3 primaries (the test suite's
``tests/cluster_topology.py``). Two pairs of real ``celery worker`` processes (prefork,
``--concurrency`` each; ``tests/celery/workers.py``) run ``bench/_clusterapp.py``: a no-op
``LockedTask`` locked on its argument, ``acks_late``. One pair's lock URL is the single server,
the other's the URL of one cluster node (the workers find out it is a cluster). Both pairs stay
up for the whole run, consuming nothing between batches.

Each round, for each lock server in turn (order rotated every round): ``--tasks`` tasks with
distinct arguments are queued while no worker consumes their queue, then both workers of that
pair are told to consume it (``add_consumer``, remote control); the batch ends when the queue
is empty and nothing is left unacknowledged (polled every 5 ms). tasks/s = tasks / that time.
The ratio cluster / single is taken per round (same machine weather), median over rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import redis
from celery import Celery
from redis.cluster import RedisCluster

from celery_singleton_lock.testing import RedisServer

from ._common import (
    BenchError,
    fill_defaults,
    med_iqr,
    median,
    new_prefix,
    server_version,
    stop_workers,
    versions,
)
from ._paired import rotated, run_rounds

APP = "bench._clusterapp"
TASK = "bench_cluster.noop"
POLL = 0.005  # seconds between two looks at the queue
SETTLE = 2.0  # seconds messages taken after a consumer was cancelled may take to come back


@dataclass
class Target:
    key: str
    label: str
    url: str
    workers: Any = None  # tests.celery.workers.WorkerGroup
    names: List[str] = field(default_factory=list)  # worker node names
    tasks_per_s: List[float] = field(default_factory=list)
    lock_keys: Any = None  # callable: lock keys left on its server


def lock_servers_env(broker_url: str, lock: RedisServer, lock_url: str) -> Any:
    """The workers' servers: broker on ``broker_url``, locks at ``lock_url``."""
    from tests.celery.workers import Servers

    @dataclass
    class LockAt(Servers):
        lock_url: str = ""

        def env(self, queue: str, **extra: str) -> dict[str, str]:
            return super().env(queue, CSL_LOCK_URL=self.lock_url, **extra)

    return LockAt(broker_url=broker_url, lock=lock, backend_url=broker_url, lock_url=lock_url)


def start_workers(target: Target, servers: Any, concurrency: int) -> None:
    from tests.celery.workers import WorkerGroup

    target.workers = WorkerGroup(servers)
    started = target.workers.start(
        2, queue=f"idle-{target.key}", pool="prefork", concurrency=concurrency, app=APP
    )
    target.names = [worker.name for worker in started]


def run_batch(
    client: Celery, broker: redis.Redis, target: Target, first_arg: int, tasks: int
) -> float:
    """Queue ``tasks`` calls, let ``target``'s workers drain them; tasks/s."""
    queue = f"work-{target.key}"
    with client.producer_or_acquire() as producer:
        for i in range(first_arg, first_arg + tasks):
            client.send_task(TASK, args=(i,), queue=queue, producer=producer)
    # a worker whose consumer of this queue was cancelled while its BRPOP was waiting gets a
    # message or two after the cancel and pushes them back ("Requeuing undeliverable
    # message"): give them a moment to come back before counting
    settle = time.monotonic() + SETTLE
    while broker.llen(queue) != tasks and time.monotonic() < settle:
        time.sleep(POLL)
    if broker.llen(queue) != tasks:
        raise BenchError(f"{target.key}: {broker.llen(queue)} queued, {tasks} sent")
    deadline = time.monotonic() + max(60.0, tasks / 20)
    started = time.perf_counter()
    client.control.add_consumer(queue, destination=target.names, reply=True, timeout=5)
    while broker.llen(queue) or broker.hlen("unacked"):
        if time.monotonic() > deadline:
            raise BenchError(f"{target.key}: {broker.llen(queue)} tasks left after the deadline")
        time.sleep(POLL)
    took = time.perf_counter() - started
    client.control.cancel_consumer(queue, destination=target.names, reply=True, timeout=5)
    return tasks / took


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench cluster", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="3 rounds of 500 tasks (~1 min)")
    parser.add_argument("--rounds", type=int, help="rounds (default 5; --quick 3)")
    parser.add_argument("--tasks", type=int, help="tasks per server and round (2000; 500)")
    parser.add_argument("--warmup", type=int, default=200, help="unmeasured tasks first (200)")
    parser.add_argument("--concurrency", type=int, default=2, help="prefork children (2)")
    args = parser.parse_args(list(argv))
    fill_defaults(
        parser,
        args,
        {"rounds": (3, 5), "tasks": (500, 2000)},
        ("rounds", "tasks", "warmup", "concurrency"),
    )
    return args


def report(targets: List[Target], args: argparse.Namespace, took: float) -> None:
    single, cluster = targets
    ratios = [c / s for c, s in zip(cluster.tasks_per_s, single.tasks_per_s)]
    print(
        f"\n2 workers x prefork {args.concurrency}, {args.tasks} no-op LockedTask calls (distinct "
        f"arguments) per server and round, {len(ratios)} rounds, medians over rounds"
    )
    print(f"   {'lock server':<32} {'tasks/s':>7} {'rounds':>s}")
    for target in targets:
        rounds = " ".join(f"{t:.0f}" for t in target.tasks_per_s)
        print(f"   {target.label:<32} {median(target.tasks_per_s):>7.0f}  {rounds}")
    print(f"   cluster / single server: {med_iqr(ratios, '.3f')}x (per-round ratios of tasks/s)")
    print(f"\ndone in {took:.1f} s")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from tests.cluster_topology import ClusterGroup  # the test suite's own topology helper

    began = time.perf_counter()
    targets: List[Target] = []
    try:
        with contextlib.ExitStack() as stack:
            broker_server = stack.enter_context(RedisServer.running())
            single = stack.enter_context(RedisServer.running())
            group = stack.enter_context(ClusterGroup.running())
            broker = broker_server.client()
            nodes = RedisCluster.from_url(group.url)
            primaries = len(nodes.get_primaries())  # type: ignore[no-untyped-call]
            print(
                f"cluster benchmark: redis {server_version(broker)}, "
                f"{versions('celery', 'redis')}; broker on its own redis-server; locks on one "
                f"redis-server vs a Redis Cluster of {primaries} primaries",
                flush=True,
            )
            targets = [
                Target("single", "one redis-server", single.url),
                Target("cluster", "Redis Cluster, 3 primaries", group.url),
            ]
            # the locks themselves (``P:{name}``), not the ``:finished:`` records of acks_late
            targets[0].lock_keys = lambda: list(single.client().scan_iter("singleton-lock*}"))
            targets[1].lock_keys = lambda: list(nodes.scan_iter("singleton-lock*}"))
            client = Celery(new_prefix(), broker=broker_server.url)
            client.conf.broker_connection_retry_on_startup = True
            try:
                for target in targets:
                    servers = lock_servers_env(broker_server.url, single, target.url)
                    start_workers(target, servers, args.concurrency)
                arg = 0
                for target in targets:  # unmeasured: imports, connections, scripts, slot maps
                    run_batch(client, broker, target, arg, args.warmup)
                    arg += args.warmup

                def measure(index: int) -> None:
                    nonlocal arg
                    figures: Dict[str, float] = {}
                    for target in rotated(targets, index):
                        figures[target.key] = run_batch(client, broker, target, arg, args.tasks)
                        arg += args.tasks
                        target.tasks_per_s.append(figures[target.key])
                    print(
                        f"   round {index + 1}/{args.rounds}: "
                        + ", ".join(f"{k} {v:.0f} tasks/s" for k, v in figures.items()),
                        flush=True,
                    )

                run_rounds(measure, args.rounds)
                for target in targets:
                    left = target.lock_keys()
                    if left:
                        raise BenchError(f"{target.key}: {len(left)} lock keys left")
            finally:
                failed = sys.exc_info()[0] is not None
                for target in targets:
                    if target.workers is not None:
                        stop_workers(target.workers, failed)
                client.close()
                nodes.close()
    except BenchError as exc:
        print(f"cluster benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    report(targets, args, time.perf_counter() - began)
    return 0
