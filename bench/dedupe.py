"""Enqueue-dedupe benchmark: tasks locked when sent, ours vs celery-once vs celery-singleton.

``python -m bench dedupe [--quick]``. Contenders on one Redis (broker and locks): a plain
Celery ``Task`` (the yardstick), ``LockedTask`` with ``dedupe_on_enqueue=True``, celery-once
``QueueOnce`` and celery-singleton ``Singleton``, i.e. the three that stop a duplicate before
it reaches the queue. Two parts, in one run:

1. enqueue + run: the paired loop of ``bench/_worker.py`` (``--tasks`` distinct calls of each
   contender per round, alternated task by task at the producer and in ONE solo worker); a
   task's whole cost is enqueue + worker, and the ratios are per round.
2. ``--duplicates`` (1,000) sends of ONE call (same arguments) while no worker runs: messages
   published (``before_task_publish`` signal) and queued (``LLEN`` of the queue), what the
   callers got, microseconds and lock round trips per send; then a worker drains the queue
   and the bodies that ran are counted. The answer for a deduplicating contender is 1.

This module is ``bench.dedupe``; ``celery`` below is the real package (absolute imports).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from celery import signals

from ._common import HEALTH_CHECK, BenchError, fill_defaults, med_iqr, median, verdict
from ._paired import Paired
from ._report import ahead_of, print_requests, print_side_by_side, print_verdicts
from ._worker import Entry, Lane, drain_queue, run_worker_bench, worker_options

KEYS = ("plain", "dedupe", "once", "singleton")
COMPETITORS = ("once", "singleton")

#: What each deduplicating contender must publish for ``--duplicates`` sends of one call.
EXPECTED_PUBLISHED = 1


@dataclass
class Duplicates:
    published: int = 0  # before_task_publish of this task
    queued: int = 0  # LLEN of the queue after the sends
    ran: int = 0  # bodies run once a worker drained the queue
    send_us: float = 0.0  # per send
    trips: Counter[str] = field(default_factory=Counter)  # lock requests, all sends
    outcomes: Counter[str] = field(default_factory=Counter)  # what the callers got


def _outcome(result: Any, first_id: Optional[str]) -> str:
    if result is None:
        return "None"
    if getattr(result, "id", None) == first_id:
        return "the first call's AsyncResult"
    return "a new AsyncResult"


def send_duplicates(lane: Lane, entry: Entry, arg: int, sends: int) -> Duplicates:
    """``sends`` x ``apply_async((arg,))`` with no worker running, then drain and count."""
    task = entry.task
    if lane.broker.llen(lane.queue_key):
        raise BenchError(f"queue {lane.queue_key} not empty before the duplicate sends")
    out = Duplicates()

    def on_publish(sender: Any = None, **_: Any) -> None:
        if sender == task.name:
            out.published += 1

    signals.before_task_publish.connect(on_publish, weak=False)
    entry.counter.reset()
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
    out.trips.update(name for name in entry.counter.sent if name != HEALTH_CHECK)
    out.queued = lane.broker.llen(lane.queue_key)
    recorder = drain_queue(lane, [entry])
    out.ran = len(recorder.post)
    if recorder.failed:
        raise BenchError(f"{entry.key}: duplicate sends: {recorder.failed[0][1]}")
    if entry.left_locks(lane.locks, lane.prefix):
        raise BenchError(f"{entry.key}: lock keys left after the duplicate sends")
    return out


def part_two(sends: int) -> Any:
    def run(lane: Lane) -> Dict[str, Duplicates]:
        arg = 10**9  # never one of the throughput part's arguments
        results = {}
        for entry in lane.usable:
            results[entry.key] = send_duplicates(lane, entry, arg, sends)
            arg += 1
        return results

    return run


def print_versus(paired: Paired, lane: Lane) -> None:
    by_key = lane.by_key()
    print("\n   end to end (enqueue + run), per round: the competitor's total over ours (> 1: ours")
    print("   faster), median [IQR]")
    for key in COMPETITORS:
        if key in paired.keys and "dedupe" in paired.keys:
            ratios = ahead_of(paired, "dedupe", key, "total")
            print(f"   LockedTask dedupe vs {by_key[key].label:<28} {med_iqr(ratios, '.2f')}")


def print_duplicates(results: Dict[str, Duplicates], lane: Lane, sends: int) -> None:
    print(f"\n2. {sends:,} sends of one call (same arguments), no worker running, then drained")
    print(
        f"   {'contender':<32} {'published':>9} {'queued':>6} {'ran':>5} {'us/send':>7} "
        f"{'lock trips/send':>15}  callers got"
    )
    for entry in lane.entries:
        r = results.get(entry.key)
        if r is None:
            print(f"   {entry.label:<32} {'n/a':>9}  {entry.reason}")
            continue
        trips = sum(r.trips.values()) / sends
        got = ", ".join(f"{n} {what}" for what, n in r.outcomes.most_common())
        print(
            f"   {entry.label:<32} {r.published:>9} {r.queued:>6} {r.ran:>5} {r.send_us:>7.0f} "
            f"{trips:>15g}  {got}"
        )
    print(
        "   published: before_task_publish signals; queued: LLEN of the queue after the "
        "sends; ran: bodies run by the\n   worker that drained it; lock trips: the "
        "contender's own lock client, all sends / sends"
    )


def verdicts(paired: Paired, lane: Lane, results: Dict[str, Duplicates]) -> List[str]:
    by_key = lane.by_key()
    lines = []
    for key in COMPETITORS:
        other = by_key[key]
        if key not in paired.keys:
            lines.append(f"LockedTask dedupe ahead of {other.label}: n/a ({other.reason})")
            continue
        ahead = median(ahead_of(paired, "dedupe", key, "total"))
        lines.append(
            f"LockedTask dedupe ahead of {other.label}, enqueue + run: {ahead:.2f}x its "
            f"tasks/s (> 1) {verdict(ahead > 1)}"
        )
    for key in ("dedupe", *COMPETITORS):
        r = results.get(key)
        if r is None:
            continue
        met = r.published == r.queued == r.ran == EXPECTED_PUBLISHED
        lines.append(
            f"{by_key[key].label}: {r.published} published, {r.ran} ran "
            f"(= {EXPECTED_PUBLISHED}) {verdict(met)}"
        )
    return lines


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench dedupe",
        description="Tasks deduplicated when sent: LockedTask dedupe_on_enqueue vs celery-once "
        "vs celery-singleton (and a plain Task), enqueue + run alternated task by task, then "
        "1,000 sends of one call: messages published.",
    )
    defaults = {"rounds": (2, 5), "tasks": (500, 2000), "budget": (45.0, 170.0)}
    worker_options(parser, "tasks", defaults)
    parser.add_argument(
        "--duplicates", type=int, default=1000, help="sends of one call per contender (1000)"
    )
    args = parser.parse_args(list(argv))
    fill_defaults(parser, args, defaults, ("rounds", "tasks", "warmup", "duplicates"))
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    try:
        lane, paired, duplicates = run_worker_bench(
            "dedupe", KEYS, args, args.tasks, then=part_two(args.duplicates)
        )
    except BenchError as exc:
        print(f"dedupe benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    assert duplicates is not None
    print_side_by_side(paired, lane)
    print_requests(paired, lane)
    print_versus(paired, lane)
    print_duplicates(duplicates, lane, args.duplicates)
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    print_verdicts(verdicts(paired, lane, duplicates))
    return 0
