"""Releases publish only when someone waits (issue 29), read from the lock server's counters.

Not a timing: ``INFO commandstats`` calls of ``PUBLISH`` and ``SPUBLISH`` on a private lock
server (the broker and the results on another, whose traffic publishes too), after

1. ``--tasks`` uncontended calls (distinct keys) of ``hold_skip`` through a real prefork worker
   (``tests/celery/lockapp.py``): nobody waits, so the target is 0 publishes;
2. ``--waiters`` calls of ``hold_wait`` (``on_duplicate="wait"``) on ONE key, all sent at once
   to the same worker, bodies of 0.1 s: each release with a waiter subscribed publishes (> 0);
3. on a throwaway 3-primary Redis Cluster, through the engine (``RedisLocker`` on a cluster
   client): ``--tasks`` acquire + release of free locks (0 on every node), then releases with a
   subscriber on the lock's release channel: which command, on which node, and whether the
   subscriber was woken.

    python -m bench publishes            # ~30 s (--quick ~20 s)
"""

from __future__ import annotations

import argparse
import time
from typing import Any, Dict, List, Optional, Sequence

from celery_singleton_lock.engine import Lease, RedisLocker
from celery_singleton_lock.testing import RedisServer

from ._common import BenchError, sized_options, versions, worker_group

PUBLISHING = ("publish", "spublish")


def publishes(client: Any) -> Dict[str, int]:
    """Calls of PUBLISH and SPUBLISH (and PUBSUB NUMSUB, the scripts' look) since the reset."""
    stats = client.info("commandstats")
    return {
        name: int(stats.get(f"cmdstat_{name}", {}).get("calls", 0))
        for name in (*PUBLISHING, "pubsub|numsub")
    }


def verdict(met: bool, text: str) -> str:
    return f"   {text}: {'meets' if met else 'MISSES'}"


def worker_part(tasks: int, waiters: int) -> List[str]:
    """The worker's figures; returns the verdict lines."""
    from tests.celery.tasks import policies
    from tests.celery.workers import Servers, client_app, close_client, unique

    with RedisServer.running() as broker, RedisServer.running() as lock:
        servers = Servers(broker_url=broker.url, lock=lock)
        with worker_group(servers) as group:
            (worker,) = group.start(concurrency=2)
            client = client_app(servers, worker.queue)
            counters = lock.client()
            print(f"redis-server {counters.info('server')['redis_version']}")
            try:
                warm = client.send_task(policies.hold_skip.name, args=[unique("warm")])
                warm.get(timeout=60)
                counters.config_resetstat()
                sent = [
                    client.send_task(policies.hold_skip.name, args=[unique("free")])
                    for _ in range(tasks)
                ]
                for result in sent:
                    result.get(timeout=120)
                alone = publishes(counters)
                print(f"{tasks:,} uncontended hold_skip calls (prefork -c 2): {alone}")
                counters.config_resetstat()
                key = unique("contended")
                waiting = [
                    client.send_task(policies.hold_wait.name, args=[key], kwargs={"seconds": 0.1})
                    for _ in range(waiters)
                ]
                for result in waiting:
                    result.get(timeout=120)
                runs = counters.llen(f"runs:{key}")
                overlaps = int(counters.get(f"overlaps:{key}") or 0)
                waited = publishes(counters)
                print(
                    f"{waiters} hold_wait calls on one key (bodies 0.1 s): {waited};"
                    f" bodies run {runs}, overlaps {overlaps}"
                )
            finally:
                close_client(client)
    if runs != waiters or overlaps:
        raise BenchError(f"{runs} bodies of {waiters} ran, {overlaps} overlaps")
    return [
        verdict(
            alone["publish"] + alone["spublish"] == 0,
            f"{tasks:,} releases with nobody waiting publish"
            f" {alone['publish'] + alone['spublish']} times (0)",
        ),
        verdict(waited["publish"] > 0, f"releases with a waiter publish ({waited['publish']})"),
    ]


def cluster_part(tasks: int) -> List[str]:
    """The cluster's figures; returns the verdict lines."""
    from redis.cluster import RedisCluster

    from tests.cluster_topology import ClusterGroup

    with ClusterGroup.running() as group:
        cluster = RedisCluster.from_url(group.url)
        nodes = [group.node(port) for port in group.primary_ports()]
        locker = RedisLocker(cluster)
        try:
            for node in nodes:
                node.config_resetstat()
            for i in range(tasks):
                lease = locker.try_acquire(f"bench-publish-{i}", ttl=30, renew=False)
                if not isinstance(lease, Lease):
                    raise BenchError(f"a free lock not acquired: {lease!r}")
                lease.release()
            alone = [publishes(node) for node in nodes]
            print(f"cluster, {tasks:,} acquire + release, nobody waiting, per primary: {alone}")
            for node in nodes:
                node.config_resetstat()
            woken = 0
            rounds = 20
            for i in range(rounds):
                name = f"bench-publish-waited-{i}"
                lease = locker.try_acquire(name, ttl=30, renew=False)
                if not isinstance(lease, Lease):
                    raise BenchError(f"a free lock not acquired: {lease!r}")
                subscription: Any = locker.subscribe_releases(name)
                try:
                    lease.release()
                    deadline = time.monotonic() + 5
                    while time.monotonic() < deadline:
                        message = subscription.get_message(timeout=0.5)
                        if message is not None and message.get("type") in ("message", "smessage"):
                            woken += 1
                            break
                finally:
                    subscription.close()
            per_node = [publishes(node) for node in nodes]
            print(
                f"cluster, {rounds} releases with a subscriber, per primary: {per_node};"
                f" subscribers woken {woken}/{rounds}"
            )
        finally:
            cluster.close()
    sent = sum(node["publish"] + node["spublish"] for node in alone)
    return [
        verdict(sent == 0, f"cluster: {tasks:,} releases with nobody waiting publish {sent} times"),
        verdict(woken == rounds, f"cluster: subscribers woken {woken}/{rounds}"),
    ]


def parse(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    waiters = ("waiters", 20, "calls of one key")
    return sized_options(__name__, __doc__, argv, "tasks", (200, 1000), waiters)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv)
    print(versions("celery", "redis"))
    verdicts = worker_part(args.tasks, args.waiters) + cluster_part(args.tasks)
    print("verdicts (issue 29: releases publish only when someone waits):", *verdicts, sep="\n")
    return 0
