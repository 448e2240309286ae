"""What a Redlock quorum costs: acquire + release on 3 independent servers vs on one.

``python -m bench quorum [--quick]``: three throwaway redis-servers on loopback. Contenders,
alternated round by round (the order rotated each round) and compared by per-round ratios to
the single server: one ``RedisLocker`` on the first server; a ``QuorumLocker`` over all three
(acquire and release sent to the three at once from its thread pool); the same quorum with one
server stopped (measured last, once the server is down: the acquire still reaches a majority,
and each call to the stopped server fails at once with a refused connection).
"""

from __future__ import annotations

import argparse
import time
from contextlib import ExitStack
from typing import Any, Dict, List, Optional, Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock.engine import RedisLocker, Renewer
from celery_singleton_lock.engine.redlock import QuorumLocker
from celery_singleton_lock.testing import RedisServer

from ._common import median, quartiles


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench quorum", description=__doc__)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--cycles", type=int, default=300, help="acquire+release per round")
    parser.add_argument("--quick", action="store_true", help="5 rounds of 100 cycles")
    args = parser.parse_args(list(argv))
    if args.quick:
        args.rounds, args.cycles = 5, 100
    return args


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=server.port, socket_timeout=2, retry=Retry(NoBackoff(), 0)
    )


def _us_per_cycle(locker: Any, label: str, cycles: int, round_index: int) -> float:
    started = time.perf_counter()
    for i in range(cycles):
        lease = locker.try_acquire(f"q{round_index}-{label.replace(' ', '-')}-{i}", 30, renew=False)
        lease.release()
    return (time.perf_counter() - started) / cycles * 1e6


def _row(label: str, timings: List[float], single: List[float]) -> str:
    ratios = [t / s for s, t in zip(single, timings)]
    low, high = quartiles(ratios)
    return (
        f"   {label:<28}{median(timings):8.1f} us/cycle   "
        f"{median(ratios):.2f}x [{low:.2f}..{high:.2f}]"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(argv or [])
    with ExitStack() as stack:
        servers = [stack.enter_context(RedisServer.running()) for _ in range(3)]
        renewer = Renewer(autostart=False)
        lockers: Dict[str, Any] = {
            "one server": RedisLocker(_client(servers[0]), prefix="bench", renewer=renewer),
            "quorum of 3": QuorumLocker(
                [_client(s) for s in servers], prefix="bench", renewer=renewer
            ),
        }
        for label, locker in lockers.items():  # warm-up: scripts loaded, connections open
            _us_per_cycle(locker, label, 50, -1)
        timings: Dict[str, List[float]] = {label: [] for label in lockers}
        labels = list(lockers)
        for index in range(args.rounds):
            for label in labels[index % 2 :] + labels[: index % 2]:
                timings[label].append(_us_per_cycle(lockers[label], label, args.cycles, index))
        servers[2].stop()
        degraded = [
            _us_per_cycle(lockers["quorum of 3"], "down", args.cycles, index)
            for index in range(args.rounds)
        ]
        lockers["quorum of 3"].close()
    print(
        f"acquire + release, {args.rounds} rounds x {args.cycles} cycles, redis-servers on "
        "loopback (median over rounds; ratio to one server: per round)"
    )
    single = timings["one server"]
    print(f"   {'one server':<28}{median(single):8.1f} us/cycle")
    print(_row("quorum of 3", timings["quorum of 3"], single))
    print(_row("quorum of 3, one stopped", degraded, single) + "   (rounds after the others)")
    return 0
