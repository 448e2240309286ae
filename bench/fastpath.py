"""Fast-path benchmark: what each of LockedTask's fast-path pieces is worth, in ONE worker.

``python -m bench fastpath [--quick]``. The contenders of ``bench celery`` and bench-only
variants of LockedTask (``bench/_contenders.py``: the same code again, no kept connections,
an f-string lock name), alternated task by task in ONE in-process solo worker (the paired
loop, ``bench/_worker.py``). A piece's worth is the throughput the variant without it loses.
With ``--separate-lock-server`` the locks of every contender go to a Redis of their own.

This module is ``bench.fastpath``; ``celery`` below is the real package (absolute imports).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from . import _chart as chart
from ._common import BenchError, fill_defaults, med_iqr, median, verdict
from ._paired import Paired
from ._report import ahead_of, print_requests, print_side_by_side, print_verdicts, trips_verdict
from ._worker import Lane, run_worker_bench, worker_options

KEYS = ("plain", "floor", "locked", "locked2", "metrics", "pooled", "fstring", "once", "singleton")
CHART_KEYS = ("plain", "floor", "locked", "once", "singleton")
LOCKED_KEYS = ("locked", "locked2", "metrics", "pooled", "fstring")

#: Targets from issue 9.
MIN_WORTH_PERCENT = 3.0  # a piece stays if it is worth this much of plain no-op throughput
MIN_RATIO_TO_FLOOR = 0.95

#: (label, with the piece, without it): the piece's worth is the throughput it adds.
PIECES = [
    ("A/A: the same code twice (resolution)", "locked", "locked2"),
    ("kept connections, acquire and release (locked vs pooled)", "locked", "pooled"),
    ("cost: the lock name, vs an f-string (fstring vs locked)", "fstring", "locked"),
    ("cost: metrics on (metrics vs locked2, own lockers)", "metrics", "locked2"),
]


def print_pieces(paired: Paired) -> None:
    print(
        "\n2. what each piece is worth: per round, (plain us/task) x (1/us with - 1/us without), "
        f"in % of plain\n   no-op throughput, and the us per task it saves; median [IQR] over "
        f"{len(paired.rounds)} rounds; keep if >= {MIN_WORTH_PERCENT:g}%"
    )
    print(f"   {'piece':<56} {'% of plain tasks/s':>22} {'us/task saved':>18}  verdict")
    for label, with_key, without_key in PIECES:
        if with_key not in paired.keys or without_key not in paired.keys:
            continue
        plain = paired.values("worker", "plain")
        with_us = paired.values("worker", with_key)
        without_us = paired.values("worker", without_key)
        worth = [100 * p * (1 / a - 1 / b) for p, a, b in zip(plain, with_us, without_us)]
        saved = [b - a for a, b in zip(with_us, without_us)]
        if label.startswith("A/A"):
            what = "(noise)"
        elif label.startswith("cost:"):
            what = "(what it costs)"
        else:
            what = "keep" if median(worth) >= MIN_WORTH_PERCENT else "drop"
        print(f"   {label:<56} {med_iqr(worth, '+.2f'):>22} {med_iqr(saved, '+.0f'):>18}  {what}")


def verdicts(paired: Paired, lane: Lane) -> List[str]:
    by_key = lane.by_key()
    ours = [key for key in ("locked", "pooled") if key in paired.keys]
    lines = []
    if "floor" in paired.keys:
        for key in ours:
            of_floor = paired.ratios("worker", "floor", key)
            lines.append(
                f"{by_key[key].label}: {med_iqr(of_floor, '.3f')}x the floor's tasks/s "
                f"(>= {MIN_RATIO_TO_FLOOR}) {verdict(median(of_floor) >= MIN_RATIO_TO_FLOOR)}"
            )
    others = [k for k in ("once", "singleton") if k in paired.keys]
    for key in ours:
        if not others:
            lines.append("end to end: n/a (neither celery-once nor celery-singleton usable)")
            break
        # per round: the better competitor's total over ours (>= 1: at least level)
        level = [min(pair) for pair in zip(*(ahead_of(paired, key, k, "total") for k in others))]
        lines.append(
            f"end to end (enqueue + run), {by_key[key].label}: the better of "
            f"{'/'.join(others)} takes {med_iqr(level, '.3f')}x its time (>= 1) "
            f"{verdict(median(level) >= 1)}"
        )
    lines += [trips_verdict(paired, lane, key) for key in LOCKED_KEYS if key in paired.keys]
    return lines


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench fastpath",
        description="LockedTask's fast-path pieces against bench-only variants without them, "
        "the floor, a plain Task, celery-once and celery-singleton, alternated task by task "
        "in ONE solo worker.",
    )
    defaults = {"rounds": (2, 5), "cycles": (200, 1000), "budget": (60.0, 300.0)}
    worker_options(parser, "cycles", defaults)
    parser.add_argument(
        "--separate-lock-server",
        action="store_true",
        help="locks on a throwaway redis-server of their own (default: the broker's Redis)",
    )
    parser.add_argument(
        "--chart",
        type=Path,
        help="also draw where the time per task goes (plain, floor, LockedTask, peers) as an "
        "SVG at this path (needs matplotlib, in the bench extra)",
    )
    parser.add_argument(
        "--only",
        help="comma-separated contender keys (plain is always in): " + ",".join(KEYS),
    )
    args = parser.parse_args(list(argv))
    fill_defaults(parser, args, defaults, ("rounds", "cycles", "warmup"))
    args.keys = KEYS
    if args.only:
        wanted = {key.strip() for key in args.only.split(",")} | {"plain"}
        unknown = wanted - set(KEYS)
        if unknown:
            parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
        args.keys = tuple(key for key in KEYS if key in wanted)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    try:
        lane, paired, _ = run_worker_bench(
            "fastpath",
            args.keys,
            args,
            args.cycles,
            separate_lock_server=args.separate_lock_server,
        )
    except BenchError as exc:
        print(f"fastpath benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    print_side_by_side(paired, lane)
    print_requests(paired, lane)
    print_pieces(paired)
    if args.chart is not None:
        labels = {key: entry.label for key, entry in lane.by_key().items()}
        chart.draw(paired, CHART_KEYS, labels, args.chart)
        print(f"\nchart: {args.chart}")
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    print_verdicts(verdicts(paired, lane))
    return 0
