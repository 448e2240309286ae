"""Fast-path benchmark: what each of LockedTask's fast-path pieces is worth, in ONE worker.

``python -m bench fastpath [--quick]``. Every contender is a no-op task registered on one app;
each round enqueues ``--cycles`` cycles, a cycle being one task of every contender in a fresh
random order, then ONE in-process solo worker drains the queue (FIFO), so the contenders run
alternately, task by task, in the same process, under the same machine weather. A task's
worker time is the time from the previous task's ``task_postrun`` to its own: the broker
fetch and ack, the worker loop, every hook and the body. Cycles much slower than the round's
median (another process took the CPU) are dropped whole, for every contender alike.

The LockedTask variants are bench-only subclasses of the package's classes (the package is
not changed); each has its own redis-py client and counts its own lock round trips.

This module is ``bench.fastpath``; ``celery`` below is the real package (absolute imports).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import platform
import random
import secrets
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import redis
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker

from celery_singleton_lock.arguments import ArgumentKeyer
from celery_singleton_lock.celery import LockedTask
from celery_singleton_lock.celery.config.servers import make_client
from celery_singleton_lock.engine import RedisLocker
from celery_singleton_lock.testing import RedisServer

from ._common import (
    RoundTripCounter,
    Target,
    counting_connection_class,
    fill_defaults,
    median,
    quartiles,
    redis_target,
    server_version,
    verdict,
)
from .celery import (
    HEALTH_CHECK,
    BenchError,
    Contender,
    Setup,
    _pkg_version,
    build_floor,
    build_locked,
    build_once,
    build_plain,
    build_singleton,
    cleanup,
    make_app,
    noop,
    release_clients,
)

#: Targets from issue 9.
MIN_WORTH_PERCENT = 3.0  # a piece stays if it is worth this much of plain no-op throughput
MIN_RATIO_TO_FLOOR = 0.95
LOCK_ROUND_TRIPS_PER_TASK = 2

#: A cycle slower than this many times the round's median cycle is dropped (preemption).
SLOW_CYCLE = 1.5

#: A drain whose tasks have not all ended by then is a failure.
MIN_DRAIN_TIMEOUT = 60.0


# -- bench-only variants of the engine ----------------------------------------------------------


class PooledLocker(RedisLocker):
    """(b) Acquire and release through the client itself: one pool checkout per command,
    no kept connection (everything through redis-py's public API)."""

    def _run(self, script: Any, key: str, keys: Any, args: Any, *, pinned: bool = False) -> Any:
        return super()._run(script, key, keys, args, pinned=False)


class FStringKeyer(ArgumentKeyer):
    """(n) The lock name as an f-string of the positional arguments: no binding, encoding or
    hash, so (n) vs (a) is what the canonical lock name costs per task. Not a usable lock
    name (``str()``-based, keyword arguments ignored); enough for the bench's ``noop(i)``."""

    def name(self, args: Optional[Sequence[Any]], kwargs: Optional[Any]) -> str:
        return f"{self.task_name}:{args}"


def build_variant(
    locker_class: type,
    counter: RoundTripCounter,
    app: Celery,
    name: str,
    setup: Setup,
    *,
    keyer_class: Optional[type] = None,
) -> Any:
    """A LockedTask whose locker is a ``locker_class`` with a counting client of its own,
    made as the plugin makes its locker (``make_client`` + the app's prefix); with
    ``keyer_class``, its keyer is made one (an ``ArgumentKeyer`` subclass)."""
    options = {"connection_class": counting_connection_class(setup.url, counter)}
    locker = locker_class(make_client(setup.url, options), prefix=f"{setup.prefix}-lock")
    attributes: Dict[str, Any] = {"lock_locker": locker, "bench_locker": locker}
    if keyer_class is not None:

        def _resolve_options(cls: Any, app: Any, task_name: str) -> Any:
            resolved = super(base, cls)._resolve_options(app, task_name)
            resolved.keyer.__class__ = keyer_class
            return resolved

        attributes["_resolve_options"] = classmethod(_resolve_options)
    base = type(f"Bench{locker_class.__name__}Task", (LockedTask,), attributes)
    return app.task(name=name, base=base)(noop)


@dataclass
class Spec:
    key: str
    label: str
    locker: Optional[type] = None  # a LockedTask variant with this locker class
    keyer: Optional[type] = None  # ... and this keyer class
    build: Optional[Callable[[Celery, str, Setup], Any]] = None


SPECS = [
    Spec("plain", "(g) plain Celery Task", build=build_plain),
    Spec("floor", "(f) floor: SET NX PX + DEL", build=build_floor),
    Spec("locked", "(a) LockedTask as is", build=build_locked),
    Spec("locked2", "(a') LockedTask as is, A/A", locker=RedisLocker),
    Spec("pooled", "(b) no kept connections", locker=PooledLocker),
    Spec("fstring", "(n) lock name as an f-string", locker=RedisLocker, keyer=FStringKeyer),
    Spec("once", "celery-once QueueOnce", build=build_once),
    Spec("singleton", "celery-singleton Singleton", build=build_singleton),
]
LOCKED_KEYS = ("locked", "locked2", "pooled", "fstring")

#: (label, with the piece, without it): the piece's worth is the throughput it adds.
PIECES = [
    ("A/A: the same code twice (resolution)", "locked", "locked2"),
    ("kept connections, acquire and release (a vs b)", "locked", "pooled"),
    ("cost: the lock name, vs an f-string (n vs a)", "fstring", "locked"),
]


def contenders(keys: Optional[Sequence[str]] = None) -> List[Contender]:
    entries = []
    for spec in SPECS:
        if keys is not None and spec.key not in keys:
            continue
        pattern: Optional[Callable[[str, str], str]] = None
        if spec.key == "floor":
            pattern = lambda prefix, name: f"{prefix}-floor:*"  # noqa: E731
        elif spec.key == "once":
            pattern = lambda prefix, name: f"qo_{name}*"  # noqa: E731
        elif spec.key == "singleton":
            pattern = lambda prefix, name: f"{prefix}-singleton:*"  # noqa: E731
        elif spec.key in LOCKED_KEYS:
            pattern = lambda prefix, name: f"{prefix}-lock*"  # noqa: E731
        contender = Contender(spec.key, spec.label, build_plain, lock_pattern=pattern)
        if spec.build is not None:
            contender.build = spec.build
        else:
            contender.build = partial(
                build_variant, spec.locker, contender.counter, keyer_class=spec.keyer
            )
        entries.append(contender)
    return entries


@dataclass
class Servers:
    """Clients of the broker's Redis and of the locks' Redis (the same server by default)."""

    broker: redis.Redis
    locks: redis.Redis


# -- one drain: one worker runs every contender's tasks, alternately ------------------------------


class Recorder:
    """What the worker thread records of one drain, through Celery's task signals."""

    def __init__(self, index_of: Dict[str, int], total: int, counters: List[Any]) -> None:
        self.index_of = index_of
        self.total = total
        self.counters = counters
        self.kinds: List[int] = []  # contender index of each task, in the order they ended
        self.pre: List[float] = []
        self.post: List[float] = []
        self.failed: List[Tuple[str, str]] = []
        self.sent_first: List[int] = []  # per contender: requests sent before the first task
        self.sent_last: List[int] = []  # ... and by the end of the last one
        self.finished = threading.Event()
        self._prerun_at = 0.0

    def _sent(self) -> List[int]:
        return [len(counter) for counter in self.counters]

    def prerun(self, sender: Any = None, **_: Any) -> None:
        if sender is not None and sender.name in self.index_of:
            if not self.sent_first:
                self.sent_first = self._sent()
            self._prerun_at = time.perf_counter()

    def postrun(self, sender: Any = None, **_: Any) -> None:
        index = self.index_of.get(sender.name) if sender is not None else None
        if index is None:
            return
        now = time.perf_counter()
        self.kinds.append(index)
        self.pre.append(self._prerun_at)
        self.post.append(now)
        if len(self.post) == self.total:
            self.sent_last = self._sent()
            self.finished.set()

    def failure(self, sender: Any = None, exception: Any = None, **_: Any) -> None:
        if sender is not None and sender.name in self.index_of:
            self.failed.append((sender.name, repr(exception)))


def drain(app: Celery, recorder: Recorder, timeout: float) -> None:
    """Start a solo worker in this process, wait until every task has ended, stop it."""
    receivers = [
        (signals.task_prerun, recorder.prerun),
        (signals.task_postrun, recorder.postrun),
        (signals.task_failure, recorder.failure),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="CRITICAL"):
            if not recorder.finished.wait(timeout):
                raise BenchError(
                    f"{len(recorder.post)}/{recorder.total} tasks ended within {timeout:.0f} s"
                )
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)


