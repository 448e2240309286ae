"""Behaviour, not speed: LockedTask, celery-once and celery-singleton under the same faults.

``python -m bench behaviour [--quick] [--cap SECONDS] [--keep-logs]``

Every scenario runs real ``celery worker`` subprocesses (prefork, concurrency 2) against a
throwaway ``redis-server`` (broker, result backend, locks and the benchmark's own records).
Task bodies record their start and end (wall clock of this host) in Redis; "concurrent" means
one body started before another one with the same arguments had ended. See bench/README.md.

The workers' app is ``bench/_behaviourapp.py``; worker processes and observations are in
``bench/_behaviourphase.py``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import threading
import time
import uuid
from typing import Any, Callable, Dict, List, Tuple

from celery_singleton_lock.testing import RedisServer

from ._behaviourapp import ONCE_ERROR, QUEUE, SHORT, SINGLETON_ERROR
from ._behaviourphase import (
    Cell,
    Execution,
    Phase,
    Sent,
    Worker,
    describe_exc,
    executions,
    fate,
    lock_ttl,
    max_overlap,
    say,
    send,
    state_of,
    wait_until,
    with_args,
)

# -- scenarios ----------------------------------------------------------------------------------


def overlap_cell(runs: List[Execution], dup: str, extra: str = "") -> Cell:
    overlap = max_overlap(runs)
    starts = " ".join(f"{run.start - runs[0].start:+.1f}" for run in runs)
    raw = f"bodies={len(runs)} starts(s)=[{starts}] overlap={overlap:.1f}s dup: {dup}{extra}"
    if overlap > 0:
        return Cell(f"YES, {overlap:.1f} s together", raw)
    short = "skipped" if "not run" in dup else ("refused" if "refused" in dup else "not run")
    return Cell(f"NO (dup {short})", raw)


def scenario_short_lock(phase: Phase, plugin: str, run_id: str) -> Cell:
    """1. lock 2 s, body 6 s, duplicate sent 3 s after the first body started."""
    task, key, body = phase.task(plugin, "short"), f"s1-{SHORT[plugin]}-{run_id}", 6.0
    _, first = phase.start(task, key, with_args(key, body))
    time.sleep(max(0.0, first.start + 3.0 - time.time()))
    dup = send(task, with_args(key, body))
    phase.settle(key, first, body, [dup])
    runs = executions(phase.client, key)
    return overlap_cell(runs, fate(dup, runs), f" dup sent at +{3.0:.1f}s")


def scenario_bypass(phase: Phase, plugin: str, run_id: str) -> Cell:
    """3. a copy sent with ``app.send_task`` (as beat does) while the first body runs."""
    task, key, body = phase.task(plugin, "body"), f"s3-{SHORT[plugin]}-{run_id}", 5.0
    _, first = phase.start(task, key, with_args(key, body))
    time.sleep(max(0.0, first.start + 1.0 - time.time()))
    dup_id = uuid.uuid4().hex
    dup = Sent(dup_id, phase.app.send_task(task.name, args=with_args(key, body), task_id=dup_id))
    phase.settle(key, first, body, [dup])
    runs = executions(phase.client, key)
    return overlap_cell(runs, fate(dup, runs))


def scenario_retry(phase: Phase, plugin: str, run_id: str) -> Cell:
    """5. ``self.retry(countdown=0)`` in the body: does the retry attempt run?"""
    task, key = phase.task(plugin, "retrying"), f"s5-{SHORT[plugin]}-{run_id}"
    sent, first = phase.start(task, key, [key])
    retried = wait_until(
        lambda: [run for run in executions(phase.client, key) if run.retries >= 1], 12.0
    )
    time.sleep(0.5)
    state = state_of(sent.result)
    ttl = lock_ttl(phase.client, plugin, task, [key])
    seen = f"deliveries={phase.deliveries(sent.task_id)} state {state}"
    if retried:
        delay = retried[0].start - first.start
        raw = f"retry attempt started {delay:.1f}s after the first; {seen}; lock then: {ttl}"
        return Cell(f"retry ran (+{delay:.1f} s)", raw)
    raw = f"no retry attempt within 12s; {seen}; lock then: {ttl}"
    return Cell(f"retry NEVER ran; lock {ttl}", raw)


def scenario_visibility(phase: Phase, plugin: str, run_id: str) -> Cell:
    """6. what the caller of a duplicate gets: ``apply_async`` then ``get(timeout=10)``."""
    task, key, body = phase.task(plugin, "body"), f"s6-{SHORT[plugin]}-{run_id}", 4.0
    phase.start(task, key, with_args(key, body))
    time.sleep(0.5)
    notes = []
    cell = ""
    variants: List[Tuple[str, Dict[str, Any]]] = [("default", {})]
    if plugin == "celery-once":
        variants.append(("graceful", {"once": {"graceful": True}}))
    for label, options in variants:
        dup = send(task, with_args(key, body), **options)
        if dup.error is not None:
            outcome = f"apply_async raises {describe_exc(dup.error)}"
            short = f"apply_async raises {type(dup.error).__name__}"
            if len(variants) > 1:
                short = type(dup.error).__name__
        else:
            kind = type(dup.result).__name__
            same = " (the running task's id)" if dup.folded else ""
            began = time.monotonic()
            try:
                value = dup.result.get(timeout=10)
            except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
                took = time.monotonic() - began
                state = state_of(dup.result)
                if type(exc).__name__ == "TimeoutError":
                    outcome = f"{kind}{same}; get() times out after {took:.1f}s, state {state}"
                    short = f"get() hangs, {state}"
                else:
                    outcome = f"{kind}{same}; get() raises {describe_exc(exc)} after {took:.1f}s"
                    short = f"get() raises {type(exc).__name__}"
            else:
                took = time.monotonic() - began
                outcome = f"{kind}{same}; get() returns {value!r} after {took:.1f}s"
                short = f"get() -> {value!r}"[:24] + f" ({took:.0f} s)"
                if dup.folded:
                    short = f"get() -> 1st task's result ({took:.0f} s)"
                elif label == "graceful":
                    short = f"get() -> {value!r}"
        notes.append(f"{label}: {outcome}")
        cell = f"{cell}; graceful: {short}" if cell else short
    phase.settle(key, executions(phase.client, key)[0], body, [])
    return Cell(cell, "; ".join(notes))


def scenario_redelivery(phase: Phase, plugin: str, run_id: str) -> Cell:
    """4. acks_late, visibility_timeout=2, body 6 s, 2 workers: redelivered copy concurrent?"""
    task, key, body = phase.task(plugin, "late"), f"s4-{SHORT[plugin]}-{run_id}", 6.0
    sent, first = phase.start(task, key, with_args(key, body))
    phase.settle(key, first, body, [])
    time.sleep(1.0)
    runs = executions(phase.client, key)
    deliveries = phase.deliveries(sent.task_id)
    overlap = max_overlap(runs)
    starts = " ".join(f"{run.start - runs[0].start:+.1f}" for run in runs)
    raw = (
        f"deliveries={deliveries} bodies={len(runs)} starts(s)=[{starts}] "
        f"overlap={overlap:.1f}s final state {state_of(sent.result)}"
    )
    if deliveries < 2:
        return Cell(f"no redelivery seen ({deliveries})", raw)
    if overlap > 0:
        return Cell(f"YES, {len(runs)} bodies/{deliveries} deliv.", raw)
    return Cell(f"NO, {len(runs)} body/{deliveries} deliv.", raw)


def scenario_crash(
    phase: Phase, plugins: List[str], run_id: str, cap: float, cells: Dict[str, Cell]
) -> None:
    """2. kill -9 the whole worker mid-body; fresh worker; a duplicate every 1 s.

    Each plugin gets a worker (and a queue) of its own, so the three run side by side.
    """
    body = 20.0
    keys = {plugin: f"s2-{SHORT[plugin]}-{run_id}" for plugin in plugins}
    tasks = {plugin: phase.task(plugin, "body") for plugin in plugins}
    queues = {plugin: f"{QUEUE}-{SHORT[plugin]}" for plugin in plugins}

    def worker(plugin: str) -> Worker:
        made = Worker(phase.base_url, phase.broker_db, phase.log_dir, queue=queues[plugin])
        phase.workers.append(made)
        return made.launch()

    olds = {plugin: worker(plugin) for plugin in plugins}
    for old in olds.values():
        old.wait_ready()
    firsts = {}
    for plugin in plugins:
        sent = send(tasks[plugin], with_args(keys[plugin], body), queue=queues[plugin])
        if sent.refused:
            cells[plugin] = Cell("error", fate(sent, []))
    for plugin in plugins:
        if plugin not in cells:
            firsts[plugin] = phase.first_start(keys[plugin])
    time.sleep(1.0)
    for plugin in firsts:
        if executions(phase.client, keys[plugin])[0].end is not None:
            raise RuntimeError(f"{plugin}: the first body ended before the kill")
    ttl_at_kill = {p: lock_ttl(phase.client, p, tasks[p], [keys[p], body]) for p in firsts}
    killed: Dict[str, float] = {}
    fresh: Dict[str, Worker] = {}
    for plugin in firsts:
        killed[plugin] = time.time()
        olds[plugin].kill_group()
    for plugin in firsts:
        fresh[plugin] = worker(plugin)
    say(f"  [2] workers killed (kill -9, whole group); fresh ones starting; cap {cap:.0f}s")
    recovered: Dict[str, float] = {}
    sends: Dict[str, int] = dict.fromkeys(firsts, 0)
    last_dup: Dict[str, str] = {}
    start = min(killed.values(), default=time.time())
    while time.time() - start < cap and len(recovered) < len(firsts):
        tick = time.time()
        for plugin in firsts:
            fresh[plugin].is_ready()
            if plugin in recovered:
                continue
            runs = executions(phase.client, keys[plugin])
            runs = [run for run in runs if run.start > killed[plugin]]
            if runs:
                recovered[plugin] = runs[0].start - killed[plugin]
                continue
            dup = send(tasks[plugin], with_args(keys[plugin], body), queue=queues[plugin])
            sends[plugin] += 1
            last_dup[plugin] = fate(dup, [])
        time.sleep(max(0.0, tick + 1.0 - time.time()))
    for plugin in firsts:
        ready = fresh[plugin].ready_at
        common = (
            f"lock TTL at kill {ttl_at_kill[plugin]}; fresh worker ready "
            f"{f'{ready - killed[plugin]:.1f}s after kill' if ready else 'never'}; "
            f"duplicates sent {sends[plugin]}"
        )
        if plugin in recovered:
            cells[plugin] = Cell(
                f"dup ran {recovered[plugin]:.1f} s after kill",
                f"first duplicate body started {recovered[plugin]:.1f}s after kill; {common}",
            )
        else:
            ttl = lock_ttl(phase.client, plugin, tasks[plugin], [keys[plugin], body])
            cells[plugin] = Cell(
                f">{cap:.0f} s; lock TTL left: {ttl}",
                f"no duplicate body within {cap:.0f}s; lock TTL then {ttl}; {common}; "
                f"last duplicate: {last_dup.get(plugin, '-')}",
            )


# -- report -------------------------------------------------------------------------------------

SCENARIOS = [
    ("1", "lock 2 s < body 6 s, dup at +3 s: overlap?"),
    ("2", "kill -9 worker mid-body: a dup runs after"),
    ("3", "send_task copy during a run: overlap?"),
    ("4", "acks_late redelivery (vis. 2 s): overlap?"),
    ("5", "self.retry(countdown=0) in the body"),
    ("6", "caller of a duplicate gets"),
]

LEGEND = """\
Legend (every cell is measured in this run; raw numbers above):
  1  lock TTL 2 s, body 6 s, duplicate (same args, through apply_async) sent 3 s after the
     first body started. "YES, x s together": the duplicate's body ran while the first one
     was still running (its start, recorded in Redis, came before the first body's end),
     for x seconds.
     "NO (dup skipped)": the duplicate was delivered to a worker that did not run its body;
     "NO (dup refused)": apply_async refused to send it.
  2  default lock settings, body 20 s, one worker per plugin: seconds from the kill -9 of
     the whole worker (main process and pool) 1 s into the body until the first duplicate
     body started; duplicates sent every 1 s through apply_async, a fresh worker started
     right after the kill (its start-up time is included). ">N s": none ran within the cap;
     then the lock's remaining TTL as Redis reports it ("held, no expiry" = PTTL -1).
  3  default lock settings, body 5 s; 1 s into it the same call is sent by
     app.send_task(name, args) (what beat does), bypassing the plugin's apply_async; cells
     as in 1.
  4  task with acks_late=True; kombu restores the unacked message after 2 s, 2 workers x 2
     slots. "deliv." = times a worker logged receiving that task id; "bodies" = bodies run;
     YES if two bodies ran at the same time.
  5  bind=True task whose first attempt calls self.retry(countdown=0): did the retry attempt
     run within 12 s; "lock" = the lock's TTL after that (still held => stuck key).
  6  duplicate sent through apply_async 0.5 s into the first body (4 s), then
     AsyncResult.get(timeout=10): what the caller sees, and after how long. celery-once is
     also called with once={'graceful': True} ("graceful:"). A cell "get() hangs, PENDING"
     would mean get() timed out with the duplicate still PENDING."""


def render(cells: Dict[str, Dict[str, Cell]], plugins: List[str]) -> str:
    texts = {
        number: [cells.get(number, {}).get(p, Cell("not run")).text for p in plugins]
        for number, _title in SCENARIOS
    }
    widths = [
        max(len(plugin), *(len(row[i]) for row in texts.values()))
        for i, plugin in enumerate(plugins)
    ]
    label_width = max(len(f"{number} {title}") for number, title in SCENARIOS)

    def line(label: str, values: List[str]) -> str:
        cols = " | ".join(f"{v:<{w}}" for v, w in zip(values, widths))
        return f"{label:<{label_width}} | {cols}".rstrip()

    lines = [
        line("scenario", plugins),
        "-" * label_width + "-+-" + "-+-".join("-" * w for w in widths),
    ]
    for number, title in SCENARIOS:
        lines.append(line(f"{number} {title}", texts[number]))
    lines.append("")
    lines.append("raw:")
    for number, _title in SCENARIOS:
        for plugin in plugins:
            cell = cells.get(number, {}).get(plugin)
            if cell is not None and cell.raw:
                lines.append(f"  [{number}] {plugin}: {cell.raw}")
    return "\n".join(lines)


# -- main ---------------------------------------------------------------------------------------


def run_per_plugin(
    number: str,
    scenario: Callable[[Phase, str, str], Cell],
    phase: Phase,
    plugins: List[str],
    run_id: str,
    cells: Dict[str, Dict[str, Cell]],
) -> None:
    for plugin in plugins:
        began = time.monotonic()
        try:
            cell = scenario(phase, plugin, run_id)
        except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
            cell = Cell(f"error: {type(exc).__name__}", describe_exc(exc))
        cells.setdefault(number, {})[plugin] = cell
        say(f"  [{number}] {plugin}: {cell.text}  ({time.monotonic() - began:.1f}s)")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench behaviour", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="scenario 2 capped at 20 s")
    parser.add_argument("--cap", type=float, help="scenario 2 cap in seconds (default 40)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the worker logs")
    options = parser.parse_args(argv)
    cap = options.cap or (20.0 if options.quick else 40.0)

    plugins = ["LockedTask"]
    missing = {"celery-once": ONCE_ERROR, "celery-singleton": SINGLETON_ERROR}
    for name, error in missing.items():
        if error is None:
            plugins.append(name)
        else:
            say(f"{name}: n/a ({error})")
    import celery

    say(
        f"behaviour of {', '.join(plugins)}; celery {celery.__version__}, "
        f"{os.cpu_count()} cpus; scenario 2 cap {cap:.0f}s"
    )
    run_id = uuid.uuid4().hex[:6]
    log_dir = tempfile.mkdtemp(prefix="bench-behaviour-")
    cells: Dict[str, Dict[str, Cell]] = {}
    crash_cells: Dict[str, Cell] = {}
    phases: List[Phase] = []
    began = time.monotonic()
    failed = False
    try:
        with RedisServer.running() as server:
            base = f"redis://127.0.0.1:{server.port}"
            say(f"throwaway redis-server on 127.0.0.1:{server.port}; worker logs in {log_dir}")
            crash = Phase(base, 3, log_dir)
            normal = Phase(base, 1, log_dir)
            phases += [crash, normal]

            def crash_run() -> None:
                try:
                    scenario_crash(crash, plugins, run_id, cap, crash_cells)
                except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
                    for plugin in plugins:
                        crash_cells.setdefault(
                            plugin, Cell(f"error: {type(exc).__name__}", describe_exc(exc))
                        )
                finally:
                    crash.kill_workers()

            # scenario 2 mostly waits: it runs beside the others, on a broker db of its own
            crash_thread = threading.Thread(target=crash_run, name="crash", daemon=True)
            crash_thread.start()
            normal.start_workers(2)
            say(f"  2 workers ready ({time.monotonic() - began:.0f}s)")
            run_per_plugin("1", scenario_short_lock, normal, plugins, run_id, cells)
            run_per_plugin("3", scenario_bypass, normal, plugins, run_id, cells)
            run_per_plugin("5", scenario_retry, normal, plugins, run_id, cells)
            run_per_plugin("6", scenario_visibility, normal, plugins, run_id, cells)
            normal.kill_workers()

            late = Phase(base, 2, log_dir, redeliver=True)
            phases.append(late)
            late.start_workers(2)
            say(f"  2 redelivery workers ready ({time.monotonic() - began:.0f}s)")
            run_per_plugin("4", scenario_redelivery, late, plugins, run_id, cells)
            late.kill_workers()

            crash_thread.join(timeout=cap + 120)
            cells["2"] = crash_cells
            for plugin, cell in crash_cells.items():
                say(f"  [2] {plugin}: {cell.text}")
    except Exception as exc:  # noqa: BLE001  (recorded as the outcome)
        failed = True
        say(f"behaviour run failed: {describe_exc(exc)}; worker logs kept in {log_dir}")
    finally:
        for phase in phases:
            phase.kill_workers()
    print()
    print(render(cells, plugins))
    print()
    print(LEGEND)
    print(f"\n(total {time.monotonic() - began:.0f}s)")
    if options.keep_logs or failed:
        print(f"worker logs: {log_dir}")
    else:
        shutil.rmtree(log_dir, ignore_errors=True)
    return 1 if failed else 0
