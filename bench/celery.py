"""Celery benchmark: no-op tasks through a real solo worker, plain vs locked task bases.

``python -m bench celery [--quick]``. Contenders (``bench/_contenders.py``): a plain Celery
``Task``, the floor (the least a lock taken at run time can cost), ``LockedTask`` (default
options), ``LockedTask`` whose every call is a skipped duplicate (its lock held all along: a
skip against a no-op run), celery-once ``QueueOnce`` and celery-singleton ``Singleton``, all
on one Redis (broker and locks), alternated task by task in ONE in-process solo worker
(``bench/_worker.py``, the paired loop of ``bench/_paired.py``), ``--tasks`` of each per round.

This module is ``bench.celery``; ``celery`` below is the real package (absolute imports).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional, Sequence

from ._common import BenchError, fill_defaults, median, verdict
from ._paired import Paired
from ._report import ahead_of, print_requests, print_side_by_side, print_verdicts, trips_verdict
from ._worker import Lane, run_worker_bench, worker_options

KEYS = ("plain", "floor", "locked", "skipped", "once", "singleton")

#: Target from the spec: LockedTask's tasks/s at least this share of a plain task's.
MIN_RATIO_TO_PLAIN = 0.95
#: Target from issue 29: a skipped duplicate costs no more than a no-op task's run.
MIN_SKIP_TO_RUN = 1.0


def verdicts(paired: Paired, lane: Lane) -> List[str]:
    by_key = lane.by_key()
    ratio = median(paired.ratios("worker", "plain", "locked"))
    lines = [
        f"LockedTask {ratio:.3f}x plain tasks/s (>= {MIN_RATIO_TO_PLAIN}) "
        f"{verdict(ratio >= MIN_RATIO_TO_PLAIN)}"
    ]
    if by_key["floor"].available:
        floor = median(paired.ratios("worker", "plain", "floor"))
        of_floor = median(paired.ratios("worker", "floor", "locked"))
        lines.append(
            f"floor (1 waited + 1 unwaited round trip, no other work) {floor:.3f}x plain: the "
            f"ceiling of any lock taken at run time here; LockedTask {of_floor:.3f}x the "
            "floor's tasks/s"
        )
    for key in ("once", "singleton"):
        other = by_key[key]
        if not other.available:
            lines.append(f"LockedTask ahead of {other.label}: n/a ({other.reason})")
            continue
        ahead = median(ahead_of(paired, "locked", key, "worker"))
        ours, theirs = (median(paired.values("total", k)) for k in ("locked", key))
        lines.append(
            f"LockedTask ahead of {other.label}: {ahead:.3f}x its tasks/s (> 1) "
            f"{verdict(ahead > 1)}  [counting enqueue too: {ours:.0f} vs {theirs:.0f} us/task]"
        )
    if by_key["skipped"].available:
        # us of a no-op locked run over us of a skip, per round: > 1 when the skip is cheaper
        skip = median(paired.ratios("worker", "locked", "skipped"))
        skip_plain = median(paired.ratios("worker", "plain", "skipped"))
        saved = median(paired.differences("worker", "locked", "skipped"))
        lines.append(
            f"a skipped duplicate {skip:.3f}x the tasks/s of a no-op LockedTask run "
            f"(>= {MIN_SKIP_TO_RUN:g}; {saved:+.0f} us/task vs the run; {skip_plain:.3f}x plain) "
            f"{verdict(skip >= MIN_SKIP_TO_RUN)}"
        )
    lines.append(trips_verdict(paired, lane, "locked"))
    return lines


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench celery",
        description="No-op tasks through a real solo worker on a Redis broker: plain Task vs "
        "floor vs LockedTask vs celery-once vs celery-singleton, alternated task by task.",
    )
    defaults = {"rounds": (2, 5), "tasks": (500, 2000), "budget": (55.0, 170.0)}
    worker_options(parser, "tasks", defaults)
    args = parser.parse_args(list(argv))
    fill_defaults(parser, args, defaults, ("rounds", "tasks", "warmup"))
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    try:
        lane, paired, _ = run_worker_bench("celery", KEYS, args, args.tasks)
    except BenchError as exc:
        print(f"celery benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    print_side_by_side(paired, lane)
    print_requests(paired, lane)
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    print_verdicts(verdicts(paired, lane))
    return 0
