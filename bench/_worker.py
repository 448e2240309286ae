"""Worker level of the paired loop: contenders alternate task by task in ONE solo worker.

Every contender of the registry is a no-op task on one app. Each round enqueues ``cycles``
cycles, a cycle being one task of every contender in a fresh random order, with no worker
running (each ``apply_async`` timed alone: stage ``enqueue``); then ONE in-process solo
worker (``celery.contrib.testing.worker.start_worker``) drains the queue in that order. From
Celery's task signals, per task: ``worker``, the time from the previous task's
``task_postrun`` to its own (broker fetch and ack, worker loop, every hook and the body);
``in task``, ``task_prerun`` to ``task_postrun`` (the contender's hooks and the body);
``cpu``, this process's CPU over ``worker``. ``total`` = enqueue + worker: a task's whole
cost when the lock is taken at enqueue time. Lock requests are counted per contender on its
own lock client, at enqueue and in the worker. Every round is checked: all tasks queued,
all ended, none failed, no lock key left; otherwise :class:`BenchError` stops the run.

This module imports the real ``celery`` package (absolute imports).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

import redis
from celery import Celery, signals
from celery.contrib.testing.worker import start_worker

from ._builds import WorkerSetup
from ._common import (
    HEALTH_CHECK,
    BenchError,
    RoundTripCounter,
    delete_matching,
    lock_target,
    new_prefix,
    redis_target,
    server_version,
    versions,
)
from ._contenders import Contender, pick
from ._paired import Cycle, Paired, Round, run_rounds, shuffled_orders, time_calls

#: A drain whose tasks have not all ended by then is a failure.
MIN_DRAIN_TIMEOUT = 60.0

T = TypeVar("T")


@dataclass
class Entry:
    """A contender as built on the lane's app."""

    contender: Contender
    counter: RoundTripCounter = field(default_factory=RoundTripCounter)
    task: Any = None
    reason: str = ""  # why it is not measured

    @property
    def key(self) -> str:
        return self.contender.key

    @property
    def label(self) -> str:
        return self.contender.label

    @property
    def available(self) -> bool:
        return self.task is not None

    def left_locks(self, client: redis.Redis, prefix: str) -> int:
        if self.contender.lock_keys is None:
            return 0
        pattern = self.contender.lock_keys(prefix, self.task.name)
        return sum(1 for _ in client.scan_iter(match=pattern, count=1000))


@dataclass
class Lane:
    """One app, its contenders, the broker's Redis and the locks' (the same by default)."""

    app: Celery
    prefix: str
    entries: List[Entry]
    broker: redis.Redis
    locks: redis.Redis
    where: str  # what the servers are, for the header

    @property
    def usable(self) -> List[Entry]:
        return [e for e in self.entries if e.available]

    @property
    def queue_key(self) -> str:
        return f"{self.app.main}:{self.app.conf.task_default_queue}"

    def by_key(self) -> Dict[str, Entry]:
        return {e.key: e for e in self.entries}


def make_app(prefix: str, broker_url: str, lock_url: str) -> Celery:
    app = Celery(prefix, broker=broker_url, set_as_current=False)
    app.conf.update(
        task_ignore_result=True,
        task_default_queue=f"{prefix}-tasks",
        # every broker key (queue, bindings, unacked) under the bench prefix
        broker_transport_options={"global_keyprefix": f"{prefix}:"},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        singleton_lock_url=lock_url,
        singleton_lock_prefix=f"{prefix}-lock",
    )
    return app


