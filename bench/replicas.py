"""What waiting for replicas costs: acquire + release with ``min_replicas=1`` vs without.

``python -m bench replicas [--quick]``: a throwaway primary and one replica (``--replicaof``) on
loopback; both contenders (``locked`` and ``locked-replica`` of ``bench/_contenders.py``)
alternate call by call in one process (the paired loop, ``bench/_paired.py``) and are compared
by per-round ratios. ``min_replicas=1`` sends ``WAIT 1`` with the acquire, in the same round
trip, so the difference is the time the primary waits for the replica's acknowledgement (one
more hop, on loopback here).
"""

from __future__ import annotations

from typing import Optional, Sequence

from celery_singleton_lock.testing import primary_with_replica

from ._builds import EngineSetup
from ._common import med_iqr, median, new_prefix, rounds_and_cycles
from ._contenders import pick
from ._paired import paired_calls

KEYS = ("locked", "locked-replica")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = rounds_and_cycles("python -m bench replicas", __doc__, argv or [], (5, 15))
    prefix = new_prefix()
    with primary_with_replica() as (primary, _):
        setup = EngineSetup(primary.client(), prefix)
        calls = [c.engine(setup, f"{prefix}:{c.key}") for c in pick(KEYS, "engine") if c.engine]
        paired = paired_calls(KEYS, calls, rounds=args.rounds, cycles=args.cycles)
    without, waited = (paired.values("wall", key) for key in KEYS)
    print(
        f"acquire + release, {args.rounds} rounds x {args.cycles} cycles, alternated call by "
        "call, primary + 1 replica on loopback (median over rounds; ratio: per round)"
    )
    print(f"   min_replicas=0          {median(without):8.1f} us/cycle")
    print(
        f"   min_replicas=1 (WAIT)   {median(waited):8.1f} us/cycle   "
        f"{med_iqr(paired.ratios('wall', 'locked-replica', 'locked'), '.2f')}x   "
        f"+{median(paired.differences('wall', 'locked-replica', 'locked')):.0f} us per task"
    )
    return 0
