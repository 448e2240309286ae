"""How late a sweeper wakes a parked (or debounced) call on a Redis Cluster: with the summary
of due slots (``P:due-slots``, engine/slot_sweep.py) against the window rotation alone.

``python -m bench wake [--quick] [--rounds N]``: a throwaway 3-primary cluster on loopback (or
``$REDIS_CLUSTER_URL``). Each round parks 6 calls at once, each behind a lock of its own (a
random name, so a random slot): two behind a holder that "dies" (a 1 s lease never renewed),
two behind a family paused for 1 s, and two of latest wins held back by a 1 s
``lock_debounce`` (policy ``replace``). One of each pair has its slot's mark taken out of the
summary right after it parked (what a sweeper without the summary sees: only the rotation of
windows of 1,024 slots finds it). One sweeper (the worker's, engine side: ``hand_off_due`` then
``hand_on`` of each name) ticks every second, the default
``singleton_lock_handoff_sweep_interval``, from a random phase of the ends (a worker's sweeper
ticks whenever it started), until all 6 are handed on. The figure is the time from the
holder's TTL end (the pause's end, the debounce's due time) to the tick that hands the call its
slot.
"""

from __future__ import annotations

import argparse
import random
import secrets
import time
from typing import Any, Dict, List, Optional, Sequence

from redis.cluster import RedisCluster
from redis.crc import key_slot

from celery_singleton_lock.engine import Latest, Lease, Owner, Parked, RedisLocker, Renewer

from ._common import med_iqr, new_prefix
from .engine import cluster_url

#: seconds between two ticks of the sweeper (the default sweep interval)
TICK = 1.0
#: the lease of the holder that dies, and the pause
ENDS_AFTER = 1.0
#: ticks at most per round (the rotation reads every slot within 16)
MAX_TICKS = 25
#: calls parked per round
CALLS = 6


def _queue(locker: RedisLocker, name: str, task_id: str, ttl: float = 30, cap_key: str = "") -> Any:
    """An acquire of policy queue: a lease, or the call parked."""
    return locker.try_acquire(
        name,
        ttl,
        owner=Owner(task_id=task_id),
        renew=False,
        park=task_id.encode(),
        reservation_ttl=30,
        cap_key=cap_key,
    )


def _debounced(locker: RedisLocker, name: str, task_id: str) -> Any:
    """An acquire of latest wins with a debounce of :data:`ENDS_AFTER`: the call held back."""
    return locker.try_acquire(
        name,
        30,
        owner=Owner(task_id=task_id),
        renew=False,
        park=task_id.encode(),
        reservation_ttl=30,
        latest=Latest(debounce=ENDS_AFTER),
    )


def _round(locker: RedisLocker, client: RedisCluster, prefix: str) -> Dict[str, float]:
    """One round: the 6 calls' wake latencies (seconds), by case."""
    tag = secrets.token_hex(4)
    family = f"bench.wake{tag}"
    ends: Dict[str, float] = {}
    names: Dict[str, str] = {}
    pause_end = locker.live_rules.pause(family, ENDS_AFTER)
    for case in ("died, summary", "died, window only"):
        name = names[case] = f"bench.died{tag}:{case[-4:]}"
        assert isinstance(_queue(locker, name, "h", ttl=ENDS_AFTER), Lease)
        ends[case] = time.time() + ENDS_AFTER
        assert isinstance(_queue(locker, name, case), Parked)
    for case in ("pause ended, summary", "pause ended, window only"):
        name = names[case] = f"{family}:{case[-4:]}"
        parked = _queue(locker, name, case, cap_key=f"{prefix}:cap:{family}")
        assert isinstance(parked, Parked)
        ends[case] = pause_end
    for case in ("debounce due, summary", "debounce due, window only"):
        name = names[case] = f"bench.debounced{tag}:{case[-4:]}"
        ends[case] = time.time() + ENDS_AFTER  # due no earlier than this
        assert isinstance(_debounced(locker, name, case), Parked)
    for case, name in names.items():
        if case.endswith("window only"):  # as if no client marked it
            client.zrem(f"{prefix}:due-slots", str(key_slot(f"{prefix}:{{{name}}}".encode())))
    # the sweeper's ticks at a random phase of the ends, as a worker's would be
    time.sleep(random.uniform(0, TICK))
    queue = locker.queue
    assert queue is not None
    woken: Dict[str, float] = {}
    by_name = {name: case for case, name in names.items()}
    for _ in range(MAX_TICKS):
        tick = time.time()
        for name in queue.hand_off_due(100).names:
            if name in by_name and queue.hand_on(name, reservation_ttl=30):
                woken[by_name[name]] = time.time() - ends[by_name[name]]
        if len(woken) == len(names):
            break
        time.sleep(max(0.0, TICK - (time.time() - tick)))
    locker.live_rules.resume(family)
    return woken


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench wake", description=__doc__)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args(list(argv or []))
    rounds = 3 if args.quick else args.rounds
    prefix = new_prefix()
    with cluster_url() as url:
        client = RedisCluster.from_url(url)
        locker = RedisLocker(client, prefix=prefix, renewer=Renewer(autostart=False))
        found: Dict[str, List[float]] = {}
        missed = 0
        for _ in range(rounds):
            woken = _round(locker, client, prefix)
            missed += CALLS - len(woken)
            for case, late in woken.items():
                found.setdefault(case, []).append(late)
        print(
            f"a parked call's wake on a 3-primary Redis Cluster: seconds from its holder's "
            f"TTL end (its pause's end, its debounce's due time) to the sweep that hands it "
            f"on, a tick every "
            f"{TICK:g} s ({rounds} rounds, median [IQR], max)"
        )
        for case in sorted(found):
            lates = found[case]
            print(f"   {case:<26} {med_iqr(lates, '.2f')}   max {max(lates):.2f}")
        if missed:
            print(f"   {missed} calls not handed on within {MAX_TICKS} ticks")
        for node in client.get_primaries():
            conn = node.redis_connection
            for key in conn.scan_iter(match=f"{prefix}*", count=1000):
                conn.delete(key)
        client.close()
    return 0