@contextlib.contextmanager
def worker_lane(keys: Sequence[str], *, separate_lock_server: bool = False) -> Iterator[Lane]:
    """The contenders of ``keys`` on one app, on ``$REDIS_URL`` or a throwaway server (and
    the locks on a throwaway server of their own with ``separate_lock_server``); a
    contender that cannot be built is n/a with the reason. Every key the run wrote is
    deleted at the end, every lock client closed."""
    prefix = new_prefix()
    with redis_target() as target, lock_target(target, separate_lock_server) as locks:
        app = make_app(prefix, target.url, locks.url)
        closers: List[Callable[[], None]] = []
        entries = [Entry(contender) for contender in pick(keys, "worker")]
        for entry in entries:
            setup = WorkerSetup(app, locks.url, prefix, entry.counter, closers)
            entry.reason = entry.contender.missing()
            if entry.reason:
                continue
            try:
                assert entry.contender.worker is not None
                entry.task = entry.contender.worker(setup, f"{prefix}.{entry.key}")
            except Exception as exc:  # noqa: BLE001  (cannot be built: shown as n/a)
                entry.reason = f"{type(exc).__name__}: {exc}"
        app.finalize()
        where = target.description
        if separate_lock_server:
            where = f"broker: {target.description}; {locks.description}"
        clients = {target.url: redis.Redis.from_url(target.url)}
        clients.setdefault(locks.url, redis.Redis.from_url(locks.url))
        try:
            yield Lane(app, prefix, entries, clients[target.url], clients[locks.url], where)
        finally:
            for close in closers:
                close()
            for client in clients.values():
                # all under the prefix, but celery-once's keys: qo_<task name>
                delete_matching(client, [f"{prefix}*", f"qo_{prefix}.*"])
                client.close()


# -- one drain: the worker runs every contender's tasks, alternately ------------------------------


class Recorder:
    """What the worker thread records of one drain, through Celery's task signals."""

    def __init__(self, index_of: Dict[str, int], total: int, counters: List[Any]) -> None:
        self.index_of = index_of
        self.total = total
        self.counters = counters
        self.kinds: List[int] = []  # contender index of each task, in the order they ended
        self.pre: List[float] = []
        self.post: List[float] = []
        self.cpu: List[float] = []  # process_time at each task_postrun
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
        self.cpu.append(time.process_time())
        if len(self.post) == self.total:
            self.sent_last = self._sent()
            self.finished.set()

    def failure(self, sender: Any = None, exception: Any = None, **_: Any) -> None:
        if sender is not None and sender.name in self.index_of:
            self.failed.append((sender.name, repr(exception)))

    def stages(self, contenders: int) -> Dict[str, List[Cycle]]:
        """``worker``, ``in task`` and ``cpu`` per task, cut into cycles of ``contenders``
        tasks in the order they ran; the first cycle (the worker's start) is left out."""
        stages: Dict[str, List[Cycle]] = {"worker": [], "in task": [], "cpu": []}
        for start in range(contenders, len(self.post) - contenders + 1, contenders):
            span = range(start, start + contenders)
            kinds = [self.kinds[j] for j in span]
            stages["worker"].append(
                [(k, self.post[j] - self.post[j - 1]) for k, j in zip(kinds, span)]
            )
            stages["in task"].append([(k, self.post[j] - self.pre[j]) for k, j in zip(kinds, span)])
            stages["cpu"].append([(k, self.cpu[j] - self.cpu[j - 1]) for k, j in zip(kinds, span)])
        return stages


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


def drain_queue(lane: Lane, entries: List[Entry], timeout: float = MIN_DRAIN_TIMEOUT) -> Recorder:
    """Drain whatever is queued, the tasks of ``entries``, through a fresh solo worker."""
    index_of = {e.task.name: i for i, e in enumerate(entries)}
    recorder = Recorder(index_of, lane.broker.llen(lane.queue_key), [e.counter for e in entries])
    if recorder.total:
        drain(lane.app, recorder, timeout)
    return recorder


def _send(task: Any) -> Callable[[int], Any]:
    return lambda arg: task.apply_async((arg,))


# -- warm-up and rounds ------------------------------------------------------------------------


