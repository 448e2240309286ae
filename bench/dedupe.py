"""Enqueue-dedupe benchmark: tasks locked when sent, ours vs celery-once vs celery-singleton.

``python -m bench dedupe [--quick]``. Contenders on one Redis (broker and locks): a plain
Celery ``Task`` (the yardstick), ``LockedTask`` with ``dedupe_on_enqueue=True``, celery-once
``QueueOnce`` and celery-singleton ``Singleton``, i.e. the three that stop a duplicate before
it reaches the queue. Two parts, in one run:

1. enqueue + run throughput: each round, for each contender in turn (order rotated every
   round), ``--tasks`` tasks with distinct arguments are sent with ``apply_async`` (timed)
   while no worker runs, then an in-process solo worker drains them (timed from the first
   ``task_prerun`` to the last ``task_postrun``), as in ``bench celery``. A task's whole cost is
   enqueue + run; end-to-end tasks/s is tasks over the two times added, and the ratios are
   per round (same machine weather).
2. ``--duplicates`` (1,000) sends of ONE call (same arguments) while no worker runs: messages
   published (``before_task_publish`` signal) and queued (``LLEN`` of the queue), what the
   callers got, microseconds and lock round trips per send; then a worker drains the queue
   and the bodies that ran are counted. The answer for a deduplicating contender is 1.

This module is ``bench.dedupe``; ``celery`` below is the real package (absolute imports).
"""

from __future__ import annotations

import argparse
import platform
import secrets
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

import redis
from celery import Celery, signals

from celery_singleton_lock.celery import LockedTask

from . import celery as celery_bench
from ._common import fill_defaults, median, quartiles, redis_target, server_version, verdict
from .celery import (
    BenchError,
    Contender,
    Setup,
    _pkg_version,
    build_once,
    build_plain,
    build_singleton,
    cleanup,
    make_app,
    noop,
    release_clients,
)

#: What each deduplicating contender must publish for ``--duplicates`` sends of one call.
EXPECTED_PUBLISHED = 1


def build_dedupe(app: Celery, name: str, setup: Setup) -> Any:
    return app.task(name=name, base=LockedTask, dedupe_on_enqueue=True)(noop)


def contenders() -> List[Contender]:
    # key "locked": bench.celery.make_app gives that key the plugin's counting client
    return [
        Contender("plain", "plain Celery Task", build_plain),
        Contender(
            "locked",
            "LockedTask dedupe_on_enqueue",
            build_dedupe,
            lock_pattern=lambda prefix, name: f"{prefix}-lock*",
        ),
        Contender(
            "once",
            "celery-once QueueOnce",
            build_once,
            lock_pattern=lambda prefix, name: f"qo_{name}*",
        ),
        Contender(
            "singleton",
            "celery-singleton Singleton",
            build_singleton,
            lock_pattern=lambda prefix, name: f"{prefix}-singleton:*",
        ),
    ]


# -- part 2: many sends of one call --------------------------------------------------------------


@dataclass
class Duplicates:
    published: int = 0  # before_task_publish of this task
    queued: int = 0  # LLEN of the queue after the sends
    ran: int = 0  # bodies run once a worker drained the queue
    send_us: float = 0.0  # per send
    trips: Counter[str] = field(default_factory=Counter)  # lock requests, all sends
    outcomes: Counter[str] = field(default_factory=Counter)  # what the callers got
    reason: str = ""


def _outcome(result: Any, first_id: Optional[str]) -> str:
    if result is None:
        return "None"
    if getattr(result, "id", None) == first_id:
        return "the first call's AsyncResult"
    return "a new AsyncResult"


