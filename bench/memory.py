"""What finished tasks leave on the lock server: keys and bytes, previous layout vs this one.

``python -m bench memory [--tasks N]`` (default 10,000; ~10-30 s): N ``acks_late`` tasks, each
under a fenced lock of its own name (N distinct names), each taking its lock with
``unless_finished`` and releasing it with its finish record for ``lock_finished_ttl`` (1 h),
as a worker does. Then the keys left under the run's prefix are counted (SCAN) and weighed
(``MEMORY USAGE`` per key, ``SAMPLES 0``: every element), and ``used_memory`` of ``INFO
memory`` is compared with before the run.

*previous*: the key layout of the previous version, made with the same commands its scripts
ran (``INCR <prefix>:{<name>}:fence``, the lock ``SET``, then ``SET
<prefix>:{<name>}:finished:<task id> <value> PX <ttl>`` and ``DEL`` of the lock), so that
its footprint can be measured beside this one without installing it. *now*: this version's
engine (:class:`~celery_singleton_lock.engine.RedisLocker`), the same scripts a worker runs.

Counts of keys and bytes do not depend on the machine's load, unlike timings.
"""

from __future__ import annotations

import argparse
import time
import uuid
from typing import Callable, Optional, Sequence

import redis

from celery_singleton_lock.engine import Lease, Owner, RedisLocker, Renewer

from ._common import BenchError, delete_matching, new_prefix, redis_target

FINISHED_TTL = 3600.0


def previous_layout(client: redis.Redis, prefix: str) -> Callable[[str, str], None]:
    """One task of the previous version: fenced acquire, release with its finish record."""
    ttl_ms = int(FINISHED_TTL * 1000)

    def task(name: str, task_id: str) -> None:
        lock = f"{prefix}:{{{name}}}"
        if client.exists(f"{lock}:finished:{task_id}"):
            raise BenchError(f"previous layout: {task_id} found finished before it ran")
        fence = client.incr(f"{lock}:fence")
        fields = f"{fence}|{int(time.time() * 1000)}|{4242}|worker@host|{task_id}"
        client.set(lock, f"{uuid.uuid4().hex}|{fields}", px=30000)
        client.set(f"{lock}:finished:{task_id}", fields, px=ttl_ms)
        client.delete(lock)

    return task


def this_layout(client: redis.Redis, prefix: str) -> Callable[[str, str], None]:
    """One task of this version, through the engine as a worker takes and releases it."""
    locker = RedisLocker(client, prefix=prefix, renewer=Renewer())

    def task(name: str, task_id: str) -> None:
        owner = Owner(task_id=task_id, host="worker@host", pid=4242)
        lease = locker.try_acquire(
            name,
            ttl=30,
            owner=owner,
            fencing=True,
            renew=False,
            unless_finished=True,
            finished_ttl=FINISHED_TTL,
        )
        if not isinstance(lease, Lease) or not lease.release(remember_for=FINISHED_TTL):
            raise BenchError(f"this layout: {name} was not acquired and released")

    return task


def footprint(
    client: redis.Redis, prefix: str, tasks: int, layout: Callable[[str, str], None]
) -> tuple[int, int, int]:
    """Run ``tasks`` tasks of ``layout`` on distinct names; keys left, their MEMORY USAGE
    total, and the growth of ``used_memory``."""
    before = int(client.info("memory")["used_memory"])
    for i in range(tasks):
        layout(f"account-{i}", str(uuid.uuid4()))
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    used = sum(int(size or 0) for size in pipe.execute())
    grown = int(client.info("memory")["used_memory"]) - before
    return len(keys), used, grown


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser("python -m bench memory", description=__doc__)
    parser.add_argument("--tasks", type=int, default=10_000)
    args = parser.parse_args(argv or [])
    if not 1 <= args.tasks <= 1_000_000:
        parser.error("--tasks must be between 1 and 1,000,000")
    print(
        f"{args.tasks:,} acks_late tasks over {args.tasks:,} distinct fenced lock names, finish "
        f"records for {FINISHED_TTL:.0f} s; keys and bytes left on the lock server"
    )
    print(f"{'layout':<10} {'keys':>8} {'MEMORY USAGE':>14} {'per task':>10} {'used_memory':>13}")
    with redis_target() as target:
        client = redis.Redis.from_url(target.url)
        try:
            for label, make in (("previous", previous_layout), ("now", this_layout)):
                prefix = new_prefix()
                try:
                    keys, used, grown = footprint(client, prefix, args.tasks, make(client, prefix))
                finally:
                    delete_matching(client, [f"{prefix}:*"])
                print(
                    f"{label:<10} {keys:>8,} {used:>12,} B {used / args.tasks:>8.1f} B "
                    f"{grown:>+11,} B"
                )
        finally:
            client.close()
        print(f"({target.description})")
    return 0
