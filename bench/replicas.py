"""What waiting for replicas costs: acquire + release with ``min_replicas=1`` vs without.

``python -m bench replicas [--quick]``: a throwaway primary and one replica (``--replicaof``) on
loopback; both contenders run in one process, alternated round by round (the order flipped each
round), and compared by per-round ratios. ``min_replicas=1`` sends ``WAIT 1`` with the acquire,
in the same round trip, so the difference is the time the primary waits for the replica's
acknowledgement (one more hop, on loopback here).
"""

from __future__ import annotations

import argparse
import time
from typing import List, Optional, Sequence

from celery_singleton_lock.engine import RedisLocker, Renewer
from celery_singleton_lock.testing import primary_with_replica

from ._common import median, quartiles


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench replicas", description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=300, help="acquire+release per round")
    parser.add_argument("--quick", action="store_true", help="5 rounds of 100 cycles")
    args = parser.parse_args(list(argv))
    if args.quick:
        args.rounds, args.cycles = 5, 100
    return args


def _us_per_cycle(locker: RedisLocker, replicas: int, cycles: int, round_index: int) -> float:
    started = time.perf_counter()
    for i in range(cycles):
        lease = locker.try_acquire(f"r{round_index}-{replicas}-{i}", 30, min_replicas=replicas)
        lease.release()  # type: ignore[union-attr]
    return (time.perf_counter() - started) / cycles * 1e6


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv or [])
    with primary_with_replica() as (primary, _):
        locker = RedisLocker(primary.client(), prefix="bench", renewer=Renewer(autostart=False))
        for replicas in (0, 1):  # warm-up: scripts loaded, connections open
            _us_per_cycle(locker, replicas, 50, -1)
        timings: dict[int, List[float]] = {0: [], 1: []}
        for index in range(args.rounds):
            for replicas in (0, 1) if index % 2 else (1, 0):
                timings[replicas].append(_us_per_cycle(locker, replicas, args.cycles, index))
    ratios = [waited / plain for plain, waited in zip(timings[0], timings[1])]
    low, high = quartiles(ratios)
    print(
        f"acquire + release, {args.rounds} rounds x {args.cycles} cycles, primary + 1 replica "
        "on loopback (median over rounds; ratio: per round)"
    )
    print(f"   min_replicas=0          {median(timings[0]):8.1f} us/cycle")
    print(
        f"   min_replicas=1 (WAIT)   {median(timings[1]):8.1f} us/cycle   "
        f"{median(ratios):.2f}x [{low:.2f}..{high:.2f}]   "
        f"+{median(timings[1]) - median(timings[0]):.0f} us per task"
    )
    return 0
