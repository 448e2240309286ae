"""Celery benchmark: no-op tasks through a real solo worker, plain vs locked task bases.

``python -m bench celery [--quick]``. Contenders: a plain Celery ``Task``, ``LockedTask``
(default options), celery-once ``QueueOnce`` and celery-singleton ``Singleton``, all on one
Redis (broker and locks). For every contender and round, ``--tasks`` tasks with distinct
arguments (no contention) are enqueued with ``apply_async`` while no worker runs, then an
in-process worker (``celery.contrib.testing.worker.start_worker``, pool ``solo``) drains the
queue. Throughput is timed from the first task's ``task_prerun`` to the last task's
``task_postrun``, so it covers every per-task hook (``before_start`` through ``after_return``)
and not the worker's start-up. Contenders are interleaved (order rotated each round) and
figures are medians over rounds, so that a noisy, shared machine slows them alike.

This module is ``bench.celery``; ``celery`` below is the real package (absolute imports).
"""

from __future__ import annotations

import argparse
import gc
import platform
import secrets
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import redis
from celery import Celery, Task, signals
from celery.contrib.testing.worker import start_worker

from celery_singleton_lock.celery import LockedTask
from celery_singleton_lock.celery.config.lockers import forget_locker

from ._common import (
    RoundTripCounter,
    counting_connection_class,
    fill_defaults,
    median,
    quartiles,
    redis_target,
    server_cpu_seconds,
    server_version,
    verdict,
)

#: Targets from the spec.
MIN_RATIO_TO_PLAIN = 0.95
LOCK_ROUND_TRIPS_PER_TASK = 2  # one EVALSHA to acquire, one to release

#: Sent by redis-py on a connection idle longer than its ``health_check_interval`` (the
#: plugin's client uses 30 s): connection upkeep, shown apart rather than charged to a task.
HEALTH_CHECK = "PING"

#: A batch whose tasks have not all ended this long after the worker started is a failure.
MIN_BATCH_TIMEOUT = 30.0


class BenchError(RuntimeError):
    """The run did not do what was measured (lost tasks, failed tasks, locks left behind)."""


def _pkg_version(name: str) -> str:
    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


# -- timing: one batch of tasks, observed through Celery's own signals ------------------------


class Batch:
    """What the worker thread records of one batch, through task signals."""

    def __init__(
        self, names: FrozenSet[str], tasks: int, counter: Optional[RoundTripCounter]
    ) -> None:
        self.names = names
        self.tasks = tasks
        self.counter = counter
        self.done = 0
        self.failed: List[Tuple[str, str]] = []  # (task name, exception)
        self.started: Optional[float] = None
        self.ended: Optional[float] = None
        self.cpu_started = self.cpu_ended = 0.0
        self.sent_started = self.sent_ended = 0  # indexes into counter.sent
        self.prerun_at = 0.0
        self.in_task: List[float] = []  # seconds from each task's prerun to its postrun
        self.finished = threading.Event()

    def sent_so_far(self) -> int:
        return len(self.counter) if self.counter is not None else 0


_batch: Optional[Batch] = None  # the batch the worker is running, if any


def _on_prerun(sender: Any = None, **_: Any) -> None:
    batch = _batch
    if batch is not None and sender.name in batch.names:
        if batch.started is None:
            batch.sent_started = batch.sent_so_far()
            batch.cpu_started = time.process_time()
            batch.started = time.perf_counter()
        batch.prerun_at = time.perf_counter()


def _on_postrun(sender: Any = None, **_: Any) -> None:
    batch = _batch
    if batch is not None and sender.name in batch.names:
        now = time.perf_counter()
        batch.in_task.append(now - batch.prerun_at)
        batch.done += 1
        if batch.done == batch.tasks:
            batch.ended = now
            batch.cpu_ended = time.process_time()
            batch.sent_ended = batch.sent_so_far()
            batch.finished.set()