def send_duplicates(
    app: Celery, contender: Contender, plain: redis.Redis, arg: int, sends: int
) -> Duplicates:
    """``sends`` x ``apply_async((arg,))`` with no worker running, then drain and count."""
    task, counter = contender.task, contender.counter
    queue_key = f"{app.main}:{app.conf.task_default_queue}"
    if plain.llen(queue_key):
        raise BenchError(f"queue {queue_key} not empty before the duplicate sends")
    out = Duplicates()

    def on_publish(sender: Any = None, **_: Any) -> None:
        if sender == task.name:
            out.published += 1

    signals.before_task_publish.connect(on_publish, weak=False)
    counter.reset()
    first_id: Optional[str] = None
    try:
        started = time.perf_counter()
        for _ in range(sends):
            try:
                result = task.apply_async((arg,))
            except Exception as exc:  # noqa: BLE001  (celery-once's AlreadyQueued, by design)
                out.outcomes[f"raised {type(exc).__name__}"] += 1
                continue
            if first_id is None and result is not None:
                first_id = result.id
                out.outcomes["published"] += 1
                continue
            out.outcomes[_outcome(result, first_id)] += 1
        out.send_us = (time.perf_counter() - started) / sends * 1e6
    finally:
        signals.before_task_publish.disconnect(on_publish)
    out.trips.update(name for name in counter.sent if name != celery_bench.HEALTH_CHECK)
    out.queued = plain.llen(queue_key)
    if out.queued:
        batch = celery_bench.Batch(frozenset([task.name]), out.queued, None)
        celery_bench.drain(app, batch, celery_bench.MIN_BATCH_TIMEOUT)
        out.ran = batch.done
        if batch.failed:
            raise BenchError(f"{contender.key}: duplicate sends: {batch.failed[0][1]}")
    if celery_bench.left_locks(plain, app.main, contender):
        raise BenchError(f"{contender.key}: lock keys left after the duplicate sends")
    return out


# -- report ---------------------------------------------------------------------------------------


def _e2e(contender: Contender) -> List[float]:
    """End-to-end tasks/s per round: tasks over (enqueue time + run time)."""
    return [
        1e6 / (enqueue_us + 1e6 / tasks_per_s)
        for enqueue_us, tasks_per_s in zip(contender.enqueue_us, contender.tasks_per_s)
    ]


def _ratio(ours: List[float], other: List[float]) -> str:
    ratios = [a / b for a, b in zip(ours, other)]
    q1, q3 = quartiles(ratios)
    return f"{median(ratios):.2f}x ({q1:.2f}-{q3:.2f})"


def print_throughput(run: celery_bench.Run, tasks: int) -> None:
    by_key = {c.key: c for c in run.entries}
    print(
        f"\n1. enqueue + run: {tasks} distinct no-op tasks per contender and round, "
        f"{run.rounds_done} rounds, medians over rounds"
    )
    print(
        f"   {'contender':<28} {'e2e tasks/s':>11} {'enqueue us':>10} {'run us':>6} "
        f"{'total us':>8} {'lock trips enq/run':>18}  {'ours vs it, e2e (IQR)':>22}"
    )
    locked = by_key["locked"]
    for c in run.entries:
        if not c.available:
            print(f"   {c.label:<28} {'n/a':>11}  {c.reason}")
            continue
        e2e = _e2e(c)
        run_us = 1e6 / median(c.tasks_per_s)
        enqueue_us = median(c.enqueue_us)
        trips = "-"
        if c.takes_locks:
            enq = "/".join(f"{t:g}" for t in sorted(set(c.enqueue_trips)))
            wrk = "/".join(f"{t:g}" for t in sorted(set(c.worker_trips)))
            trips = f"{enq} / {wrk}"
        ratio = "" if c is locked or not locked.available else _ratio(_e2e(locked), e2e)
        print(
            f"   {c.label:<28} {median(e2e):>11.0f} {enqueue_us:>10.0f} {run_us:>6.0f} "
            f"{enqueue_us + run_us:>8.0f} {trips:>18}  {ratio:>22}"
        )
    print(
        "   e2e tasks/s: tasks / (apply_async loop + first prerun..last postrun), per round; "
        "enqueue us: apply_async\n   per task, no worker running; run us: 1e6 / worker "
        "tasks/s; lock trips: requests per task from the contender's own\n   lock client at "
        "enqueue / in the worker (a/b: differs between rounds); ours vs it: median of the "
        "per-round\n   ratios of e2e tasks/s, LockedTask over that contender (> 1: ours faster)"
    )


def print_duplicates(results: Dict[str, Duplicates], entries: List[Contender], sends: int) -> None:
    print(f"\n2. {sends:,} sends of one call (same arguments), no worker running, then drained")
    print(
        f"   {'contender':<28} {'published':>9} {'queued':>6} {'ran':>5} {'us/send':>7} "
        f"{'lock trips/send':>15}  callers got"
    )
    for c in entries:
        r = results.get(c.key)
        if r is None:
            print(f"   {c.label:<28} {'n/a':>9}  {c.reason}")
            continue
        trips = sum(r.trips.values()) / sends
        got = ", ".join(f"{n} {what}" for what, n in r.outcomes.most_common())
        print(
            f"   {c.label:<28} {r.published:>9} {r.queued:>6} {r.ran:>5} {r.send_us:>7.0f} "
            f"{trips:>15g}  {got}"
        )
    print(
        "   published: before_task_publish signals; queued: LLEN of the queue after the "
        "sends; ran: bodies run by the\n   worker that drained it; lock trips: the "
        "contender's own lock client, all sends / sends"
    )


