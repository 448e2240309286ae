"""What grows as users grow (issue 29): the cost curves of the lock server, in Redis's own
counters.

``python -m bench scale [--quick] [--chart [DIR]]`` (~70 s; ``--quick``: the smallest sizes,
~6 s). On a fresh private loopback ``redis-server`` per curve, started and stopped here (never
``$REDIS_URL``: the counters are reset between measurements), through the engine's public API,
each figure read from the server (``CONFIG RESETSTAT``, then ``INFO commandstats``; the slow
log for the longest single call; ``INFO memory``, ``MEMORY USAGE``; see
:mod:`bench._counters`), not timed by the client, so a loaded machine moves them little:

1. slots: server time of an acquire at ``lock_limit`` = 1 .. 1,000, free and with N-1 slots
   held, and of the main process renewing one child's slot by its owner;
2. parked: parking a call, re-parking an id already parked, dropping the oldest parked call,
   behind one held lock with Q = 10 .. 10,000 calls parked;
3. leases: one renewal tick of L = 10 .. 50,000 leases of one process (``renew_batch``):
   round trips, server time, and the longest single call;
4. inspection: ``SCAN`` calls and wall time of ``inspect.scan()`` (what ``locks list`` and
   the doctor's orphan check read) and of the parked gauge of a metrics scrape, for 100 held
   locks among 0 .. 200,000 unrelated keys;
5. finished: R finish records of ``acks_late`` tasks: the largest key's elements, bytes per
   record (``used_memory`` growth / R), and the ``DEL`` of the largest key (what its expiry
   blocks);
6. per uncontended task: the floor (``SET NX PX`` + ``DEL``) beside the mutex, an
   ``acks_late`` task's lock, ``lock_limit=3`` and a one-slot ``queue`` (their slot table).

Then one line per target of issue 29: meets or misses, with the measured figure. The exit code
is 0 whatever the verdicts (1 if the run did not do what it measured).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, TypeVar

import redis

from celery_singleton_lock.celery.observe.metrics import parked_by_task
from celery_singleton_lock.engine import Lease, Owner, Parked, RedisLocker, Renewer
from celery_singleton_lock.testing import RedisServer

from ._common import (
    BenchError,
    RoundTripCounter,
    counting_client,
    median,
    new_prefix,
    server_version,
    versions,
)
from ._counters import Counters, Spent
from ._curve import Curve, draw, print_curve
from .memory import FINISHED_TTL, this_layout

T = TypeVar("T")
Held = List[Tuple[str, Owner, float]]  # what renew_by_owner renews: (name, owner, ttl)

#: sizes of each curve: (--quick, full)
SIZES: Dict[str, Tuple[Tuple[int, ...], Tuple[int, ...]]] = {
    "slots": ((1, 10), (1, 10, 100, 1000)),
    "parked": ((10, 100), (10, 100, 1000, 10_000)),
    "leases": ((10, 100), (10, 100, 1000, 10_000, 50_000)),
    "inspection": ((0, 20_000), (0, 20_000, 200_000)),
    "finished": ((10_000,), (10_000, 100_000)),
}
#: calls measured per figure: (--quick, full)
SAMPLES = (20, 100)
TICKS = 3  # renewal ticks per size (the longest call is the worst of them)
#: the slow log keeps calls over this: the script calls of a tick, not the many short
#: commands a script runs (logging those would lengthen the script measured)
LOGGED_OVER_USEC = 100
HELD_LOCKS = 100  # locks held while inspecting
UNCONTENDED_TASKS = ((300,), (2000,))  # tasks per lock: (--quick, full)
SLOT_ROUNDS = 10  # the slots curve's calls in this many blocks, every figure in turn
UNCONTENDED_ROUNDS = 20  # each lock's tasks in this many blocks, the locks in turn
DEFAULT_CHART_DIR = Path("docs/explanation/img")

#: the targets of issue 29
MAX_GROWTH = 3.0  # an acquire at the largest limit, a (re-)park or drop at the largest Q
MAX_CALL_MS = 5.0  # no single script call, nor the expiry of one key, blocks Redis longer
MAX_SCANS = 10
MAX_ELEMENTS = 5_000
MAX_BYTES_PER_RECORD = 100.0


@dataclass
class Env:
    """The private server, a client counting what it sends, a locker on it with no renewer
    thread, the server's counters (read on a client of their own)."""

    client: redis.Redis
    counter: RoundTripCounter
    locker: RedisLocker
    counters: Counters
    samples: int

    def held(self, name: str, task_id: str, **options: object) -> Lease:
        lease = self.locker.try_acquire(
            name,
            ttl=300,
            owner=Owner(task_id=task_id),
            renew=False,
            **options,  # type: ignore[arg-type]
        )
        if not isinstance(lease, Lease):
            raise BenchError(f"lock {name} for {task_id}: not acquired ({lease!r})")
        return lease

    def server_usec(self, each: Sequence[T], step: Callable[[T], object]) -> float:
        """Server microseconds per EVALSHA (INFO commandstats) of ``step``, called once for
        each of ``each``."""
        self.counters.reset()
        for item in each:
            step(item)
        return self.counters.of("evalsha").per_call()

    def server_spent(self, each: Sequence[T], step: Callable[[T], object]) -> Spent:
        """The commands ``step`` sends, called once for each of ``each``, and their server
        microseconds (INFO commandstats of the commands sent)."""
        self.counters.reset()
        self.counter.reset()
        for item in each:
            step(item)
        if "PIPELINE" in self.counter.sent:
            raise BenchError("a pipeline's commands cannot be told apart: not measured here")
        return self.counters.spent(self.counter.sent)


