"""How soon a running call learns that a newer one asked it to stop (``on_duplicate="restart"``):
the stop read by the body (polled) vs pushed to its process.

``python -m bench cancel [--quick] [--cluster] [--look MS]``: one process holds a lock as a
running call would and looks at its ``cancelled`` every ``--look`` ms (a "body" thread); the
newer call's ``cancel_holder`` (the script it sends right after its acquire parked it) is
sent at a random moment, and the time from just before that send to the body's first look that
says True is measured. The contenders alternate round by round, each round the same:

- ``polled``: the look of the lock scope before this change: a read of the flag (one round
  trip) at most every 50 ms, False in between;
- ``pushed``: the look now: the process listens on the lock's cancel channel
  (``engine/cancel_watch.py``; ``SSUBSCRIBE`` on a Cluster), a look reads a flag set by the
  listener thread, and the body's own read is a fallback every 2 s.

Also counted: the reads (round trips) the body's looks sent in a run of ~0.35 s (the polled
body reads 20 times a second however long it runs; the pushed one once, then every 2 s). On a
throwaway ``redis-server`` (or ``$REDIS_URL``), or with ``--cluster`` a throwaway 3-primary
Redis Cluster on loopback.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import threading
import time
from typing import Callable, Iterator, Optional, Sequence

from celery_singleton_lock.celery.config.servers import close_client, make_client
from celery_singleton_lock.engine import Lease, Owner, RedisLocker, Renewer
from celery_singleton_lock.engine.kinds.cancels import Cancels

from ._common import delete_matching, fill_defaults, median, new_prefix, quartiles, redis_target

#: the lock scope's read interval before the push (celery/task/execution.py's CANCEL_POLL then)
OLD_POLL = 0.05
#: its fallback read interval now
NEW_POLL = 2.0
CONTENDERS = ("polled", "pushed")


class Body(threading.Thread):
    """A running call that looks at its ``cancelled`` every ``look`` seconds until it is True."""

    def __init__(self, looks: Callable[[], bool], look: float) -> None:
        super().__init__(daemon=True)
        self.looks = looks
        self.look = look
        self.seen_at: Optional[float] = None
        self.stop = threading.Event()

    def run(self) -> None:
        deadline = time.monotonic() + 30  # bounded: a stop never seen ends the round
        while not self.stop.is_set() and time.monotonic() < deadline:
            if self.looks():
                self.seen_at = time.perf_counter()
                return
            time.sleep(self.look)


class Polled:
    """The look before: the flag read at most every :data:`OLD_POLL` seconds."""

    def __init__(self, cancels: Cancels, name: str, task_id: str) -> None:
        self.cancels, self.held = cancels, [(name, task_id)]
        self.read_at = -1e9
        self.reads = 0

    def __call__(self) -> bool:
        now = time.monotonic()
        if now - self.read_at < OLD_POLL:
            return False
        self.read_at = now
        self.reads += 1
        return self.cancels.cancel_requested(self.held)[0]

    def close(self) -> None:
        pass


class Pushed:
    """The look now: the listener's flag, the body's own read every :data:`NEW_POLL` s."""

    def __init__(self, cancels: Cancels, name: str, task_id: str) -> None:
        self.cancels, self.held = cancels, [(name, task_id)]
        self.signal = cancels.watch(name, task_id)
        self.read_at = -1e9
        self.reads = 0

    def __call__(self) -> bool:
        if self.signal.asked:
            return True
        now = time.monotonic()
        if now - self.read_at < NEW_POLL:
            return False
        self.read_at = now
        self.reads += 1
        return self.cancels.cancel_requested(self.held)[0]

    def close(self) -> None:
        self.cancels.unwatch(self.signal)


def one_round(
    locker: RedisLocker, cancels: Cancels, kind: str, name: str, look: float, rng: random.Random
) -> tuple[float, float]:
    """One stop: (ms from the newer call's send to the body's True, the reads the body sent)."""
    lease = locker.try_acquire(name, 30, owner=Owner(task_id="v1"), renew=False)
    assert isinstance(lease, Lease)
    looks = (Polled if kind == "polled" else Pushed)(cancels, name, "v1")
    body = Body(looks, look)
    body.start()
    time.sleep(0.3 + rng.random() * 0.1)  # subscribed; and a random phase of the polling
    sent = time.perf_counter()
    assert cancels.cancel_holder(name, by="v2") == "v1"
    body.join(timeout=35)
    body.stop.set()
    looks.close()
    lease.release()
    if body.seen_at is None:
        raise RuntimeError(f"{kind}: the body never saw the stop")
    return (body.seen_at - sent) * 1000, looks.reads


@contextlib.contextmanager
def target_url(cluster: bool) -> Iterator[tuple[str, str]]:
    if not cluster:
        with redis_target() as target:
            yield target.url, target.description
        return
    from tests.cluster_topology import ClusterGroup  # the test suite's own topology helper

    with ClusterGroup.running() as group:
        yield group.url, "throwaway Redis Cluster, 3 primaries on loopback"


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench cancel", description=__doc__)
    parser.add_argument("--rounds", type=int, help="stops per contender (default 60)")
    parser.add_argument("--look", type=float, default=1.0, help="ms between two looks (1)")
    parser.add_argument("--cluster", action="store_true", help="on a 3-primary Redis Cluster")
    parser.add_argument("--quick", action="store_true", help="20 stops per contender")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(list(argv or []))
    fill_defaults(parser, args, {"rounds": (20, 60)}, ("rounds",))
    rng = random.Random(args.seed)
    prefix = new_prefix()
    with target_url(args.cluster) as (url, description):
        client = make_client(url, {}, cluster=None)
        locker = RedisLocker(client, prefix=prefix, renewer=Renewer(autostart=False))
        cancels = locker.cancels
        delays: dict[str, list[float]] = {kind: [] for kind in CONTENDERS}
        reads: dict[str, list[float]] = {kind: [] for kind in CONTENDERS}
        try:
            for i in range(args.rounds):
                order = CONTENDERS if i % 2 == 0 else CONTENDERS[::-1]
                for kind in order:
                    delay, rate = one_round(
                        locker, cancels, kind, f"job-{i}-{kind}", args.look / 1000, rng
                    )
                    delays[kind].append(delay)
                    reads[kind].append(rate)
        finally:
            cancels.close()
            delete_matching(client, [f"{prefix}:*"])  # type: ignore[arg-type]
            close_client(client)
    print(
        f"newer call's cancel sent -> the running body's cancelled True; {args.rounds} stops "
        f"per contender, alternated; the body looks every {args.look:g} ms; {description}"
    )
    print("                 median   [q1..q3]          max      reads by the body")
    for kind in CONTENDERS:
        q1, q3 = quartiles(delays[kind])
        print(
            f"   {kind:8s}  {median(delays[kind]):8.2f} ms [{q1:.2f}..{q3:.2f}]  "
            f"{max(delays[kind]):8.2f} ms   {median(reads[kind]):5.0f}"
        )
    return 0