def _on_failure(sender: Any = None, exception: Any = None, **_: Any) -> None:
    batch = _batch
    if batch is not None and sender is not None and sender.name in batch.names:
        batch.failed.append((sender.name, repr(exception)))


def drain(app: Celery, batch: Batch, timeout: float) -> None:
    """Start a solo worker in this process, wait until ``batch`` has ended, stop the worker."""
    global _batch
    _batch = batch
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, loglevel="CRITICAL"):
            if not batch.finished.wait(timeout):
                raise BenchError(f"{batch.done}/{batch.tasks} tasks ended within {timeout:.0f} s")
    finally:
        _batch = None


# -- contenders ---------------------------------------------------------------------------------


@dataclass
class Setup:
    url: str
    prefix: str


@dataclass
class Contender:
    key: str
    label: str
    #: registers the task on the app and returns it; raises if the library cannot be used
    build: Callable[[Celery, str, Setup], Any]
    #: SCAN pattern of its lock keys, from (bench prefix, task name); None: takes no lock
    lock_pattern: Optional[Callable[[str, str], str]] = None
    task: Any = None
    reason: str = ""  # why it is not measured
    counter: RoundTripCounter = field(default_factory=RoundTripCounter)
    # one entry per measured round
    tasks_per_s: List[float] = field(default_factory=list)
    ratios: List[float] = field(default_factory=list)  # tasks/s / plain's, same round
    in_task_us: List[float] = field(default_factory=list)
    enqueue_us: List[float] = field(default_factory=list)
    cpu_us: List[float] = field(default_factory=list)
    server_us: List[float] = field(default_factory=list)
    worker_trips: List[float] = field(default_factory=list)  # per task, first start..last end
    enqueue_trips: List[float] = field(default_factory=list)  # per task, while enqueuing
    # over all measured rounds
    worker_sent: Counter[str] = field(default_factory=Counter)
    enqueue_sent: Counter[str] = field(default_factory=Counter)
    upkeep_sent: Counter[str] = field(default_factory=Counter)  # health-check PINGs
    outside_sent: Counter[str] = field(default_factory=Counter)  # worker start/stop, no task

    @property
    def available(self) -> bool:
        return self.task is not None

    @property
    def takes_locks(self) -> bool:
        return self.lock_pattern is not None


def noop(i: int) -> None:
    """The body of every contender's task."""


def build_plain(app: Celery, name: str, setup: Setup) -> Any:
    return app.task(name=name)(noop)


def build_locked(app: Celery, name: str, setup: Setup) -> Any:
    return app.task(name=name, base=LockedTask)(noop)


class FloorLock:
    """The least a lock taken at run time can cost: ``SET key 1 NX PX`` before the body,
    waiting for its reply, and ``DEL key`` after it, sent without waiting (its reply is read
    before the next ``SET``). One kept connection, no token, no Lua, no renewal, no error
    handling: not a usable lock, only the yardstick for one (the solo worker is one thread).
    """

    def __init__(self, url: str, connection_class: type, prefix: str) -> None:
        self.pool = redis.ConnectionPool.from_url(url, connection_class=connection_class)
        self.prefix = prefix
        self.connection: Any = None
        self.unread = 0

    def acquire(self, arg: Any) -> None:
        if self.connection is None:
            self.connection = self.pool.get_connection()
        self.connection.send_command("SET", f"{self.prefix}:{arg}", "1", "NX", "PX", "30000")
        while self.unread:
            self.connection.read_response()
            self.unread -= 1
        if self.connection.read_response() is None:
            raise BenchError(f"floor lock {arg} was held")

    def release(self, arg: Any) -> None:
        self.connection.send_command("DEL", f"{self.prefix}:{arg}")
        self.unread += 1

    def close(self) -> None:
        if self.connection is not None:
            while self.unread:
                self.connection.read_response()
                self.unread -= 1
        self.pool.disconnect()
        self.connection = None


