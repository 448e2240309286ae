"""Instructions per task under callgrind: what LockedTask costs, whatever the machine's load.

``python -m bench instructions``. Wall-clock figures on a shared machine move by several
microseconds between runs; the instructions CPython executes do not. Each contender runs in a
subprocess of its own under ``valgrind --tool=callgrind`` (``bench/_tracer.py``: N tasks
through Celery's tracer, in-process, against one Redis), once with ``--low`` tasks and once
with ``--high``; instructions per task are (Ir(high) - Ir(low)) / (high - low), so the
interpreter's start-up, the imports and every first-call set-up cancel out. Contenders:
``plain``, ``floor``, ``locked`` (the registry's) and two knock-outs of ``locked`` that say
where its instructions go: the lock name as an f-string, and no engine (a lease held all
along: the Celery layer alone). Informational: there is no target on instructions (issue 20's
is on ``fastpath``'s wall-clock tasks/s); the exit code is 0 whatever the figures.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ._common import BenchError, new_prefix, redis_target, versions

#: (key, tracer contender, knock-out, label)
CONTENDERS = (
    ("plain", "plain", "-", "plain Task"),
    ("floor", "floor", "-", "floor (SET NX PX + DEL)"),
    ("locked", "locked", "-", "LockedTask"),
    ("fstring", "locked", "fstring", "LockedTask, lock name as an f-string"),
    ("no-engine", "locked", "no-engine", "LockedTask, no engine (held lease)"),
)

#: At most this many callgrind runs at once: the machine has 2 cores, shared (and each run
#: is one busy thread: more at once would only queue for the cores).
JOBS = 2
#: One run under callgrind takes ~20-30 s here, mostly start-up and imports; one still going
#: after this is stuck (a lock server that stopped answering), not slow.
RUN_TIMEOUT = 300.0

_COLLECTED = re.compile(r"^==\d+==\s+Collected\s*:\s*(\d+)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class Run:
    """One callgrind run: ``tasks`` tasks of one contender, ``ir`` instructions in all."""

    tasks: int
    ir: int


def collected(stderr: str) -> int:
    """The instructions callgrind counted (``==PID== Collected : N`` at exit)."""
    found = _COLLECTED.findall(stderr)
    if len(found) != 1:
        raise BenchError(f"expected one 'Collected :' line from callgrind, found {len(found)}")
    return int(found[0])


def per_task(low: Run, high: Run) -> float:
    """Instructions per task: the difference of two runs over their difference in tasks, so
    that what both runs do once (start-up, imports, first calls) cancels out."""
    if high.tasks <= low.tasks:
        raise ValueError(f"the high run needs more tasks than the low one ({high} vs {low})")
    return (high.ir - low.ir) / (high.tasks - low.tasks)


def callgrind_command(key: str, knockout: str, tasks: int, url: str, prefix: str) -> List[str]:
    return [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",  # only the total (on stderr) is read
        sys.executable,
        "-m",
        "bench._tracer",
        key,
        knockout,
        str(tasks),
        url,
        prefix,
    ]


def run_once(key: str, knockout: str, tasks: int, url: str) -> Run:
    """One contender's ``tasks`` tasks under callgrind, with a key prefix of its own."""
    env = dict(os.environ, PYTHONHASHSEED="0")  # the same dict layouts in every run
    root = str(Path(__file__).resolve().parent.parent)  # where ``bench`` is importable
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    command = callgrind_command(key, knockout, tasks, url, new_prefix())
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=RUN_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"{key} {knockout} x{tasks}: over {RUN_TIMEOUT:.0f} s") from exc
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise BenchError(f"{key} {knockout} x{tasks}: exit {done.returncode}\n{tail}")
    return Run(tasks, collected(done.stderr))


