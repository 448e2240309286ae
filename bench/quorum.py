"""What a Redlock quorum costs: acquire + release on 3 independent servers vs on one.

``python -m bench quorum [--quick]``: three throwaway redis-servers on loopback. Contenders
(``bench/_contenders.py``), alternated call by call in one process (the paired loop,
``bench/_paired.py``) and compared by per-round ratios to the single server: one
``RedisLocker`` on the first server (``locked-no-renew``); a ``QuorumLocker`` over all three
(``quorum``: acquire and release sent to the three at once from its thread pool). Then one
server is stopped and the same two alternate again: the quorum's acquire still reaches a
majority, and each call to the stopped server fails at once with a refused connection.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import List, Optional, Sequence

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from celery_singleton_lock.testing import RedisServer

from ._builds import EngineSetup
from ._common import med_iqr, median, new_prefix, rounds_and_cycles
from ._contenders import pick
from ._paired import Paired, paired_calls

KEYS = ("locked-no-renew", "quorum")


def _client(server: RedisServer) -> redis.Redis:
    return redis.Redis(
        host="127.0.0.1", port=server.port, socket_timeout=2, retry=Retry(NoBackoff(), 0)
    )


def _row(label: str, paired: Paired) -> str:
    us = median(paired.values("wall", "quorum"))
    ratios = paired.ratios("wall", "quorum", "locked-no-renew")
    return f"   {label:<28}{us:8.1f} us/cycle   {med_iqr(ratios, '.2f')}x"


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = rounds_and_cycles("python -m bench quorum", __doc__, argv or [], (5, 15))
    prefix = new_prefix()
    with ExitStack() as stack:
        servers = [stack.enter_context(RedisServer.running()) for _ in range(3)]
        clients: List[redis.Redis] = [_client(s) for s in servers]
        setup = EngineSetup(clients[0], prefix, quorum=clients)
        calls = [c.engine(setup, f"{prefix}:{c.key}") for c in pick(KEYS, "engine") if c.engine]
        both = paired_calls(KEYS, calls, rounds=args.rounds, cycles=args.cycles)
        servers[2].stop()
        degraded = paired_calls(KEYS, calls, rounds=args.rounds, cycles=args.cycles, seed=10)
        for close in setup.closers:
            close()
    print(
        f"acquire + release, {args.rounds} rounds x {args.cycles} cycles, alternated call by "
        "call, redis-servers on loopback (median over rounds; ratio to one server: per round)"
    )
    print(f"   {'one server':<28}{median(both.values('wall', 'locked-no-renew')):8.1f} us/cycle")
    print(_row("quorum of 3", both))
    print(_row("quorum of 3, one stopped", degraded) + "   (rounds after the others)")
    return 0