def warm_up(lane: Lane, cycles: int) -> int:
    """Unmeasured cycles (imports, connections, scripts). A third-party contender failing
    here, or leaving locks behind, is shown as n/a with the reason; one of ours stops the run.

    Returns the next unused task argument."""
    arg = 0
    for _ in range(cycles):
        for entry in lane.usable:
            try:
                entry.task.apply_async((arg,))
            except Exception as exc:  # a competitor failing to enqueue: n/a
                if not entry.contender.needs:
                    raise
                entry.reason = f"failed to enqueue: {type(exc).__name__}: {exc}"
                entry.task = None
            arg += 1
    live = lane.usable
    recorder = drain_queue(lane, live)  # a competitor dropped mid-way left some messages
    failed = dict(reversed(recorder.failed))  # the first error of each task
    for entry in live:
        error = failed.get(entry.task.name)
        if error is None and entry.left_locks(lane.locks, lane.prefix):
            error = "lock keys left after the tasks ended"
        if error is None:
            continue
        if not entry.contender.needs:
            raise BenchError(f"{entry.key} failed in warm-up: {error}")
        entry.reason = f"failed in warm-up: {error}"
        entry.task = None
    return arg


def worker_round(lane: Lane, first_arg: int, cycles: int, rng: random.Random) -> Round:
    usable = lane.usable
    n = len(usable)
    if lane.broker.llen(lane.queue_key):
        raise BenchError(f"queue {lane.queue_key} not empty before a round")
    for entry in usable:
        entry.counter.reset()
    orders = shuffled_orders(n, cycles, rng)
    enqueue = time_calls([_send(e.task) for e in usable], orders, first_arg)
    enqueue_sent = {e.key: list(e.counter.sent) for e in usable}
    queued = lane.broker.llen(lane.queue_key)
    if queued != cycles * n:
        raise BenchError(f"{queued} messages queued, {cycles * n} sent")

    for entry in usable:
        entry.counter.reset()
    gc.collect()
    recorder = drain_queue(lane, usable, max(MIN_DRAIN_TIMEOUT, cycles * n / 100))
    if recorder.failed:
        name, error = recorder.failed[0]
        raise BenchError(f"{len(recorder.failed)} tasks failed, first {name}: {error}")
    for entry in usable:
        if entry.left_locks(lane.locks, lane.prefix):
            raise BenchError(f"{entry.key}: lock keys left after the round")

    measured = Round([e.key for e in usable])
    measured.add({"enqueue": enqueue["wall"]}, gate="enqueue")
    measured.add(recorder.stages(n), gate="worker")
    measured.derive("total", ("enqueue", "worker"))
    inside: Dict[str, List[str]] = {}
    outside: Dict[str, List[str]] = {}
    for i, entry in enumerate(usable):
        sent = entry.counter.sent
        inside[entry.key] = sent[recorder.sent_first[i] : recorder.sent_last[i]]
        outside[entry.key] = sent[: recorder.sent_first[i]] + sent[recorder.sent_last[i] :]
    measured.notes = {
        "cycles": cycles,
        "enqueue_sent": {k: [s for s in v if s != HEALTH_CHECK] for k, v in enqueue_sent.items()},
        "worker_sent": {k: [s for s in v if s != HEALTH_CHECK] for k, v in inside.items()},
        "upkeep_sent": {
            k: [s for s in v + enqueue_sent[k] if s == HEALTH_CHECK] for k, v in inside.items()
        },
        "outside_sent": outside,
        "out_of_order": sum(
            1 for a, b in zip(itertools.chain.from_iterable(orders), recorder.kinds) if a != b
        ),
    }
    return measured