def measure(url: str, low: int, high: int, jobs: int) -> Dict[str, float]:
    """Instructions per task of every contender, ``jobs`` callgrind runs at a time."""
    runs = [(c, n) for c in CONTENDERS for n in (low, high)]
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(run_once, c[1], c[2], n, url) for c, n in runs]
        try:
            results = [future.result() for future in futures]
        except BenchError:
            pool.shutdown(cancel_futures=True)  # no new runs; those under way finish
            raise
    by_key: Dict[str, List[Run]] = {}
    for (contender, _), result in zip(runs, results):
        by_key.setdefault(contender[0], []).append(result)
    return {key: per_task(*pair) for key, pair in by_key.items()}


def valgrind_version() -> str:
    done = subprocess.run(["valgrind", "--version"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or "valgrind ?"


def kilo(value: float, sign: str = "") -> str:
    return f"{value / 1000:{sign}.1f}k"


def report(per: Dict[str, float], low: int, high: int) -> List[str]:
    """The table and the summary lines."""
    plain, floor, locked = per["plain"], per["floor"], per["locked"]
    lines = [
        f"instructions per task (callgrind Ir, (Ir({high}) - Ir({low})) / {high - low}; "
        "the same whatever the load)",
        f"   {'contender':<40} {'per task':>10} {'+ plain':>10}",
    ]
    for key, _, _, label in CONTENDERS:
        added = "" if key == "plain" else kilo(per[key] - plain, "+")
        lines.append(f"   {label:<40} {kilo(per[key]):>10} {added:>10}")
    lines += [
        "",
        "where LockedTask's instructions go (differences of the rows above, per task):",
        f"   the lock itself, over the floor's       {kilo(locked - floor, '+'):>10}",
        f"   the lock name (vs an f-string)           {kilo(locked - per['fstring'], '+'):>10}",
        f"   the engine and Redis I/O (vs no engine)  {kilo(locked - per['no-engine'], '+'):>10}",
        f"   the Celery layer alone (no engine)       {kilo(per['no-engine'] - plain, '+'):>10}",
        "",
        "summary (informational: no target on instructions; issue 20's target, >= 0.95x the "
        "floor's tasks/s, is on fastpath's wall clock):",
        f"   LockedTask: {kilo(locked)} instructions per task, {kilo(locked - floor, '+')} over "
        f"the floor's {kilo(floor)} ({locked / floor:.3f}x)",
        f"   LockedTask's lock work: {kilo(locked - plain, '+')} over plain, the floor's "
        f"{kilo(floor - plain, '+')} ({(locked - plain) / (floor - plain):.2f}x)",
    ]
    return lines


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench instructions",
        description="Instructions per task of plain, the floor, LockedTask and two knock-outs "
        "of it, counted by callgrind (valgrind) through Celery's tracer (~2-3 min).",
    )
    parser.add_argument("--low", type=int, default=200, help="tasks of the short run (200)")
    parser.add_argument("--high", type=int, default=1000, help="tasks of the long run (1000)")
    parser.add_argument(
        "--jobs",
        type=int,
        choices=range(1, JOBS + 1),
        default=JOBS,
        help=f"callgrind runs at a time (default and most: {JOBS})",
    )
    parser.add_argument("--quick", action="store_true", help="--low 100 --high 400")
    args = parser.parse_args(list(argv))
    if args.quick:
        args.low, args.high = 100, 400
    if args.low < 1 or args.high <= args.low:
        parser.error("need 1 <= --low < --high")
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if shutil.which("valgrind") is None:
        print("instructions: n/a: valgrind not found (Debian package valgrind)")
        return 0
    started = time.perf_counter()
    with redis_target() as target:
        print(
            f"{target.description}; {versions('celery', 'redis')}, {valgrind_version()}; "
            f"{len(CONTENDERS) * 2} callgrind runs, {args.jobs} at a time",
            flush=True,
        )
        try:
            per = measure(target.url, args.low, args.high, args.jobs)
        except BenchError as exc:
            print(f"instructions benchmark FAILED: {exc}", file=sys.stderr)
            return 1
    print("\n".join(report(per, args.low, args.high)))
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    return 0
