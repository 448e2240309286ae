"""Run the beat example: 2 beats + 2 workers for a while, then check that runs never overlapped.

    python -m examples.beat_singleton --seconds 20

Prints a summary, then one JSON line (``{"overlaps": 0, ...}``). Exit code 0 when no two runs
overlapped, 1 when some did, 2 when the example could not run (nothing ran, a process died).
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from examples.common import (
    Progress,
    Settings,
    Supervisor,
    add_server_arguments,
    add_worker_arguments,
    celery_command,
    cleanup,
    data_client,
    log_lines,
    options_from_args,
    run_example,
    show_progress,
    wait_for_workers,
    worker_command,
)

APP = "examples.beat_singleton.app"
SKIPPED = re.compile(
    r"WARNING.*task \S+\[(?P<task>[^\]]+)\] skipped: lock (?P<key>\S+) is held by task "
    r"(?P<holder>\S+) on (?P<host>\S+) pid (?P<pid>\S+)"
)
#: what a skip's WARNING adds once per burst of one key: the skips left out since the last one
LEFT_OUT = re.compile(r"\(and (?P<count>\d+) more skips of this key not logged")
SENT = re.compile(r"Scheduler: Sending due task rebuild-report")
STARTED = re.compile(r"beat: Starting\.\.\.")


@dataclass
class Options:
    seconds: float = 20.0
    beats: int = 2
    workers: int = 2
    concurrency: int = 2
    pool: str = "prefork"
    job_seconds: float = 5.0
    interval: float = 2.0


@dataclass
class Run:
    task_id: str
    start: float
    end: Optional[float]
    worker: str


@dataclass
class Summary:
    options: Options
    runs: list[Run]
    ticks_sent: dict[str, int]
    skipped: int
    skipped_signal: int
    example_skip: Optional[str]
    example_holder: Optional[str]
    overlaps: int
    overlaps_seen: int
    longest_gap: Optional[float]
    longest_start_to_start: Optional[float]
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.overlaps == 0 and self.overlaps_seen == 0

    @property
    def exit_code(self) -> int:
        if not self.ok:
            return 1
        return 0 if self.runs else 2

    def text(self) -> str:
        o = self.options
        completed = sum(1 for r in self.runs if r.end is not None)
        sent = ", ".join(f"{name} {n}" for name, n in self.ticks_sent.items())
        lines = [
            f"beat_singleton: {o.beats} beats firing every {o.interval:g}s, {o.workers} workers "
            f"x {o.concurrency} {o.pool} slots, job ~{o.job_seconds:g}s, for {o.seconds:g}s",
            f"  ticks sent by beat:       {sum(self.ticks_sent.values())} ({sent})",
            f"  runs:                     {len(self.runs)} ({completed} completed)",
            f"  skipped ticks:            {self.skipped_signal} (lock_duplicate signal); the "
            f"worker logs account for {self.skipped} (one WARNING per burst of skips of a key, "
            "with the count it left out; the last burst's count is not logged)",
        ]
        if self.example_skip:
            lines.append(f"    e.g. {self.example_skip}")
        if self.example_holder:
            position = next(
                (i for i, r in enumerate(self.runs, 1) if r.task_id == self.example_holder), None
            )
            where = f"run #{position} above" if position else "a run not recorded"
            lines.append(f"    holder {self.example_holder} is {where}")
        gap = "-" if self.longest_gap is None else f"{self.longest_gap:.2f}s"
        s2s = "-" if self.longest_start_to_start is None else f"{self.longest_start_to_start:.2f}s"
        lines += [
            f"  longest gap between runs: {gap} (idle time between the end of one run and the "
            f"start of the next; start to start: {s2s})",
            f"  overlaps:                 {self.overlaps} (pairs of runs whose start..end "
            f"intersect; the in-body gauge saw {self.overlaps_seen})",
        ]
        for i, run in enumerate(self.runs, 1):
            first = self.runs[0].start
            end = "still running" if run.end is None else f"{run.end - first:6.2f}s"
            lines.append(
                f"    run #{i}: {run.start - first:6.2f}s .. {end}  {run.task_id}  {run.worker}"
            )
        lines += [f"  note: {note}" for note in self.notes]
        lines.append("  OK: never two runs at once" if self.ok else "  FAILED: runs overlapped")
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "example": "beat_singleton",
            "runs": len(self.runs),
            "completed": sum(1 for r in self.runs if r.end is not None),
            "skipped": self.skipped,
            "skipped_signal": self.skipped_signal,
            "ticks_sent": sum(self.ticks_sent.values()),
            "longest_gap_s": None if self.longest_gap is None else round(self.longest_gap, 3),
            "overlaps": self.overlaps,
            "overlaps_seen": self.overlaps_seen,
            "ok": self.ok,
            "options": asdict(self.options),
        }


def run(
    options: Options,
    settings: Settings,
    *,
    progress: bool = False,
    keep_logs: bool = False,
) -> Summary:
    """Start workers and beats, let them run ``options.seconds``, stop them, summarize."""
    work_dir = Path(tempfile.mkdtemp(prefix=f"csl-{settings.namespace}-"))
    supervisor = Supervisor(work_dir)
    env = {
        **settings.env(),
        "EXAMPLE_JOB_SECONDS": str(options.job_seconds),
        "EXAMPLE_INTERVAL": str(options.interval),
    }
    store = data_client(settings.data)
    ns = settings.namespace
    summary: Optional[Summary] = None
    try:
        with Progress(options.seconds, "beat_singleton", "s", progress, integer=False) as bar:
            bar.update_to(0, f"starting {options.workers} workers")
            workers = [
                supervisor.start(
                    f"worker-{i}",
                    worker_command(
                        APP,
                        f"{ns}-w{i}@%h",
                        pool=options.pool,
                        concurrency=options.concurrency,
                        loglevel="INFO",
                    ),
                    env,
                )
                for i in range(1, options.workers + 1)
            ]
            wait_for_workers(supervisor, settings, options.workers)
            beats = [
                supervisor.start(
                    f"beat-{i}",
                    celery_command(
                        APP,
                        "beat",
                        f"--schedule={work_dir / f'beat-{i}-schedule'}",
                        f"--pidfile={work_dir / f'beat-{i}.pid'}",
                        "--loglevel=INFO",
                    ),
                    env,
                )
                for i in range(1, options.beats + 1)
            ]
            # the window starts once both beats run (importing Celery takes a while)
            wait_for_lines(supervisor, [b.log_path for b in beats], STARTED, timeout=60)
            started = time.monotonic()
            # bounded: at most seconds / 0.25 iterations
            while (elapsed := time.monotonic() - started) < options.seconds:
                supervisor.check()
                runs = store.llen(f"{ns}:runs")
                skips = int(store.get(f"{ns}:duplicates:skip") or 0)
                bar.update_to(elapsed, f"runs {runs}, skipped {skips}")
                time.sleep(min(0.25, options.seconds - elapsed))
            bar.update_to(options.seconds, "stopping")
        supervisor.stop(beats, timeout=10)
        # warm shutdown: a run in progress finishes (and records its end) before the worker exits
        supervisor.stop(workers, timeout=options.job_seconds + 10)
        stopped_at = time.time()
        summary = summarize(options, settings, supervisor, stopped_at)
        return summary
    finally:
        supervisor.stop(timeout=3)
        cleanup(settings)
        if (keep_logs or summary is None or not summary.ok) and any(work_dir.iterdir()):
            print(f"logs kept in {work_dir}", file=sys.stderr)
        else:
            shutil.rmtree(work_dir, ignore_errors=True)


def wait_for_lines(
    supervisor: Supervisor, paths: list[Path], pattern: re.Pattern[str], timeout: float
) -> None:
    """Block until every log in ``paths`` has a line matching ``pattern``."""
    deadline = time.monotonic() + timeout
    while not all(any(pattern.search(line) for line in log_lines([p])) for p in paths):
        supervisor.check()
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {pattern.pattern!r} in {paths} after {timeout}s")
        time.sleep(0.1)


def summarize(options: Options, settings: Settings, supervisor: Supervisor, now: float) -> Summary:
    ns = settings.namespace
    store = data_client(settings.data)
    runs: list[Run] = []
    for task_id in store.lrange(f"{ns}:runs", 0, -1):
        record = store.hgetall(f"{ns}:run:{task_id}")
        end = record.get("end")
        runs.append(
            Run(
                task_id=task_id,
                start=float(record["start"]),
                end=float(end) if end else None,
                worker=record.get("worker", "?"),
            )
        )
    runs.sort(key=lambda r: r.start)
    overlaps = sum(
        1
        for i, first in enumerate(runs)
        for second in runs[i + 1 :]
        if second.start < (first.end if first.end is not None else now)
    )
    gaps = [b.start - a.end for a, b in zip(runs, runs[1:]) if a.end is not None]
    starts = [b.start - a.start for a, b in zip(runs, runs[1:])]

    skipped, example, holder = 0, None, None
    for line in log_lines(supervisor.logs("worker-")):
        match = SKIPPED.search(line)
        if match:
            left_out = LEFT_OUT.search(line)
            skipped += 1 + (int(left_out.group("count")) if left_out else 0)
            if example is None:
                example, holder = line.strip(), match.group("holder")
    ticks = {
        path.stem: sum(1 for line in log_lines([path]) if SENT.search(line))
        for path in supervisor.logs("beat-")
    }
    notes = []
    if not runs:
        notes.append("nothing ran: see the worker logs")
    return Summary(
        options=options,
        runs=runs,
        ticks_sent=ticks,
        skipped=skipped,
        skipped_signal=int(store.get(f"{ns}:duplicates:skip") or 0),
        example_skip=example,
        example_holder=holder,
        overlaps=overlaps,
        overlaps_seen=int(store.get(f"{ns}:overlaps_seen") or 0),
        longest_gap=max(gaps, default=None),
        longest_start_to_start=max(starts, default=None),
        notes=notes,
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m examples.beat_singleton", description=__doc__.split("\n\n")[0]
    )
    d = Options()
    p.add_argument("--seconds", type=float, default=d.seconds, help="how long beats run")
    p.add_argument("--beats", type=int, default=d.beats, help="celery beat processes")
    add_worker_arguments(p, d)
    p.add_argument("--job-seconds", type=float, default=d.job_seconds, help="length of a run")
    p.add_argument("--interval", type=float, default=d.interval, help="beat schedule period")
    add_server_arguments(p)
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    options = options_from_args(Options, args)
    return run_example(
        args,
        "beat",
        lambda settings: run(
            options, settings, progress=show_progress(args), keep_logs=args.keep_logs
        ),
    )