def run_lane(
    lane: Lane,
    *,
    rounds: int,
    cycles: int,
    warmup: int,
    budget: float,
    started: float,
    seed: int = 9,
) -> Paired:
    """Warm-up, then ``rounds`` paired rounds of ``cycles`` cycles (no round starts that
    would end past ``budget`` s after ``started``); one progress line per round."""
    next_arg = warm_up(lane, warmup)
    usable = lane.usable
    rng = random.Random(seed)

    def measure(round_no: int) -> Round:
        return worker_round(lane, next_arg + round_no * cycles * len(usable), cycles, rng)

    def show(round_no: int, measured: Round, took: float) -> str:
        kept, total = measured.kept["worker"]
        means = measured.means["worker"]
        return f", {kept}/{total} cycles kept: us/task " + ", ".join(
            f"{e.key} {means[e.key]:.0f}"
            + ("" if e.key == "plain" else f" ({means[e.key] - means['plain']:+.0f})")
            for e in usable
        )

    results, stopped = run_rounds(measure, rounds, budget=budget, started=started, show=show)
    return Paired([e.key for e in usable], results, stopped)


def sent_counts(paired: Paired, key: str, which: str) -> Tuple[List[float], Counter[str]]:
    """Lock requests of ``key`` per task, one figure per round, and all of them by name;
    ``which`` is ``enqueue_sent``, ``worker_sent``, ``upkeep_sent`` or ``outside_sent``."""
    per_round: List[float] = []
    counts: Counter[str] = Counter()
    for r in paired.rounds:
        sent = r.notes[which][key]
        per_round.append(len(sent) / r.notes["cycles"])
        counts.update(sent)
    return per_round, counts


# -- the frame of a worker-level benchmark -------------------------------------------------------


def worker_options(
    parser: argparse.ArgumentParser, count: str, defaults: Dict[str, Tuple[Any, Any]]
) -> None:
    """The options every worker-level benchmark takes; ``count`` names the tasks per
    contender and round (``tasks`` or ``cycles``); ``defaults``: (--quick, full) of
    ``rounds``, ``count`` and ``budget``, filled in by ``fill_defaults``."""
    rounds, tasks, budget = defaults["rounds"], defaults[count], defaults["budget"]
    parser.add_argument(
        "--quick", action="store_true", help=f"{tasks[0]} tasks x {rounds[0]} rounds"
    )
    parser.add_argument("--rounds", type=int, help=f"rounds (default {rounds[1]})")
    parser.add_argument(
        f"--{count}", type=int, help=f"tasks per contender and round (default {tasks[1]})"
    )
    parser.add_argument(
        "--warmup", type=int, default=30, help="unmeasured tasks per contender first (30)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        help=f"seconds; no round starts that would end past it (default {budget[1]:g}; "
        f"--quick {budget[0]:g})",
    )
    parser.add_argument("--seed", type=int, default=9, help="seed of the task order (9)")


def run_worker_bench(
    name: str,
    keys: Sequence[str],
    args: argparse.Namespace,
    count: int,
    *,
    separate_lock_server: bool = False,
    then: Optional[Callable[[Lane], T]] = None,
) -> Tuple[Lane, Paired, Optional[T]]:
    """Print the header, then run the paired rounds on a lane of ``keys`` (and ``then`` on
    it, before it is closed). Raises BenchError if a contender of ours cannot be built."""
    started = time.perf_counter()
    with worker_lane(keys, separate_lock_server=separate_lock_server) as lane:
        for entry in lane.entries:
            if not entry.available and not entry.contender.needs:
                raise BenchError(f"{entry.key} cannot be built: {entry.reason}")
        print(
            f"{name} benchmark: redis {server_version(lane.broker)} ({lane.where}), "
            + versions("celery", "kombu", "redis", "celery-once", "celery-singleton")
        )
        print(
            "   ONE in-process solo worker per round runs every contender, alternated task by "
            f"task; {args.warmup} unmeasured cycles first; seed {args.seed}",
            flush=True,
        )
        paired = run_lane(
            lane,
            rounds=args.rounds,
            cycles=count,
            warmup=args.warmup,
            budget=args.budget,
            started=started,
            seed=args.seed,
        )
        extra = then(lane) if then is not None else None
    if not paired.rounds:
        raise BenchError("no round ran")
    return lane, paired, extra