def build_floor(app: Celery, name: str, setup: Setup) -> Any:
    floor = FloorLock(setup.url, app.conf.bench_floor_connection_class, f"{setup.prefix}-floor")
    app.conf.bench_floor = floor

    class FloorTask(Task):  # type: ignore[misc]
        def before_start(self, task_id: str, args: Any, kwargs: Any) -> None:
            floor.acquire(args[0])

        def after_return(self, status: str, retval: Any, task_id: str, *args: Any) -> None:
            floor.release(args[0][0])

    return app.task(name=name, base=FloorTask)(noop)


def build_once(app: Celery, name: str, setup: Setup) -> Any:
    from celery_once import QueueOnce

    app.conf.ONCE = {
        "backend": "celery_once.backends.Redis",
        "settings": {"url": setup.url, "default_timeout": 60},
    }
    return app.task(name=name, base=QueueOnce)(noop)


def build_singleton(app: Celery, name: str, setup: Setup) -> Any:
    import celery_singleton.backends as singleton_backends
    from celery_singleton import Singleton

    singleton_backends._backend = None  # it caches one backend per process
    app.conf.singleton_backend_url = setup.url
    app.conf.singleton_key_prefix = f"{setup.prefix}-singleton:"
    return app.task(name=name, base=Singleton)(noop)


