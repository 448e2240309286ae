"""What a live rule (``celery locks limit`` / ``pause`` / ``resume``, a body's ``pause_for``)
costs on a Redis Cluster, where it is a copy per hash slot (engine live_rules.py), against one
server, where it is one hash.

``python -m bench rules [--quick]``: a throwaway ``redis-server`` and a throwaway 3-primary
cluster on loopback (or ``$REDIS_URL`` / ``$REDIS_CLUSTER_URL``). Each round, on both in turn
(order rotated): the time of each command, once, on a family of its own. Then the memory of one
family's copies on the cluster (``MEMORY USAGE`` of one copy, and the primaries'
``used_memory`` before and after), and what reading the rule adds to a mutex acquire + release
on the cluster: with the rule's copy (the long form of lua/acquire.lua) against without it,
alternated call by call, ratio per round.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import redis
from redis.cluster import RedisCluster

from celery_singleton_lock.engine import Lease, RedisLocker, Renewer
from celery_singleton_lock.engine.keys import SharedKeys

from ._common import delete_matching, med_iqr, new_prefix, redis_target, rounds_and_cycles
from ._paired import rotated
from .engine import cluster_url

COMMANDS: Dict[str, Callable[[Any, str], Any]] = {
    "limit N": lambda rules, family: rules.set_cap(family, 2),
    "limit --reset": lambda rules, family: rules.set_cap(family, None),
    "pause": lambda rules, family: rules.pause(family, None),
    "pause_for (lengthen)": lambda rules, family: rules.pause(family, 5, lengthen=True),
    "resume": lambda rules, family: rules.resume(family),
}


def _used_memory(client: RedisCluster) -> int:
    return sum(
        int(node.redis_connection.info("memory")["used_memory"]) for node in client.get_primaries()
    )


def _acquire_release(locker: RedisLocker, cap_key: str) -> Callable[[int], None]:
    def cycle(i: int) -> None:
        lease = locker.try_acquire(f"bench.job:{i}", 30, renew=False, cap_key=cap_key)
        assert isinstance(lease, Lease)
        lease.release()

    return cycle


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = rounds_and_cycles("python -m bench rules", __doc__, argv or [], (3, 7))
    prefix = new_prefix()
    with redis_target() as target, cluster_url() as url:
        single: Any = redis.Redis.from_url(target.url)
        cluster = RedisCluster.from_url(url)
        lockers = {
            name: RedisLocker(client, prefix=prefix, renewer=Renewer(autostart=False))
            for name, client in (("one server", single), ("cluster", cluster))
        }
        times: Dict[str, Dict[str, List[float]]] = {name: {} for name in lockers}
        for round_no in range(args.rounds):
            for name in rotated(list(lockers), round_no):
                rules = lockers[name].live_rules
                family = f"bench.r{round_no}"
                for command, run in COMMANDS.items():
                    began = time.perf_counter()
                    run(rules, family)
                    times[name].setdefault(command, []).append(time.perf_counter() - began)
        print(f"a live rule's command, {args.rounds} rounds (ms, median [IQR]; ratio per round)")
        for command in COMMANDS:
            one, many = times["one server"][command], times["cluster"][command]
            ratios = [m / o for m, o in zip(many, one)]
            print(
                f"   {command:<22} one server {med_iqr([t * 1000 for t in one], '.2f')}   "
                f"cluster {med_iqr([t * 1000 for t in many], '.0f')}   "
                f"{med_iqr(ratios, '.0f')}x"
            )
        rules = lockers["cluster"].live_rules
        before = _used_memory(cluster)
        rules.set_cap("bench.memory", 2)
        rules.pause("bench.memory", 600)
        after = _used_memory(cluster)
        copy = int(cluster.memory_usage(SharedKeys.of_slot(f"{prefix}:cap:bench.memory", 0)))
        print(
            f"memory of one family's rule (cap and pause) on the cluster: {copy} bytes a copy "
            f"(MEMORY USAGE), used_memory +{(after - before) / 1e6:.2f} MB over the primaries"
        )
        locker = lockers["cluster"]
        cap_key = f"{prefix}:cap:bench.idle"  # no rule set: the read finds none
        plain, read = _acquire_release(locker, ""), _acquire_release(locker, cap_key)
        ratios, walls = [], []
        for round_no in range(args.rounds):
            spent = {"plain": 0.0, "read": 0.0}
            for i in range(args.cycles):
                for key, cycle in rotated([("plain", plain), ("read", read)], i + round_no):
                    began = time.perf_counter()
                    cycle(i)
                    spent[key] += time.perf_counter() - began
            ratios.append(spent["read"] / spent["plain"])
            walls.append(spent["read"] / args.cycles * 1e6)
        print(
            f"mutex acquire + release on the cluster reading the rule's copy: "
            f"{med_iqr(walls, '.0f')} us/cycle, {med_iqr(ratios, '.3f')}x the same without "
            f"({args.rounds} rounds x {args.cycles} cycles, alternated call by call)"
        )
        for locker in lockers.values():
            for family in [f"bench.r{n}" for n in range(args.rounds)] + ["bench.memory"]:
                locker.live_rules.set_cap(family, None)
                locker.live_rules.resume(family)
        delete_matching(single, [f"{prefix}*"])
        single.close()
        cluster.close()
    return 0