# -- 1. slots ---------------------------------------------------------------------------------


def slots_curve(env: Env, sizes: Sequence[int]) -> Curve:
    curve = Curve(
        "slots",
        "server time per acquire by lock_limit (EVALSHA us/call)",
        "lock_limit",
        ("free us", "N-1 held us", "owner renew us", "owner 1st us"),
        ("free us", "N-1 held us", "owner renew us", "owner 1st us"),
        "server microseconds per call",
        "free: the lock free; N-1 held: every slot but one held by others; owner renew: the "
        "main process renewing one\nchild's slot by its owner (renew_by_owner: found by owner "
        "in the slot table); owner 1st: the same from a fresh locker\n"
        "(nothing remembered between calls); each the mean of INFO commandstats EVALSHA "
        "usec/calls",
    )
    columns = ("free us", "N-1 held us", "owner renew us", "owner 1st us")
    steps: List[Tuple[int, str, Callable[[int], None]]] = []  # (limit, column, one call)
    for limit in sizes:
        name, busy, renewed = f"slots-{limit}", f"slots-{limit}-busy", f"slots-{limit}-renew"

        def acquire(i: int, name: str = name, limit: int = limit) -> None:
            lease = env.held(name, f"t-{i}", limit=limit)
            free_slot(env.client, lease)  # plain commands, not the release script: not counted

        def renew(i: int, held: Held, limit: int = limit) -> None:
            if env.locker.renew_by_owner(held, limits=[limit]):
                raise BenchError(f"{held[0][0]}: its holder's slot was not renewed")

        def renew_first(i: int, held: Held, limit: int = limit) -> None:
            # a locker of its own knows no slot of this owner yet (the scripts are loaded)
            fresh = RedisLocker(
                env.client, prefix=env.locker.prefix, renewer=Renewer(autostart=False)
            )
            try:
                if fresh.renew_by_owner(held, limits=[limit]):
                    raise BenchError(f"{held[0][0]}: its holder's slot was not renewed")
            finally:
                fresh.close()

        for i in range(limit - 1):
            env.held(busy, f"held-{i}", limit=limit)
            env.held(renewed, f"held-{i}", limit=limit)
        held: Held = [(renewed, env.held(renewed, "mine", limit=limit).owner, 300.0)]
        renew(0, held)  # the first call finds the owner's slot
        steps += [
            (limit, "free us", acquire),
            (limit, "N-1 held us", lambda i, busy=busy, limit=limit: acquire(i, busy, limit)),
            (limit, "owner renew us", lambda i, held=held, renew=renew: renew(i, held)),
            (limit, "owner 1st us", lambda i, held=held, first=renew_first: first(i, held)),
        ]
    # in rounds, every figure a block of calls in turn: a load on the shared machine that comes
    # and goes weighs on every size alike, so the growth ratios hold
    spent: Dict[Tuple[int, str], List[int]] = {
        (limit, c): [0, 0] for limit in sizes for c in columns
    }
    block = max(1, env.samples // SLOT_ROUNDS)
    for start in range(0, env.samples, block):
        for limit, column, step in steps:
            env.counters.reset()
            for i in range(start, min(start + block, env.samples)):
                step(i)
            got = env.counters.of("evalsha")
            spent[limit, column][0] += got.calls
            spent[limit, column][1] += got.usec
    for limit in sizes:
        curve.rows.append(
            (limit, {c: spent[limit, c][1] / max(spent[limit, c][0], 1) for c in columns})
        )
    return curve


def free_slot(client: Any, lease: Lease) -> None:
    """Give back the slot ``lease`` holds with plain commands (not counted as EVALSHA): what
    lua/release_slot.lua does, for a bench that measures the acquire alone (a limit of 1 is
    the mutex: its key deleted)."""
    if not lease.slot:
        client.delete(lease.key)
        return
    slots, data = lease.keys.slot_table
    slot = str(lease.slot)
    fields = (f"v{slot}", lease.token, f"o:{lease.owner.fields}", f"t:{lease.owner.task_id}")
    pipe = client.pipeline(transaction=False)
    pipe.zadd(slots, {slot: lease.slot - 10**15})  # given back (lua/includes/slot_table.lua)
    pipe.hdel(data, *fields)
    pipe.execute()


# -- 2. parked calls --------------------------------------------------------------------------


def parked_curve(env: Env, sizes: Sequence[int]) -> Curve:
    curve = Curve(
        "parked",
        "parked calls behind one held lock (policy queue): server time per call",
        "parked",
        ("park us", "re-park us", "drop us"),
        ("park us", "re-park us", "drop us"),
        "server microseconds per call",
        "park: a new task id parks (acquire with park=); re-park: an id already parked, from "
        "the middle of the list,\nacquires again; drop: the oldest parked id is dropped "
        "(drop_parked); every command each call sent (INFO commandstats)",
    )
    name, reservation = "parked", 30.0
    env.held(name, "holder", park=b"message-holder")
    queue: List[str] = []  # the parked ids, oldest first, as the server holds them

    def park(task_id: str) -> None:
        parked = env.locker.try_acquire(
            name,
            ttl=300,
            owner=Owner(task_id=task_id),
            renew=False,
            park=b"message-" + task_id.encode(),
        )
        if not isinstance(parked, Parked):
            raise BenchError(f"{task_id} was not parked ({parked!r})")

    def drop(task_id: str) -> None:
        if env.locker.queue.drop_parked(name, task_id, reservation_ttl=reservation) is not True:
            raise BenchError(f"{task_id} was not dropped")

    for size in sizes:
        while len(queue) < size:
            queue.append(f"p-{uuid.uuid4().hex[:12]}")
            park(queue[-1])
        new = [f"p-{uuid.uuid4().hex[:12]}" for _ in range(env.samples)]
        parking = env.server_spent(new, park).usec / len(new)
        queue += new
        middle = queue[len(queue) // 2 - env.samples // 2 :][: env.samples]
        reparking = env.server_spent(middle, park).usec / len(middle)
        heads, queue = queue[: env.samples], queue[env.samples :]

        dropping = env.server_spent(heads, drop).usec / len(heads)
        curve.rows.append(
            (size, {"park us": parking, "re-park us": reparking, "drop us": dropping})
        )
    return curve


# -- 3. leases of one process -----------------------------------------------------------------


def leases_curve(env: Env, sizes: Sequence[int]) -> Curve:
    curve = Curve(
        "leases",
        f"one renewal tick of L leases of one process (renew_batch), worst of {TICKS} ticks",
        "leases",
        ("round trips", "server ms", "longest call ms", "wall ms"),
        ("server ms", "longest call ms"),
        "milliseconds per tick",
        "round trips: requests sent (a counting client; a pipeline is one); server ms: the "
        "script calls' usec (INFO\ncommandstats); longest call: the slow log (calls over "
        f"{LOGGED_OVER_USEC} us; none: the mean call); wall: renew_batch end to end here",
        target=MAX_CALL_MS,
    )
    locker, counter, clock = env.locker, env.counter, env.locker.renewer.clock
    leases: List[Lease] = []
    for size in sizes:
        while len(leases) < size:
            lease = locker.try_acquire(f"lease-{len(leases)}", ttl=300, renew=False)
            if not isinstance(lease, Lease):
                raise BenchError(f"lease-{len(leases)}: not acquired")
            leases.append(lease)
        locker.renew_batch(leases, now=clock())  # loads the script: not counted
        ticks = []
        for _ in range(TICKS):
            env.counters.reset()
            with env.counters.calls_logged(LOGGED_OVER_USEC):
                counter.reset()
                start = time.perf_counter()
                lost = locker.renew_batch(leases, now=clock())
                wall = time.perf_counter() - start
                # the script calls, sent alone or pipelined in chunks (a PIPELINE request)
                spent = env.counters.of("evalsha")
                # none logged: every call was shorter; their mean stands for the longest
                longest = env.counters.longest_logged_usec() or spent.per_call()
            if lost:
                raise BenchError(f"renewal of {size} leases lost {len(lost)} of them")
            ticks.append((len(counter.sent), spent.usec, longest, wall))
        curve.rows.append(
            (
                size,
                {
                    "round trips": max(t[0] for t in ticks),
                    "server ms": max(t[1] for t in ticks) / 1000.0,
                    "longest call ms": max(t[2] for t in ticks) / 1000.0,
                    "wall ms": median([t[3] for t in ticks]) * 1000.0,
                },
            )
        )
    return curve


# -- 4. inspection ----------------------------------------------------------------------------


def fill_unrelated(client: redis.Redis, start: int, end: int) -> None:
    """Keys ``unrelated:<i>`` for ``start <= i < end``: MSETs of 1,000, pipelined."""
    pipe = client.pipeline(transaction=False)
    for low in range(start, end, 1000):
        pipe.mset({f"unrelated:{i}": "x" for i in range(low, min(end, low + 1000))})
        if len(pipe) >= 20:
            pipe.execute()
    pipe.execute()


def inspection_curve(env: Env, sizes: Sequence[int]) -> Curve:
    curve = Curve(
        "inspection",
        f"listing the locks (inspect.scan()) with {HELD_LOCKS} held among unrelated keys, and "
        "a scrape's parked gauge",
        "unrelated keys",
        ("SCAN calls", "wall ms", "scrape SCAN calls", "scrape ms"),
        ("SCAN calls", "scrape SCAN calls"),
        "SCAN calls per listing",
        "SCAN calls: INFO commandstats; wall: the listing end to end in this process; scrape: "
        "the parked gauge\n(celery_lock_parked) of a metrics scrape, end to end",
        target=MAX_SCANS,
    )
    for i in range(HELD_LOCKS):
        env.held(f"listed-{i}", f"t-{i}")
    filled = 0
    for size in sizes:
        fill_unrelated(env.client, filled, size)
        filled = size
        env.counters.reset()
        start = time.perf_counter()
        found = list(env.locker.inspect.scan())
        wall = time.perf_counter() - start
        if len(found) != HELD_LOCKS:
            raise BenchError(f"inspect.scan() found {len(found)} of {HELD_LOCKS} locks")
        scans = env.counters.of("scan").calls
        env.counters.reset()
        start = time.perf_counter()
        parked_by_task(env.locker)
        scrape = time.perf_counter() - start
        scrape_scans = env.counters.of("scan").calls
        curve.rows.append(
            (
                size,
                {
                    "SCAN calls": scans,
                    "wall ms": wall * 1000.0,
                    "scrape SCAN calls": scrape_scans,
                    "scrape ms": scrape * 1000.0,
                },
            )
        )
    return curve


# -- 5. finish records ------------------------------------------------------------------------


def largest_key(client: redis.Redis, pattern: str) -> Tuple[str, int]:
    """The key matching ``pattern`` with the most elements, and their count."""
    counts = {"set": "scard", "hash": "hlen", "zset": "zcard", "list": "llen"}
    keys = list(client.scan_iter(match=pattern, count=1000))
    pipe = client.pipeline(transaction=False)
    for key in keys:
        pipe.type(key)
    types = [t.decode() if isinstance(t, bytes) else t for t in pipe.execute()]
    for key, kind in zip(keys, types):
        if kind in counts:
            getattr(pipe, counts[kind])(key)
        else:
            pipe.exists(key)  # a string: one element
    sizes = pipe.execute()
    best = max(range(len(keys)), key=sizes.__getitem__)
    return keys[best].decode(), int(sizes[best])


def finished_curve(env: Env, sizes: Sequence[int]) -> Curve:
    curve = Curve(
        "finished",
        f"finish records of acks_late tasks (records kept {FINISHED_TTL:.0f} s)",
        "finished tasks",
        ("largest key elements", "largest key MB", "bytes/record", "DEL largest ms"),
        ("largest key elements",),
        "elements of the largest key",
        "each a fenced acquire with unless_finished, then release(remember_for=3600), as a "
        "worker does (bench memory's task);\nlargest key MB: its MEMORY USAGE; bytes/record: "
        "INFO memory used_memory growth / R; DEL largest: a COPY\nof the largest key "
        "deleted, its DEL usec in INFO commandstats (what its expiry blocks, lazyfree off)",
        target=MAX_ELEMENTS,
    )
    task = this_layout(env.client, env.locker.prefix)
    task("warm-up", str(uuid.uuid4()))  # loads the scripts, opens the connections: not weighed
    before, done = env.counters.used_memory(), 0
    for size in sizes:
        while done < size:
            task(f"account-{done}", str(uuid.uuid4()))
            done += 1
        grown = env.counters.used_memory() - before
        key, elements = largest_key(env.client, f"{env.locker.prefix}:*")
        weight = int(env.client.memory_usage(key, samples=0) or 0)  # samples=0: every element
        env.client.copy(key, f"{key}:copy")
        env.counters.reset()
        env.client.delete(f"{key}:copy")
        blocked = env.counters.of("del").usec
        curve.rows.append(
            (
                size,
                {
                    "largest key elements": elements,
                    "largest key MB": weight / 1e6,
                    "bytes/record": grown / size,
                    "DEL largest ms": blocked / 1000.0,
                },
            )
        )
    return curve


# -- 6. per uncontended task ------------------------------------------------------------------


def uncontended_curve(env: Env, sizes: Sequence[int]) -> Curve:
    tasks = sizes[0]
    curve = Curve(
        "uncontended",
        f"server time per uncontended task ({tasks:,} tasks each)",
        "lock",
        ("server us/task", "commands/task", "x floor", "x mutex"),
        ("server us/task",),
        "server microseconds per task",
        "floor: SET NX PX + DEL; mutex: the acquire and release scripts; acks_late: a "
        "fenced acquire with unless_finished,\nreleased with its finish record; lock_limit=3: "
        "its slot table; queue: on_duplicate='queue', one slot,\nnothing "
        "parked; commands sent and their usec (INFO commandstats)",
        labels={1: "floor", 2: "mutex", 3: "acks_late", 4: "lock_limit=3", 5: "queue"},
    )
    prefix, client, locker = env.locker.prefix, env.client, env.locker

    def floor(i: int) -> None:
        key = f"{prefix}:floor"
        if not client.set(key, uuid.uuid4().hex, nx=True, px=30000):
            raise BenchError("floor: the key was not free")
        client.delete(key)

    def mutex(i: int) -> None:
        lease = locker.try_acquire(f"{prefix}:mutex", ttl=30, renew=False)
        if not isinstance(lease, Lease) or not lease.release():
            raise BenchError("mutex: not acquired and released")

    def limit3(i: int) -> None:
        lease = locker.try_acquire(f"{prefix}:limit3", ttl=30, renew=False, limit=3)
        if not isinstance(lease, Lease) or not lease.release():
            raise BenchError("limit 3: not acquired and released")

    def queue(i: int) -> None:
        lease = locker.try_acquire(
            f"{prefix}:queue", ttl=30, owner=Owner(task_id=f"q-{i}"), renew=False, park=b"m"
        )
        if not isinstance(lease, Lease):
            raise BenchError(f"queue: not acquired ({lease!r})")
        assert locker.queue is not None
        if not locker.queue.release_handing_on(lease, reservation_ttl=30, limit=1)[0]:
            raise BenchError("queue: not released")

    acks_late = this_layout(client, prefix)
    calls: List[Callable[[int], None]] = [
        floor,
        mutex,
        lambda i: acks_late(f"task-{i}", str(uuid.uuid4())),
        limit3,
        queue,
    ]
    for call in calls:
        call(-1)  # loads its scripts: not counted
    # in rounds, each lock a block of tasks in turn: a load on the shared machine that comes and
    # goes weighs on every lock alike, so their ratios hold (one lock after another did not)
    spent = [(0, 0)] * len(calls)
    block = max(1, tasks // UNCONTENDED_ROUNDS)
    for start in range(0, tasks, block):
        for row, call in enumerate(calls):
            got = env.server_spent(range(start, min(start + block, tasks)), call)
            spent[row] = (spent[row][0] + got.calls, spent[row][1] + got.usec)
    for row, (calls_sent, usec) in enumerate(spent, 1):
        curve.rows.append(
            (row, {"server us/task": usec / tasks, "commands/task": calls_sent / tasks})
        )
    floor_us, mutex_us = (curve.rows[i][1]["server us/task"] for i in (0, 1))
    for _, figures in curve.rows:
        figures["x floor"] = figures["server us/task"] / floor_us
        figures["x mutex"] = figures["server us/task"] / mutex_us
    return curve


# -- output -----------------------------------------------------------------------------------


def verdicts(curves: Dict[str, Curve]) -> List[str]:
    """One line per target of issue 29, at the largest size measured (all curves)."""
    checks: List[Tuple[str, float, float, str]] = []  # (what was measured, figure, bound, target)
    slots, parked = curves["slots"], curves["parked"]
    for column, label in (("free us", "free"), ("N-1 held us", "with N-1 slots held")):
        low, high, ratio = slots.growth(column)
        said = f"acquire at limit={high:,} ({label}) costs {ratio:.1f}x limit={low}"
        checks.append((said, ratio, MAX_GROWTH, f"<= {MAX_GROWTH:g}x"))
    for column, label in (("re-park us", "re-parking"), ("drop us", "dropping the oldest")):
        low, high, ratio = parked.growth(column)
        said = (
            f"{label} at Q={high:,} parked costs {ratio:.1f}x Q={low} "
            f"({parked.at(high, column):,.0f} us)"
        )
        checks.append((said, ratio, MAX_GROWTH, f"only that call: <= {MAX_GROWTH:g}x"))
    leases = curves["leases"]
    most = leases.rows[-1][0]
    longest = max(figures["longest call ms"] for _, figures in leases.rows)
    trips = max(figures["round trips"] for _, figures in leases.rows)
    unrelated, listing = curves["inspection"].rows[-1]
    tasks, finished = curves["finished"].rows[-1]
    elements, blocked = finished["largest key elements"], finished["DEL largest ms"]
    checks += [
        (
            f"longest single script call renewing {most:,} leases: {longest:.1f} ms",
            longest,
            MAX_CALL_MS,
            f"<= {MAX_CALL_MS:g} ms",
        ),
        (f"renewal round trips per tick (10 to {most:,} leases): {trips:g}", trips, 1, "1"),
        (
            f"listing {HELD_LOCKS} locks among {unrelated:,} unrelated keys takes "
            f"{listing['SCAN calls']:g} SCAN calls",
            listing["SCAN calls"],
            MAX_SCANS,
            f"<= {MAX_SCANS}",
        ),
        (
            f"after {tasks:,} finished tasks the largest key holds {elements:,.0f} elements",
            elements,
            MAX_ELEMENTS,
            f"<= {MAX_ELEMENTS:,}",
        ),
        (
            f"a finished task costs {finished['bytes/record']:.0f} bytes",
            finished["bytes/record"],
            MAX_BYTES_PER_RECORD,
            f"<= {MAX_BYTES_PER_RECORD:g} B",
        ),
        (
            f"the expiry of the largest key (after {tasks:,} tasks) blocks Redis {blocked:.1f} ms",
            blocked,
            MAX_CALL_MS,
            f"<= {MAX_CALL_MS:g} ms",
        ),
    ]
    lines = [
        f"{said}: {'meets' if figure <= bound else 'misses'} (target {target})"
        for said, figure, bound, target in checks
    ]
    rows = dict(curves["uncontended"].rows)
    lines.append(
        f"server time per uncontended task: mutex {rows[2]['server us/task']:.1f} us, "
        f"acks_late {rows[3]['server us/task']:.1f} us, floor {rows[1]['server us/task']:.1f} "
        f"us ({rows[2]['x floor']:.2f}x, {rows[3]['x floor']:.2f}x the floor; shown, no target)"
    )
    lines.append(
        f"a small limit per uncontended task: lock_limit=3 {rows[4]['x mutex']:.2f}x the mutex, "
        f"a one-slot queue {rows[5]['x mutex']:.2f}x (shown, no target)"
    )
    return lines


# -- main -------------------------------------------------------------------------------------


def parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench scale",
        description="The cost curves of issue 29, measured with Redis's own counters.",
    )
    parser.add_argument("--quick", action="store_true", help="the smallest sizes only (seconds)")
    parser.add_argument(
        "--only",
        default="",
        metavar="CURVES",
        help=f"comma-separated curves to measure (of {', '.join(CURVES)}; default all); the "
        "verdicts need all of them",
    )
    parser.add_argument(
        "--chart",
        nargs="?",
        const=DEFAULT_CHART_DIR,
        type=Path,
        metavar="DIR",
        help=f"draw one PNG per curve, DIR/scale-<curve>.png (default {DEFAULT_CHART_DIR})",
    )
    return parser.parse_args(list(argv))


@contextlib.contextmanager
def private_env(samples: int) -> Iterator[Env]:
    """A fresh private ``redis-server`` and what a curve measures it with: nothing one curve
    leaves (keys, a keyspace shrinking in the background) moves the next one's figures."""
    with RedisServer.running() as server:
        counter = RoundTripCounter()
        client, reader = counting_client(server.url, counter), server.client()
        locker = RedisLocker(client, prefix=new_prefix(), renewer=Renewer(autostart=False))
        try:
            yield Env(client, counter, locker, Counters(reader), samples)
        finally:
            locker.close()
            reader.close()


#: curve key -> how it is measured
CURVES: Dict[str, Callable[[Env, Sequence[int]], Curve]] = {
    "slots": slots_curve,
    "parked": parked_curve,
    "leases": leases_curve,
    "inspection": inspection_curve,
    "finished": finished_curve,
    "uncontended": uncontended_curve,
}


def measure(quick: bool, only: Sequence[str] = ()) -> Dict[str, Curve]:
    which = 0 if quick else 1
    sizes_of: Dict[str, Sequence[int]] = {key: sizes[which] for key, sizes in SIZES.items()}
    sizes_of["uncontended"] = UNCONTENDED_TASKS[which]
    steps = [(CURVES[key], sizes_of[key]) for key in CURVES if not only or key in only]
    curves: Dict[str, Curve] = {}
    for curve_of, sizes in steps:
        with private_env(SAMPLES[which]) as env:
            if not curves:
                print(
                    f"scale benchmark: redis {server_version(env.counters.client)} (a private "
                    f"redis-server on 127.0.0.1 per curve), {versions('redis')}"
                )
            curve = curve_of(env, sizes)
        curves[curve.key] = curve
    return curves


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = time.perf_counter()
    try:
        only = [key for key in args.only.split(",") if key]
        unknown = sorted(set(only) - set(CURVES))
        if unknown:
            raise BenchError(f"no curve {', '.join(unknown)} (curves: {', '.join(CURVES)})")
        curves = measure(args.quick, only)
    except BenchError as exc:
        print(f"scale benchmark FAILED: {exc}", file=sys.stderr)
        return 1
    for number, curve in enumerate(curves.values(), 1):
        print_curve(number, curve)
    print(f"\ndone in {time.perf_counter() - started:.1f} s")
    quick = " (--quick: at the smallest sizes; the targets are stated at the full ones)"
    if len(curves) == len(CURVES):
        print(f"targets of issue 29{quick if args.quick else ''}:")
        for line in verdicts(curves):
            print(f"   {line}")
    if args.chart is not None:
        for curve in curves.values():
            path = args.chart / f"scale-{curve.key}.png"
            draw(curve, path)
            print(f"chart: {path}")
    return 0