def contenders() -> List[Contender]:
    return [
        Contender("plain", "plain Celery Task", build_plain),
        Contender(
            "floor",
            "floor: SET NX wait, DEL no wait",
            build_floor,
            lock_pattern=lambda prefix, name: f"{prefix}-floor:*",
        ),
        Contender(
            "locked",
            "LockedTask (this package)",
            build_locked,
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


def make_app(setup: Setup, entries: List[Contender]) -> Celery:
    """One app for all contenders; each contender's lock client counts what it sends."""
    prefix, url = setup.prefix, setup.url
    app = Celery(prefix, broker=url, set_as_current=False)
    app.conf.update(
        task_ignore_result=True,
        task_default_queue=f"{prefix}-tasks",
        # every broker key (queue, bindings, unacked) under the bench prefix
        broker_transport_options={"global_keyprefix": f"{prefix}:"},
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        singleton_lock_url=url,
        singleton_lock_prefix=f"{prefix}-lock",
    )
    for contender in entries:
        counting = counting_connection_class(url, contender.counter)
        if contender.key == "locked":
            # the plugin passes these to redis.Redis.from_url
            app.conf.singleton_lock_redis_options = {"connection_class": counting}
        elif contender.key == "floor":
            app.conf.bench_floor_connection_class = counting
        elif contender.key == "singleton":
            # celery-singleton passes these to redis.Redis.from_url
            app.conf.singleton_backend_kwargs = {"connection_class": counting}
        try:
            contender.task = contender.build(app, f"{prefix}.{contender.key}", setup)
            if contender.key == "once":
                _count_once(url, contender.counter)
        except Exception as exc:  # noqa: BLE001  (cannot be imported or used: shown as n/a)
            contender.task = None
            contender.reason = f"{type(exc).__name__}: {exc}"
    app.finalize()
    return app


def _count_once(url: str, counter: RoundTripCounter) -> None:
    """celery-once keeps one client per process, built from its URL on first use: count it."""
    import celery_once.backends.redis as once_redis

    once_redis.redis = None
    client = once_redis.get_redis({"url": url})
    client.connection_pool.disconnect()
    client.connection_pool.connection_class = counting_connection_class(url, counter)


def release_clients(app: Celery) -> None:
    forget_locker(app)
    floor = app.conf.get("bench_floor")
    if floor is not None:
        floor.close()
    try:
        import celery_once.backends.redis as once_redis

        if once_redis.redis is not None:
            once_redis.redis.connection_pool.disconnect()
            once_redis.redis = None
    except ImportError:
        pass
    try:
        import celery_singleton.backends as singleton_backends

        backend = singleton_backends._backend
        if backend is not None:
            backend.redis.connection_pool.disconnect()
            singleton_backends._backend = None
    except ImportError:
        pass


# -- one batch: enqueue, then drain through a fresh solo worker ---------------------------------


@dataclass
class BatchResult:
    tasks_per_s: float
    in_task_us: float
    enqueue_us: float
    cpu_us: float
    server_us: Optional[float]
    enqueue_sent: List[str]
    worker_sent: List[str]  # first task start .. last task end, health checks excepted
    upkeep_sent: List[str]
    outside_sent: List[str]


def left_locks(plain: redis.Redis, prefix: str, contender: Contender) -> int:
    if contender.lock_pattern is None:
        return 0
    pattern = contender.lock_pattern(prefix, contender.task.name)
    return sum(1 for _ in plain.scan_iter(match=pattern, count=1000))


def run_batch(
    app: Celery,
    contender: Contender,
    plain: redis.Redis,
    queue_key: str,
    first_arg: int,
    tasks: int,
    timeout: float,
) -> BatchResult:
    task, counter = contender.task, contender.counter
    if plain.llen(queue_key):
        raise BenchError(f"queue {queue_key} not empty before a batch")
    gc.collect()
    counter.reset()
    start = time.perf_counter()
    for i in range(first_arg, first_arg + tasks):
        task.apply_async((i,))
    enqueue_s = time.perf_counter() - start
    enqueue_sent = list(counter.sent)
    queued = plain.llen(queue_key)
    if queued != tasks:
        raise BenchError(f"{contender.key}: {queued} messages queued, {tasks} sent")

    counter.reset()
    batch = Batch(frozenset([task.name]), tasks, counter)
    gc.collect()
    server_start = server_cpu_seconds(plain)
    try:
        drain(app, batch, timeout)
    except BenchError as exc:
        raise BenchError(f"{contender.key}: {exc}") from None
    server_end = server_cpu_seconds(plain)
    if batch.failed:
        error = batch.failed[0][1]
        raise BenchError(f"{contender.key}: {len(batch.failed)} tasks failed, first: {error}")
    left = left_locks(plain, app.main, contender)
    if left:
        raise BenchError(f"{contender.key}: {left} lock keys left after the batch")
    assert batch.started is not None and batch.ended is not None
    sent = list(counter.sent)
    inside = sent[batch.sent_started : batch.sent_ended]
    server_us = None
    if server_start is not None and server_end is not None:
        server_us = (server_end - server_start) / tasks * 1e6
    return BatchResult(
        tasks_per_s=tasks / (batch.ended - batch.started),
        in_task_us=median(batch.in_task) * 1e6,
        enqueue_us=enqueue_s / tasks * 1e6,
        cpu_us=(batch.cpu_ended - batch.cpu_started) / tasks * 1e6,
        server_us=server_us,
        enqueue_sent=enqueue_sent,
        worker_sent=[name for name in inside if name != HEALTH_CHECK],
        upkeep_sent=[name for name in inside if name == HEALTH_CHECK],
        outside_sent=sent[: batch.sent_started] + sent[batch.sent_ended :],
    )


def record(contender: Contender, result: BatchResult, plain_tasks_per_s: float, n: int) -> None:
    contender.tasks_per_s.append(result.tasks_per_s)
    contender.ratios.append(result.tasks_per_s / plain_tasks_per_s)
    contender.in_task_us.append(result.in_task_us)
    contender.enqueue_us.append(result.enqueue_us)
    contender.cpu_us.append(result.cpu_us)
    if result.server_us is not None:
        contender.server_us.append(result.server_us)
    contender.worker_trips.append(len(result.worker_sent) / n)
    contender.enqueue_trips.append(len(result.enqueue_sent) / n)
    contender.worker_sent.update(result.worker_sent)
    contender.enqueue_sent.update(result.enqueue_sent)
    contender.upkeep_sent.update(result.upkeep_sent)
    contender.outside_sent.update(result.outside_sent)


# -- the benchmark ------------------------------------------------------------------------------


@dataclass
class Run:
    entries: List[Contender]
    rounds_done: int = 0
    stopped_early: str = ""


def warm_up(app: Celery, usable: List[Contender], plain: redis.Redis, tasks: int) -> int:
    """Unmeasured: imports, connections, script loading. One worker runs every contender's
    warm-up tasks; a competitor that fails here is shown as n/a with the reason.

    Returns the next unused task argument.
    """
    queue_key = f"{app.main}:{app.conf.task_default_queue}"
    sent: Dict[str, int] = {}
    arg = 0
    for contender in usable:
        try:
            for _ in range(tasks):
                contender.task.apply_async((arg,))
                arg += 1
            sent[contender.task.name] = tasks
        except Exception as exc:  # a competitor failing to enqueue: n/a
            if contender.key in ("plain", "locked"):
                raise
            contender.reason = f"failed to enqueue: {type(exc).__name__}: {exc}"
            sent[contender.task.name] = 0
    if sum(sent.values()) != plain.llen(queue_key):
        raise BenchError(f"warm-up: {plain.llen(queue_key)} messages queued, {sent} sent")
    batch = Batch(frozenset(name for name, n in sent.items() if n), sum(sent.values()), None)
    drain(app, batch, MIN_BATCH_TIMEOUT)
    failed = dict(reversed(batch.failed))  # the first error of each task
    for contender in usable:
        name = contender.task.name
        error = failed.get(name)
        if error is None and not contender.reason and left_locks(plain, app.main, contender):
            error = "lock keys left after the tasks ended"
        if error is not None and contender.key in ("plain", "locked"):
            raise BenchError(f"{contender.key} failed in warm-up: {error}")
        if error is not None:
            contender.reason = f"failed in warm-up: {error}"
        if contender.reason:
            contender.task = None
    return arg


def bench(
    app: Celery,
    entries: List[Contender],
    plain: redis.Redis,
    *,
    rounds: int,
    tasks: int,
    warmup: int,
    budget: float,
    started: float,
) -> Run:
    run = Run(entries)
    queue_key = f"{app.main}:{app.conf.task_default_queue}"
    timeout = max(MIN_BATCH_TIMEOUT, tasks / 50)
    next_arg = warm_up(app, [c for c in entries if c.available], plain, warmup)
    usable = [c for c in entries if c.available]
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
        shift = round_no % len(usable)
        order = usable[shift:] + usable[:shift]
        results: Dict[str, BatchResult] = {}
        for contender in order:
            results[contender.key] = run_batch(
                app, contender, plain, queue_key, next_arg, tasks, timeout
            )
            next_arg += tasks
        for contender in usable:
            record(contender, results[contender.key], results["plain"].tasks_per_s, tasks)
        run.rounds_done += 1
        round_times.append(time.perf_counter() - round_start)
        print(
            f"   round {round_no + 1}/{rounds} ({round_times[-1]:.1f} s), tasks/s: "
            + ", ".join(f"{c.key} {results[c.key].tasks_per_s:.0f}" for c in order),
            flush=True,
        )
    return run


# -- report -------------------------------------------------------------------------------------


def _per_task(counts: Counter[str], n: int) -> str:
    if not counts:
        return "-"
    return " + ".join(f"{count / n:g} {name}" for name, count in counts.most_common())


def print_results(run: Run, tasks: int) -> None:
    total = run.rounds_done * tasks
    print(
        f"\n1. throughput: {tasks} distinct no-op tasks per contender and round, "
        f"{run.rounds_done} rounds, medians over rounds"
    )
    print(
        f"   {'contender':<28} {'tasks/s':>7} {'best':>5} {'x plain':>7} {'(IQR)':>13} "
        f"{'us/task':>7} {'in task':>7} {'enqueue':>7} {'total':>6} {'CPU':>5} {'server':>6}"
    )
    for c in run.entries:
        if not c.available:
            print(f"   {c.label:<28} {'n/a':>7}  {c.reason}")
            continue
        q1, q3 = quartiles(c.ratios)
        tps = median(c.tasks_per_s)
        server = f"{median(c.server_us):.0f}" if c.server_us else "n/a"
        enqueue = median(c.enqueue_us)
        print(
            f"   {c.label:<28} {tps:>7.0f} {max(c.tasks_per_s):>5.0f} {median(c.ratios):>6.3f}x "
            f"{f'({q1:.3f}-{q3:.3f})':>13} {1e6 / tps:>7.0f} {median(c.in_task_us):>7.0f} "
            f"{enqueue:>7.0f} {1e6 / tps + enqueue:>6.0f} {median(c.cpu_us):>5.0f} {server:>6}"
        )
    print(
        "   tasks/s: first task_prerun to last task_postrun of the batch (worker start-up "
        "excluded); best: fastest round;\n   x plain: median of the per-round ratios to plain "
        "(same round, same machine weather), IQR their quartiles;\n   then microseconds per "
        "task: us/task = 1e6 / tasks/s; in task: median prerun-to-postrun of one task (the\n"
        "   contender's hooks; the rest of us/task is the broker and the worker loop); enqueue: "
        "apply_async, no worker\n   running; total: enqueue + us/task; CPU: this process "
        "while the worker ran; server: redis-server CPU (INFO cpu)"
    )
    print(
        "\n2. lock round trips per task, as the contender's own Redis client sends them "
        "(not the broker's)"
    )
    print(f"   {'contender':<28} {'worker':>6} {'enqueue':>7}  sent per task")
    for c in run.entries:
        if not c.available:
            print(f"   {c.label:<28} {'n/a':>6}")
            continue
        if not c.takes_locks:
            print(f"   {c.label:<28} {'-':>6} {'-':>7}  (takes no lock)")
            continue
        worker = "/".join(f"{t:g}" for t in sorted(set(c.worker_trips)))
        enqueue = "/".join(f"{t:g}" for t in sorted(set(c.enqueue_trips)))
        sent = f"worker: {_per_task(c.worker_sent, total)}; enqueue: "
        sent += _per_task(c.enqueue_sent, total)
        if c.upkeep_sent:
            sent += f"; health-check PINGs (whole run): {sum(c.upkeep_sent.values())}"
        if c.outside_sent:
            sent += f"; outside any task (whole run): {dict(c.outside_sent)}"
        print(f"   {c.label:<28} {worker:>6} {enqueue:>7}  {sent}")
    print(
        "   worker: from the first task start to the last task end; enqueue: during the "
        "apply_async loop; a/b: differs\n   between rounds; connection handshakes and "
        "health-check PINGs (idle connection) not counted"
    )


def print_verdicts(run: Run) -> None:
    by_key = {c.key: c for c in run.entries}
    locked = by_key["locked"]
    ratio = median(locked.ratios)
    lines = [
        f"LockedTask {ratio:.3f}x plain tasks/s (>= {MIN_RATIO_TO_PLAIN}) "
        f"{verdict(ratio >= MIN_RATIO_TO_PLAIN)}"
    ]
    floor = by_key["floor"]
    if floor.available:
        of_floor = median([a / b for a, b in zip(locked.tasks_per_s, floor.tasks_per_s)])
        lines.append(
            f"floor (1 waited + 1 unwaited round trip, no other work) "
            f"{median(floor.ratios):.3f}x plain: the ceiling of any lock taken at run time "
            f"here; LockedTask {of_floor:.3f}x the floor's tasks/s"
        )
    for key in ("once", "singleton"):
        other = by_key[key]
        if not other.available:
            lines.append(f"LockedTask ahead of {other.label}: n/a ({other.reason})")
            continue
        ahead = median([a / b for a, b in zip(locked.tasks_per_s, other.tasks_per_s)])
        total_locked = 1e6 / median(locked.tasks_per_s) + median(locked.enqueue_us)
        total_other = 1e6 / median(other.tasks_per_s) + median(other.enqueue_us)
        lines.append(
            f"LockedTask ahead of {other.label}: {ahead:.3f}x its tasks/s (> 1) "
            f"{verdict(ahead > 1)}  [counting enqueue too: {total_locked:.0f} vs "
            f"{total_other:.0f} us/task]"
        )
    exact = all(t == LOCK_ROUND_TRIPS_PER_TASK for t in locked.worker_trips) and not any(
        locked.enqueue_trips
    )
    trips = "/".join(f"{t:g}" for t in sorted(set(locked.worker_trips)))
    enqueue = "/".join(f"{t:g}" for t in sorted(set(locked.enqueue_trips)))
    lines.append(
        f"LockedTask {trips} lock round trips per uncontended task in the worker, {enqueue} at "
        f"enqueue (= {LOCK_ROUND_TRIPS_PER_TASK} and 0, every round) {verdict(exact)}"
    )
    print("verdicts:")
    for line in lines:
        print(f"   {line}")


# -- main ---------------------------------------------------------------------------------------


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench celery",
        description="No-op tasks through a real solo worker on a Redis broker: plain Task vs "
        "LockedTask vs celery-once vs celery-singleton, interleaved rounds.",
    )
    parser.add_argument(
        "--quick", action="store_true", help="shorter run (< 60 s): 500 tasks x 2 rounds"
    )
    parser.add_argument("--rounds", type=int, help="rounds (default 5; --quick 2)")
    parser.add_argument("--tasks", type=int, help="tasks per contender and round (default 2000)")
    parser.add_argument(
        "--warmup", type=int, default=50, help="unmeasured tasks per contender first (50)"
    )
    parser.add_argument(
        "--budget",
        type=float,
        help="seconds; no round starts that would end past it (default 170; --quick 55)",
    )
    args = parser.parse_args(list(argv))
    defaults = {"rounds": (2, 5), "tasks": (500, 2000), "budget": (55.0, 170.0)}
    fill_defaults(parser, args, defaults, ("rounds", "tasks", "warmup"))
    return args


def cleanup(plain: redis.Redis, prefix: str) -> None:
    """Delete every key the run wrote: all under the prefix, but celery-once's ``qo_<task>``."""
    patterns = [f"{prefix}*", f"qo_{prefix}.*"]
    for pattern in patterns:
        keys = list(plain.scan_iter(match=pattern, count=1000))
        for i in range(0, len(keys), 1000):
            plain.delete(*keys[i : i + 1000])


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    prefix = f"bench-{secrets.token_hex(4)}"  # never collides with another run or real keys
    receivers = [
        (signals.task_prerun, _on_prerun),
        (signals.task_postrun, _on_postrun),
        (signals.task_failure, _on_failure),
    ]
    for signal, receiver in receivers:
        signal.connect(receiver, weak=False)
    entries = contenders()
    try:
        with redis_target() as target:
            plain = redis.Redis.from_url(target.url)
            app = make_app(Setup(target.url, prefix), entries)
            try:
                print(
                    f"celery benchmark: redis {server_version(plain)} ({target.description}), "
                    f"python {platform.python_version()}, celery {_pkg_version('celery')}, "
                    f"kombu {_pkg_version('kombu')}, redis-py {_pkg_version('redis')}, "
                    f"celery-once {_pkg_version('celery-once')}, "
                    f"celery-singleton {_pkg_version('celery-singleton')}"
                )
                print(
                    f"   one Redis for broker and locks; an in-process solo worker per batch; "
                    f"{args.warmup} unmeasured tasks per contender first; "
                    f"contender order rotated each round",
                    flush=True,
                )
                run = bench(
                    app,
                    entries,
                    plain,
                    rounds=args.rounds,
                    tasks=args.tasks,
                    warmup=args.warmup,
                    budget=args.budget,
                    started=started,
                )
            finally:
                release_clients(app)
                cleanup(plain, prefix)
                plain.close()
    except BenchError as exc:
        print(f"celery benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        for signal, receiver in receivers:
            signal.disconnect(receiver)
    print_results(run, args.tasks)
    if run.stopped_early:
        print(f"   {run.stopped_early}")
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    print_verdicts(run)
    return 0
