"""What ``lock_limit`` costs: acquire + release of one slot with a limit of 1, 3 and 10 (and
10 with 9 slots held by others), and the round trips each sends.

``python -m bench limits [--quick]``: the contenders ``limit1``, ``limit3``, ``limit10`` and
``limit10-busy`` of ``bench/_contenders.py`` alternate call by call in one process (the paired
loop, ``bench/_paired.py``) against one Redis and are compared by per-round ratios to
``limit1``, which is the mutex (the same script and keys as a task without ``lock_limit``).
``limit1-rule`` is that mutex reading its task's live rule (``celery locks limit`` / ``pause``)
in the same call, as a LockedTask's acquire does on one server.
"""

from __future__ import annotations

from typing import Optional, Sequence

import redis

from ._builds import EngineSetup
from ._common import (
    RoundTripCounter,
    counting_client,
    delete_matching,
    med_iqr,
    median,
    new_prefix,
    redis_target,
    rounds_and_cycles,
)
from ._contenders import pick
from ._paired import paired_calls

KEYS = ("limit1", "limit1-rule", "limit3", "limit10", "limit10-busy")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = rounds_and_cycles("python -m bench limits", __doc__, argv or [], (5, 15))
    prefix = new_prefix()
    counter = RoundTripCounter()
    with redis_target() as target:
        plain = redis.Redis.from_url(target.url)
        counted = counting_client(target.url, counter)
        contenders = pick(KEYS, "engine")
        calls, trips = [], {}
        for c in contenders:
            assert c.engine is not None
            calls.append(c.engine(EngineSetup(plain, prefix), f"{prefix}:{c.key}"))
            once = c.engine(EngineSetup(counted, prefix), f"{prefix}:{c.key}:counted")
            once(0)  # loads the scripts: not counted
            counter.reset()
            once(1)
            trips[c.key] = len(counter)
        paired = paired_calls(KEYS, calls, rounds=args.rounds, cycles=args.cycles)
        delete_matching(plain, [f"{prefix}*"])
    print(
        f"acquire + release of one slot, {args.rounds} rounds x {args.cycles} cycles, alternated "
        "call by call (median over rounds; ratio to lock_limit=1: per round)"
    )
    for c in contenders:
        ratio = med_iqr(paired.ratios("wall", c.key, "limit1"), ".2f")
        print(
            f"   {c.engine_label:<24} {median(paired.values('wall', c.key)):8.1f} us/cycle   "
            f"{ratio}x   {trips[c.key]} round trips"
        )
    return 0