def print_verdicts(run: celery_bench.Run, results: Dict[str, Duplicates]) -> None:
    by_key = {c.key: c for c in run.entries}
    locked = by_key["locked"]
    lines = []
    for key in ("once", "singleton"):
        other = by_key[key]
        if not other.available:
            lines.append(f"LockedTask dedupe ahead of {other.label}: n/a ({other.reason})")
            continue
        ahead = median([a / b for a, b in zip(_e2e(locked), _e2e(other))])
        lines.append(
            f"LockedTask dedupe ahead of {other.label}, enqueue + run: {ahead:.2f}x its "
            f"tasks/s (> 1) {verdict(ahead > 1)}"
        )
    for key in ("locked", "once", "singleton"):
        r = results.get(key)
        if r is None:
            continue
        met = r.published == r.queued == r.ran == EXPECTED_PUBLISHED
        lines.append(
            f"{by_key[key].label}: {r.published} published, {r.ran} ran "
            f"(= {EXPECTED_PUBLISHED}) {verdict(met)}"
        )
    print("verdicts:")
    for line in lines:
        print(f"   {line}")


# -- main -----------------------------------------------------------------------------------------


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench dedupe",
        description="Tasks deduplicated when sent: LockedTask dedupe_on_enqueue vs celery-once "
        "vs celery-singleton (and a plain Task), enqueue + run throughput in interleaved rounds, "
        "then 1,000 sends of one call: messages published.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="shorter run (< 1 min): 500 tasks x 2 rounds"
    )
    parser.add_argument("--rounds", type=int, help="rounds (default 5; --quick 2)")
    parser.add_argument("--tasks", type=int, help="tasks per contender and round (default 2000)")
    parser.add_argument(
        "--duplicates", type=int, default=1000, help="sends of one call per contender (1000)"
    )
    parser.add_argument(
        "--warmup", type=int, default=50, help="unmeasured tasks per contender first (50)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds; no round starts that would end past it (default 170; --quick 45)",
    )
    args = parser.parse_args(list(argv))
    defaults = {"rounds": (2, 5), "tasks": (500, 2000), "budget": (45.0, 170.0)}
    fill_defaults(parser, args, defaults, ("rounds", "tasks", "warmup", "duplicates"))
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    prefix = f"bench-{secrets.token_hex(4)}"
    receivers = [
        (signals.task_prerun, celery_bench._on_prerun),
        (signals.task_postrun, celery_bench._on_postrun),
        (signals.task_failure, celery_bench._on_failure),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    entries = contenders()
    duplicates: Dict[str, Duplicates] = {}
    try:
        with redis_target() as target:
            plain = redis.Redis.from_url(target.url)
            app = make_app(Setup(target.url, prefix), entries)
            try:
                print(
                    f"dedupe benchmark: redis {server_version(plain)} ({target.description}), "
                    f"python {platform.python_version()}, celery {_pkg_version('celery')}, "
                    f"kombu {_pkg_version('kombu')}, redis-py {_pkg_version('redis')}, "
                    f"celery-once {_pkg_version('celery-once')}, "
                    f"celery-singleton {_pkg_version('celery-singleton')}"
                )
                print(
                    "   one Redis for broker and locks; an in-process solo worker per batch; "
                    "contender order rotated each round",
                    flush=True,
                )
                run = celery_bench.bench(
                    app,
                    entries,
                    plain,
                    rounds=args.rounds,
                    tasks=args.tasks,
                    warmup=args.warmup,
                    budget=args.budget,
                    started=started,
                )
                arg = 10**9  # never one of the throughput part's arguments
                for contender in entries:
                    if contender.available:
                        duplicates[contender.key] = send_duplicates(
                            app, contender, plain, arg, args.duplicates
                        )
                        arg += 1
            finally:
                release_clients(app)
                cleanup(plain, prefix)
                plain.close()
    except BenchError as exc:
        print(f"dedupe benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    print_throughput(run, args.tasks)
    if run.stopped_early:
        print(f"   {run.stopped_early}")
    print_duplicates(duplicates, entries, args.duplicates)
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    print_verdicts(run, duplicates)
    return 0