# -- one round ----------------------------------------------------------------------------------


@dataclass
class RoundResult:
    worker_us: Dict[str, float]  # mean worker time per task, kept cycles
    in_task_us: Dict[str, float]  # median prerun..postrun
    enqueue_us: Dict[str, float]  # mean apply_async time, kept cycles
    worker_sent: Dict[str, List[str]]
    enqueue_sent: Dict[str, List[str]]
    cycles_kept: int
    cycles: int
    out_of_order: int


def _kept(cycle_totals: List[float]) -> List[bool]:
    limit = SLOW_CYCLE * median(cycle_totals)
    return [total <= limit for total in cycle_totals]


def run_round(
    app: Celery,
    usable: List[Contender],
    servers: Servers,
    first_arg: int,
    cycles: int,
    rng: random.Random,
) -> RoundResult:
    n = len(usable)
    queue_key = f"{app.main}:{app.conf.task_default_queue}"
    if servers.broker.llen(queue_key):
        raise BenchError(f"queue {queue_key} not empty before a round")
    enqueue = [[0.0] * n for _ in range(cycles)]
    order: List[int] = []
    gc.collect()
    for contender in usable:
        contender.counter.reset()
    arg = first_arg
    for cycle in range(cycles):
        for index in rng.sample(range(n), n):
            task = usable[index].task
            start = time.perf_counter()
            task.apply_async((arg,))
            enqueue[cycle][index] = time.perf_counter() - start
            order.append(index)
            arg += 1
    enqueue_sent = {c.key: list(c.counter.sent) for c in usable}
    total = cycles * n
    queued = servers.broker.llen(queue_key)
    if queued != total:
        raise BenchError(f"{queued} messages queued, {total} sent")

    for contender in usable:
        contender.counter.reset()
    index_of = {c.task.name: i for i, c in enumerate(usable)}
    recorder = Recorder(index_of, total, [c.counter for c in usable])
    gc.collect()
    drain(app, recorder, max(MIN_DRAIN_TIMEOUT, total / 100))
    if recorder.failed:
        name, error = recorder.failed[0]
        raise BenchError(f"{len(recorder.failed)} tasks failed, first {name}: {error}")
    for contender in usable:
        if contender.lock_pattern is not None:
            pattern = contender.lock_pattern(app.main, contender.task.name)
            if any(True for _ in servers.locks.scan_iter(match=pattern, count=1000)):
                raise BenchError(f"{contender.key}: lock keys left after the round")

    # worker time of task j: from the end of task j-1 to its own end
    intervals = [0.0] + [b - a for a, b in zip(recorder.post, recorder.post[1:])]
    cycle_totals = [sum(intervals[c * n : (c + 1) * n]) for c in range(cycles)]
    kept = _kept(cycle_totals[1:])  # the first cycle holds the worker's start: never kept
    kept.insert(0, False)
    per: List[List[float]] = [[] for _ in range(n)]
    for j, index in enumerate(recorder.kinds):
        if kept[j // n]:
            per[index].append(intervals[j])
    in_task: List[List[float]] = [[] for _ in range(n)]
    for index, pre, post in zip(recorder.kinds, recorder.pre, recorder.post):
        in_task[index].append(post - pre)
    enqueue_kept = _kept([sum(row) for row in enqueue])
    worker_sent: Dict[str, List[str]] = {}
    for i, contender in enumerate(usable):
        sent = contender.counter.sent[recorder.sent_first[i] : recorder.sent_last[i]]
        worker_sent[contender.key] = [name for name in sent if name != HEALTH_CHECK]
    return RoundResult(
        worker_us={c.key: sum(per[i]) / len(per[i]) * 1e6 for i, c in enumerate(usable)},
        in_task_us={c.key: median(in_task[i]) * 1e6 for i, c in enumerate(usable)},
        enqueue_us={
            c.key: sum(row[i] for row, keep in zip(enqueue, enqueue_kept) if keep)
            / sum(enqueue_kept)
            * 1e6
            for i, c in enumerate(usable)
        },
        worker_sent=worker_sent,
        enqueue_sent=enqueue_sent,
        cycles_kept=sum(kept),
        cycles=cycles,
        out_of_order=sum(1 for a, b in zip(order, recorder.kinds) if a != b),
    )


def warm_up(app: Celery, usable: List[Contender], servers: Servers, cycles: int) -> int:
    """Unmeasured cycles (imports, connections, scripts); a competitor failing here is n/a.

    Returns the next unused task argument."""
    arg = 0
    for _ in range(cycles):
        for contender in usable:
            if contender.task is None:
                continue
            try:
                contender.task.apply_async((arg,))
            except Exception as exc:  # a competitor failing to enqueue: n/a
                if contender.key not in ("once", "singleton"):
                    raise
                contender.reason = f"failed to enqueue: {type(exc).__name__}: {exc}"
                contender.task = None
            arg += 1
    live = [c for c in usable if c.task is not None]
    queue_key = f"{app.main}:{app.conf.task_default_queue}"
    total = servers.broker.llen(queue_key)
    index_of = {c.task.name: i for i, c in enumerate(live)}
    # competitors dropped mid-way left some messages: count what is queued
    recorder = Recorder(index_of, total, [c.counter for c in live])
    drain(app, recorder, MIN_DRAIN_TIMEOUT)
    failed = dict(reversed(recorder.failed))
    for contender in live:
        error = failed.get(contender.task.name)
        if error is None:
            continue
        if contender.key not in ("once", "singleton"):
            raise BenchError(f"{contender.key} failed in warm-up: {error}")
        contender.reason = f"failed in warm-up: {error}"
        contender.task = None
    return arg


# -- the benchmark and its report ----------------------------------------------------------------


@dataclass
class Run:
    entries: List[Contender]
    rounds: List[RoundResult] = field(default_factory=list)
    stopped_early: str = ""


def bench(
    app: Celery,
    entries: List[Contender],
    servers: Servers,
    *,
    rounds: int,
    cycles: int,
    warmup: int,
    budget: float,
    started: float,
    seed: int,
) -> Run:
    run = Run(entries)
    next_arg = warm_up(app, [c for c in entries if c.available], servers, warmup)
    usable = [c for c in entries if c.available]
    rng = random.Random(seed)
    round_times: List[float] = []
    for round_no in range(rounds):
        elapsed = time.perf_counter() - started
        if round_times and elapsed + max(round_times) > budget:
            run.stopped_early = (
                f"stopped after {round_no} of {rounds} rounds: another would end past the "
                f"{budget:.0f} s budget (--budget)"
            )
            break
        round_start = time.perf_counter()
        result = run_round(app, usable, servers, next_arg, cycles, rng)
        next_arg += cycles * len(usable)
        run.rounds.append(result)
        round_times.append(time.perf_counter() - round_start)
        base = result.worker_us["plain"]
        print(
            f"   round {round_no + 1}/{rounds} ({round_times[-1]:.1f} s, "
            f"{result.cycles_kept}/{result.cycles} cycles kept): us/task "
            + ", ".join(
                f"{c.key} {result.worker_us[c.key]:.0f}"
                + ("" if c.key == "plain" else f" ({result.worker_us[c.key] - base:+.0f})")
                for c in usable
            ),
            flush=True,
        )
    return run


def _med_iqr(values: List[float], fmt: str = ".1f") -> str:
    q1, q3 = quartiles(values)
    return f"{median(values):{fmt}} [{q1:{fmt}}..{q3:{fmt}}]"


def _per_task(counts: Counter[str], n: int) -> str:
    if not counts:
        return "-"
    return " + ".join(f"{count / n:g} {name}" for name, count in counts.most_common())


def _trips(rounds: List[RoundResult], key: str, which: str) -> Tuple[List[float], Counter[str]]:
    per_round, counts = [], Counter[str]()
    for r in rounds:
        sent = getattr(r, which)[key]
        per_round.append(len(sent) / r.cycles)
        counts.update(sent)
    return per_round, counts


def print_results(run: Run) -> None:
    rounds = run.rounds
    usable = [c for c in run.entries if c.available]
    kept = sum(r.cycles_kept for r in rounds)
    cycles = sum(r.cycles for r in rounds)
    print(
        f"\n1. per contender: {rounds[0].cycles} tasks each per round, alternated in random "
        f"order within each cycle,\n   {len(rounds)} rounds, {kept}/{cycles} cycles kept; "
        "median over rounds [IQR of the rounds]"
    )
    print(
        f"   {'contender':<30} {'us/task':>7} {'x plain tasks/s':>21} {'+us vs plain':>20} "
        f"{'in task':>7} {'enqueue':>7} {'total':>6}  lock RTs worker/enqueue"
    )
    for c in run.entries:
        if not c.available:
            print(f"   {c.label:<30} {'n/a':>7}  {c.reason}")
            continue
        worker = [r.worker_us[c.key] for r in rounds]
        ratio = [r.worker_us["plain"] / r.worker_us[c.key] for r in rounds]
        extra = [r.worker_us[c.key] - r.worker_us["plain"] for r in rounds]
        enqueue = [r.enqueue_us[c.key] for r in rounds]
        total = [r.worker_us[c.key] + r.enqueue_us[c.key] for r in rounds]
        in_task = [r.in_task_us[c.key] for r in rounds]
        w_trips, _ = _trips(rounds, c.key, "worker_sent")
        e_trips, _ = _trips(rounds, c.key, "enqueue_sent")
        trips = "/".join(f"{t:g}" for t in sorted(set(w_trips)))
        trips += " / " + "/".join(f"{t:g}" for t in sorted(set(e_trips)))
        if c.lock_pattern is None:
            trips = "- (no lock)"
        print(
            f"   {c.label:<30} {median(worker):>7.0f} {_med_iqr(ratio, '.3f'):>21} "
            f"{_med_iqr(extra, '.0f'):>20} {median(in_task):>7.0f} {median(enqueue):>7.0f} "
            f"{median(total):>6.0f}  {trips}"
        )
    print(
        "   us/task: worker time per task (previous task's end to its own end: broker fetch, "
        "worker loop, hooks, body),\n   mean over kept cycles; x plain: plain's us/task over "
        "the contender's, per round; in task: median task_prerun..\n   task_postrun; enqueue: "
        "apply_async, no worker running; total: enqueue + us/task (the cost of a task when the\n"
        "   lock is taken at enqueue time); lock RTs: requests sent per task by the contender's "
        "own lock client,\n   a/b when rounds differ (health-check PINGs of an idle connection "
        "not counted)"
    )
    print("\n   lock requests per task (all rounds):")
    for c in usable:
        if c.lock_pattern is None:
            continue
        n = sum(r.cycles for r in rounds)
        _, w = _trips(rounds, c.key, "worker_sent")
        _, e = _trips(rounds, c.key, "enqueue_sent")
        print(f"   {c.label:<30} worker: {_per_task(w, n)}; enqueue: {_per_task(e, n)}")


def print_pieces(run: Run) -> None:
    rounds = run.rounds
    available = {c.key for c in run.entries if c.available}
    print(
        f"\n2. what each piece is worth: per round, (plain us/task) x (1/us with - 1/us without), "
        f"in % of plain\n   no-op throughput, and the us per task it saves; median [IQR] over "
        f"{len(rounds)} rounds; keep if >= {MIN_WORTH_PERCENT:g}%"
    )
    print(f"   {'piece':<46} {'% of plain tasks/s':>22} {'us/task saved':>18}  verdict")
    for label, with_key, without_key in PIECES:
        if with_key not in available or without_key not in available:
            continue
        worth = [
            100 * r.worker_us["plain"] * (1 / r.worker_us[with_key] - 1 / r.worker_us[without_key])
            for r in rounds
        ]
        saved = [r.worker_us[without_key] - r.worker_us[with_key] for r in rounds]
        if label.startswith("A/A"):
            what = "(noise)"
        elif label.startswith("cost:"):
            what = "(what it costs)"
        else:
            what = "keep" if median(worth) >= MIN_WORTH_PERCENT else "drop"
        print(f"   {label:<46} {_med_iqr(worth, '+.2f'):>22} {_med_iqr(saved, '+.0f'):>18}  {what}")


def print_verdicts(run: Run) -> None:
    rounds = run.rounds
    by_key = {c.key: c for c in run.entries}
    lines = []
    if by_key["floor"].available:
        for key in ("locked", "pooled"):
            of_floor = [r.worker_us["floor"] / r.worker_us[key] for r in rounds]
            lines.append(
                f"{by_key[key].label}: {_med_iqr(of_floor, '.3f')}x the floor's tasks/s "
                f"(>= {MIN_RATIO_TO_FLOOR}) {verdict(median(of_floor) >= MIN_RATIO_TO_FLOOR)}"
            )
    others = [k for k in ("once", "singleton") if by_key[k].available]
    for key in ("locked", "pooled"):
        if not others:
            lines.append("end to end: n/a (neither celery-once nor celery-singleton usable)")
            break
        # per round: the better competitor's total over ours (>= 1: at least level)
        level = [
            min(r.worker_us[k] + r.enqueue_us[k] for k in others)
            / (r.worker_us[key] + r.enqueue_us[key])
            for r in rounds
        ]
        lines.append(
            f"end to end (enqueue + run), {by_key[key].label}: the better of "
            f"{'/'.join(others)} takes {_med_iqr(level, '.3f')}x its time (>= 1) "
            f"{verdict(median(level) >= 1)}"
        )
    for key in LOCKED_KEYS:
        if not by_key[key].available:
            continue
        w, _ = _trips(rounds, key, "worker_sent")
        e, _ = _trips(rounds, key, "enqueue_sent")
        exact = all(t == LOCK_ROUND_TRIPS_PER_TASK for t in w) and not any(e)
        trips = "/".join(f"{t:g}" for t in sorted(set(w)))
        lines.append(
            f"{by_key[key].label}: {trips} lock round trips per task in the worker, "
            f"{'/'.join(f'{t:g}' for t in sorted(set(e)))} at enqueue (= 2 and 0, every round) "
            f"{verdict(exact)}"
        )
    print("\nverdicts:")
    for line in lines:
        print(f"   {line}")


# -- main ---------------------------------------------------------------------------------------


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench fastpath",
        description="LockedTask's fast-path pieces (kept connections, deferred release, "
        "Script bypass, caches) against bench-only variants without them, the floor, a plain "
        "Task, celery-once and celery-singleton, alternated task by task in ONE solo worker.",
    )
    parser.add_argument("--quick", action="store_true", help="2 rounds x 200 cycles (< 1 min)")
    parser.add_argument("--rounds", type=int, help="rounds (default 5; --quick 2)")
    parser.add_argument(
        "--cycles", type=int, help="tasks per contender and round (default 1000; --quick 200)"
    )
    parser.add_argument("--warmup", type=int, default=30, help="unmeasured cycles first (30)")
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds; no round starts that would end past it (default 300; --quick 60)",
    )
    parser.add_argument(
        "--separate-lock-server",
        action="store_true",
        help="locks on a throwaway redis-server of their own (default: the broker's Redis)",
    )
    parser.add_argument("--seed", type=int, default=9, help="seed of the task order (9)")
    parser.add_argument(
        "--only",
        help="comma-separated contender keys (plain is always in): "
        + ",".join(spec.key for spec in SPECS),
    )
    args = parser.parse_args(list(argv))
    defaults = {"rounds": (2, 5), "cycles": (200, 1000), "budget": (60.0, 300.0)}
    fill_defaults(parser, args, defaults, ("rounds", "cycles", "warmup"))
    if args.only:
        keys = {key.strip() for key in args.only.split(",")} | {"plain"}
        unknown = keys - {spec.key for spec in SPECS}
        if unknown:
            parser.error(f"unknown contenders: {', '.join(sorted(unknown))}")
        args.only = keys
    return args


@contextlib.contextmanager
def lock_target(broker: Target, separate: bool) -> Iterator[Target]:
    """The Redis of the locks: the broker's, or a throwaway ``redis-server`` of its own."""
    if not separate:
        yield broker
        return
    with RedisServer.running() as server:
        yield Target(server.url, f"locks: throwaway redis-server on 127.0.0.1:{server.port}")


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    prefix = f"bench-{secrets.token_hex(4)}"
    entries = contenders(args.only)
    lockers: List[RedisLocker] = []
    try:
        with redis_target() as target, lock_target(target, args.separate_lock_server) as locks:
            servers = Servers(redis.Redis.from_url(target.url), redis.Redis.from_url(locks.url))
            app = make_app(Setup(locks.url, prefix), entries)
            # make_app puts the broker on the locks' URL: move it (read at worker start)
            app.conf.broker_url = target.url
            lockers = [
                c.task.bench_locker for c in entries if c.available and c.key in LOCKED_KEYS[1:]
            ]
            try:
                for c in entries:
                    if not c.available and c.key not in ("once", "singleton"):
                        raise BenchError(f"{c.key} cannot be built: {c.reason}")
                where = "one Redis for broker and locks"
                if args.separate_lock_server:
                    where = f"broker and locks on two Redis servers ({locks.description})"
                print(
                    f"fastpath benchmark: redis {server_version(servers.broker)} "
                    f"({target.description}), python {platform.python_version()}, "
                    f"celery {_pkg_version('celery')}, kombu {_pkg_version('kombu')}, "
                    f"redis-py {_pkg_version('redis')}, "
                    f"celery-once {_pkg_version('celery-once')}, "
                    f"celery-singleton {_pkg_version('celery-singleton')}"
                )
                print(
                    f"   {where}; ONE in-process solo worker per round runs every contender, "
                    f"alternated task by task; {args.warmup} unmeasured cycles first; "
                    f"seed {args.seed}",
                    flush=True,
                )
                run = bench(
                    app,
                    entries,
                    servers,
                    rounds=args.rounds,
                    cycles=args.cycles,
                    warmup=args.warmup,
                    budget=args.budget,
                    started=started,
                    seed=args.seed,
                )
            finally:
                for locker in lockers:
                    locker.connections.close()
                    locker.client.close()
                release_clients(app)
                for client in {id(c): c for c in (servers.broker, servers.locks)}.values():
                    cleanup(client, prefix)
                    client.close()
    except BenchError as exc:
        print(f"fastpath benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    if not run.rounds:
        print("fastpath benchmark: no round ran", file=sys.stderr)
        return 1
    print_results(run)
    print_pieces(run)
    out_of_order = sum(r.out_of_order for r in run.rounds)
    if out_of_order:
        print(f"   note: {out_of_order} tasks ran out of their enqueue order")
    if run.stopped_early:
        print(f"   {run.stopped_early}")
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    print_verdicts(run)
    return 0
