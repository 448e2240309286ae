"""Reading locks for the commands: every lock under a prefix, one lock, its holder as a
row or as JSON, and the lock name of a call."""

from __future__ import annotations

import difflib
import itertools
import math
import re
import shlex
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterator, Optional

import redis

from celery_singleton_lock.celery.cli.app_target import Target, asking
from celery_singleton_lock.celery.duplicates.actions import reserved_for
from celery_singleton_lock.celery.task.locked_task import LockedTask
from celery_singleton_lock.engine import (
    Client,
    LiveRule,
    LockHolder,
    LockInspector,
    LockKeys,
    PartsReader,
    slot_of,
)
from celery_singleton_lock.errors import LockConfigurationError, LockError

#: The name of every lock a task takes: ``<task name>:<SHA-256 of its arguments, in hex>``, or
#: ``<lock_group>:<...>`` for a task of a group (``ArgumentKeyer.name``).
TASK_LOCK_NAME = re.compile(r"[^\s{}]+:[0-9a-f]{64}")

#: ``list`` looks for locks under other prefixes with at most this many SCAN calls...
OTHER_PREFIX_SCANS = 100
#: ... of this COUNT each (so it looks at no more than about 100,000 keys).
OTHER_PREFIX_SCAN_COUNT = 1000
#: ... and names at most this many of the prefixes it finds.
OTHER_PREFIXES_SHOWN = 10


@dataclass
class Listing:
    """What ``list`` found."""

    holders: list[LockHolder]
    #: stopped at the limit: there may be more
    truncated: bool
    #: only looked for when nothing is held under the prefix in use
    other_prefixes: list[str]
    #: calls parked behind each holder's lock (policy ``queue``), in ``holders`` order
    parked: list[int] = field(default_factory=list)
    #: each holder's lock's lock_rate window: starts in it, seconds until it is empty
    rates: list[tuple[int, Optional[float]]] = field(default_factory=list)


#: ``list`` reads and prints the locks this many at a time (one pipelined read each).
LIST_PAGE = 500


@dataclass
class ListedPage:
    """One page of what ``list`` reads: holders, and the parked calls and lock_rate window
    of each one's lock (as :class:`Listing`'s)."""

    holders: list[LockHolder]
    parked: list[int]
    rates: list[tuple[int, Optional[float]]]


class LockStream:
    """The locks held now under the target's prefix, up to ``limit``, read a page at a time
    (:meth:`pages`, a generator): printed as they come, never all held in memory. From the
    held index on one server (O(held locks)), by SCAN on a Redis Cluster (see
    ``engine/reading.py``). Once the pages are read: how many, whether it stopped at
    ``limit``, and, when none was held, the other prefixes that hold lock-shaped keys.

    ``by_scan``: read one Redis server by SCAN rather than its held index (locks taken by
    workers of a version before the index, during a rolling upgrade).

    Raises:
        LockConfigurationError: ``by_scan`` on a quorum or PostgreSQL.
    """

    def __init__(
        self, target: Target, limit: int, page: int = LIST_PAGE, *, by_scan: bool = False
    ) -> None:
        inspector = target.inspector
        if by_scan and not isinstance(inspector, LockInspector):
            raise LockConfigurationError(
                "--scan reads the keys of one Redis server (or Sentinel, or Cluster); a quorum "
                "or PostgreSQL is read as it is: leave --scan out"
            )
        self.target = target
        self.limit = limit
        self.page = page
        self._read = (
            inspector.scan_keys
            if isinstance(inspector, LockInspector) and by_scan
            else inspector.scan
        )
        self.count = 0
        self.truncated = False
        self.other_prefixes: list[str] = []

    def pages(self) -> Iterator[ListedPage]:
        target, inspector = self.target, self.target.inspector
        holders = asking(target, lambda: self._read(self.page))
        while True:
            batch = asking(target, lambda: list(itertools.islice(holders, self.page)))
            room = self.limit - self.count
            if len(batch) > room:
                batch, self.truncated = batch[:room], True
            if batch:
                self.count += len(batch)
                yield self._page(batch)
            if self.truncated or len(batch) < self.page:
                break
            if self.count >= self.limit:  # stopped here only if there is one more
                self.truncated = asking(target, lambda: next(holders, None)) is not None
                break
        # other prefixes are looked for on one Redis server only (not a quorum nor PostgreSQL)
        if not self.count and len(target.clients) == 1:
            prefix = inspector.prefix
            self.other_prefixes = asking(
                target, lambda: lock_shaped_prefixes(target.client, prefix)
            )

    def _page(self, holders: list[LockHolder]) -> ListedPage:
        # a slot's key (``...}:slot:k``): its lock's parked calls and rate window
        keys = [holder.key[: holder.key.rindex("}") + 1] for holder in holders]
        inspector = self.target.inspector
        if not isinstance(inspector, PartsReader):  # no parked calls nor rates (a quorum)
            return ListedPage(holders, [0] * len(keys), [(0, None)] * len(keys))
        parked = asking(self.target, lambda: inspector.parked_counts(keys))
        rates = asking(self.target, lambda: inspector.rate_use(keys))
        return ListedPage(holders, parked, rates)


def list_locks(target: Target, limit: int) -> Listing:
    """The locks held now under the target's prefix, up to ``limit``, collected (for pages
    that show a bounded list; ``list`` prints :class:`LockStream`'s pages as they come);
    when there are none, the other prefixes that hold lock-shaped keys."""
    stream = LockStream(target, limit)
    listing = Listing([], False, [])
    for page in stream.pages():
        listing.holders += page.holders
        listing.parked += page.parked
        listing.rates += page.rates
    listing.truncated, listing.other_prefixes = stream.truncated, stream.other_prefixes
    return listing


def _scan_strings(client: redis.Redis, match: str) -> Iterator[list[Any]]:
    """Batches of string keys matching ``match``, from a bounded number of SCAN calls."""
    cursor = 0
    for _ in range(OTHER_PREFIX_SCANS):
        cursor, keys = client.scan(
            cursor, match=match, count=OTHER_PREFIX_SCAN_COUNT, _type="string"
        )
        if keys:
            yield keys
        if cursor == 0:
            return


def lock_shaped_prefixes(client: Client, exclude: str) -> list[str]:
    """Prefixes other than ``exclude`` with lock-shaped keys: ``<prefix>:{<name>}`` strings
    whose value has ``|`` right after the 32-character token (see ``engine/lua/``).

    Bounded: at most ``OTHER_PREFIX_SCANS`` SCAN calls, never KEYS. None looked for on a
    Redis Cluster (a bounded SCAN there is one cursor per primary; the hint is not worth it).
    """
    if not isinstance(client, redis.Redis):
        return []
    found: set[str] = set()
    for batch in _scan_strings(client, "*:{*}"):
        pipe = client.pipeline(transaction=False)
        for key in batch:
            pipe.getrange(key, 32, 32)
        for key, mark in zip(batch, pipe.execute()):
            text = key.decode("utf-8", "replace") if isinstance(key, bytes) else str(key)
            prefix = text[: text.index(":{")]
            if mark in (b"|", "|") and prefix != exclude:
                found.add(prefix)
        if len(found) >= OTHER_PREFIXES_SHOWN:
            break
    return sorted(found)[:OTHER_PREFIXES_SHOWN]


#: A lock name with a slot of its lock_limit after it, ``TASKNAME:DIGEST:slot:K`` (a task's lock
#: name ends with its digest, so it is never one)...
_NAME_AND_SLOT = re.compile(r"(.+):slot:(\d+)")
#: ... and the end of a slot's key as ``list`` prints it, ``PREFIX:{NAME}:slot:K``.
_KEY_SLOT = re.compile(r"\}:slot:(\d+)$")


def lock_name_from_key(target: Target, given: str) -> tuple[str, Optional[int]]:
    """The lock name in ``given``, and the slot of its lock_limit it names (None: none named).

    Takes every form ``list`` prints and the one the user may make of them: a lock name, its
    full key (``PREFIX:{NAME}``), a slot's key (``PREFIX:{NAME}:slot:K``, K >= 2: slot 1 is the
    lock key itself), or a task's lock name followed by ``:slot:K``.

    Raises:
        LockConfigurationError: a full key under another prefix (says which --prefix to use),
            or a slot key of slot 0 or 1.
    """
    prefix = target.inspector.prefix
    head, slot = given, None
    in_key = _KEY_SLOT.search(given)
    in_name = _NAME_AND_SLOT.fullmatch(given)
    if in_key:
        head, slot = given[: in_key.start() + 1], int(in_key.group(1))
    elif in_name and TASK_LOCK_NAME.fullmatch(in_name.group(1)):
        head, slot = in_name.group(1), int(in_name.group(2))
    if slot is not None and slot < 2:
        raise LockConfigurationError(
            f"{given!r} names slot {slot}: the slots after the first are numbered from 2 (slot 1 "
            "is the lock's own key, PREFIX:{NAME}); give the lock name, or --slot K"
        )
    if head.startswith(f"{prefix}:{{") and head.endswith("}"):
        return head[len(prefix) + 2 : -1], slot
    if ":{" in head and head.endswith("}"):
        other = head[: head.index(":{")]
        raise LockConfigurationError(
            f"key {given!r} is under prefix {other!r}, not {prefix!r}: add --prefix {other}"
        )
    return head, slot


def lock_name_of_call(
    app: Any, task_name: str, args: Optional[list[Any]], kwargs: Optional[dict[str, Any]]
) -> str:
    """The lock name a call of ``task_name`` with ``args`` and ``kwargs`` takes: exactly what
    the task computes, ``task.lock_options.keyer.name(args, kwargs)``.

    Raises:
        LockConfigurationError: the task is unknown or takes no lock.
        LockKeyError: the arguments do not fit the task (said as the task would say it).
    """
    try:
        tasks = app.tasks
        if task_name not in tasks:
            # tasks of the ``imports`` / ``include`` settings, as a worker would load them
            app.loader.import_default_modules()
    except LockError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's task modules may raise anything
        raise LockConfigurationError(
            f"cannot load the app's tasks: {type(exc).__name__}: {exc}"
        ) from None
    task = tasks.get(task_name)
    if task is None:
        locked = [name for name, t in tasks.items() if isinstance(t, LockedTask)]
        close = difflib.get_close_matches(task_name, locked, n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise LockConfigurationError(f"task {task_name!r} is not registered in the app{hint}")
    if not isinstance(task, LockedTask):
        raise LockConfigurationError(
            f"task {task_name!r} is not a LockedTask (base=LockedTask): it takes no lock"
        )
    return str(task.lock_options.keyer.name(args or [], kwargs or {}))


def read_lock(target: Target, name: str) -> Optional[LockHolder]:
    """The holder of lock ``name`` (None when free).

    No fence is read: fences come from one counter per server (or Cluster slot) shared by
    every name, so its value says nothing of one lock."""
    LockKeys.build(target.inspector.prefix, name)  # a bad name is bad input, not server trouble
    return asking(target, lambda: target.inspector.read(name))


def read_slot(target: Target, name: str, slot: Optional[int]) -> Optional[LockHolder]:
    """The holder of lock ``name``'s ``slot`` (None: slot 1, the lock key), None if free:
    what a release from a page checks against the holder the page showed."""
    if slot is None:
        return target.inspector.read(name)
    held = target.inspector.holders(name, slot)
    return next((seen for seen in held if slot_of(seen.key) == slot), None)


#: ``show`` reads this many slots of a lock (a lock_limit above it shows its first ones).
SHOWN_SLOTS = 64


def read_slots(target: Target, name: str) -> tuple[list[LockHolder], int, Optional[float]]:
    """The holders of lock ``name``'s slots (up to :data:`SHOWN_SLOTS`, slot order), and its
    lock_rate window: the starts in it and the seconds until it is empty (None: no rate)."""
    inspector = target.inspector
    key = LockKeys.build(inspector.prefix, name).lock
    holders = asking(target, lambda: inspector.holders(name, SHOWN_SLOTS))
    if not isinstance(inspector, PartsReader):  # no rate (a quorum)
        return holders, 0, None
    ((starts, empty_in),) = asking(target, lambda: inspector.rate_use([key]))
    return holders, starts, empty_in


def queued_line(name: str, task_id: str, left: Optional[float], invocation: str) -> str:
    """What ``show`` says of a lock name's enqueue marker (``dedupe_on_enqueue``): while it
    lives, a call of the name is not published (its sender gets ``task_id``'s result)."""
    lives = "no TTL" if left is None else f"expires in {left:.1f}s"
    return (
        f"queued: task {task_id} (dedupe_on_enqueue marker, {lives}); calls of this name are "
        f"not published while it is there. If that message was lost (a purged queue): "
        f"{invocation} clear-queued {shlex.quote(name)}"
    )


def rate_row(starts: int, empty_in: Optional[float]) -> str:
    """What a lock's lock_rate window holds, for ``list`` and ``show``."""
    return f"rate: {starts} start(s) in the window, empty in {empty_in or 0:.1f}s"


def refuse_a_name_no_task_takes(name: str, prefix: str) -> None:
    """For a lock that is free (no slot held, nothing parked): refuse ``name`` if no task
    could take a lock under it, rather than answer "free" for a typo, a task name or a call's
    arguments given in its place. (A lock taken with the engine under a name of its own is
    still shown while it is held; without an app, ``--url`` alone, it is never refused.)

    Raises:
        LockConfigurationError: saying what a lock name looks like and how to get one.
    """
    if TASK_LOCK_NAME.fullmatch(name):
        return
    raise LockConfigurationError(
        f"{name!r} is not a lock name, and no lock of that name exists under prefix "
        f"{prefix!r}: a task's lock is named TASKNAME:DIGEST, or GROUP:DIGEST with a "
        "lock_group (DIGEST: 64 hex digits, a hash of the call's arguments), as list shows it "
        "between the braces; for the lock of one "
        "call give --task TASKNAME --args JSON"
    )


def holder_row(holder: LockHolder, now: float) -> str:
    """One line describing ``holder``."""
    age = "-" if holder.acquired_at is None else f"{max(0.0, now - holder.acquired_at):.1f}s"
    ttl = "none" if holder.ttl is None else f"{holder.ttl:.1f}s"
    fence = "-" if holder.fence is None else str(holder.fence)
    row = (
        f"{holder.key}  task={holder.task_id or '-'}  host={holder.host or '-'}  "
        f"pid={holder.pid or '-'}  age={age}  ttl={ttl}  fence={fence}"
    )
    # a key in its lock_cooldown: the run named has ended, ttl is the cooldown left
    return f"{row}  cooldown={ttl} left" if holder.cooling else row


def holder_json(holder: LockHolder, prefix: str) -> dict[str, Any]:
    """``holder`` as ``list --json`` prints it (``name`` is the lock name inside the key)."""
    key = holder.key
    # a slot of a lock_limit (``...}:slot:k``) goes on after the name's closing brace
    name = key[len(prefix) + 2 : key.rindex("}")] if key.startswith(f"{prefix}:{{") else ""
    return {
        "key": key,
        "name": name,
        "task_id": holder.task_id,
        "host": holder.host,
        "pid": holder.pid,
        "acquired_at": holder.acquired_at,
        "ttl": holder.ttl,
        "fence": holder.fence,
        "slot": slot_of(key),  # of a lock_limit; 1 for a plain lock
        "cooldown": holder.cooling,  # in its lock_cooldown: the run named has ended
        "cooldown_left": holder.ttl if holder.cooling else None,  # seconds
    }


def describe_holder(holder: LockHolder) -> str:
    """``task T on node N, pid P``: who holds a lock, for a sentence; for a hand-off
    reservation, the parked call it is kept for (no process holds it)."""
    parked = reserved_for(holder)
    if parked is not None:
        return f"no one yet: reserved for parked call {parked}"
    where = "node" if is_worker_node(holder.host) else "host"
    return f"task {holder.task_id or '-'} on {where} {holder.host or '-'}, pid {holder.pid or '-'}"


def is_worker_node(host: str) -> bool:
    """True if ``host`` is a Celery worker node name (``name@hostname``): a worker stores its
    node name as the holder's host, a process outside a worker its plain host name."""
    name, at, hostname = host.partition("@")
    return bool(name and at and hostname)


def waiting_line(
    parked: list[str], newest: Optional[tuple[str, Optional[float]]], now: float
) -> str:
    """What ``show`` says of the calls waiting behind a lock: parked in arrival order (policy
    ``queue``), or the one newest call of ``replace``, held back until its due time with a
    debounce (``newest``: :meth:`~.engine.LockInspector.waiting_newest`)."""
    ids = " ".join(parked)
    if newest is None:
        return f"parked: {len(parked)} call(s), oldest first: {ids}"
    _, due = newest
    if due is not None and due > now:
        at = datetime.fromtimestamp(due, timezone.utc).isoformat(timespec="milliseconds")
        return f"held back until {at} (debounce, in {due - now:.1f}s), newest call: {ids}"
    return f"waiting to replace (the newest call, it runs when the lock is free): {ids}"


def pause_line(paused_for: float, now: float) -> str:
    """What ``show`` and ``list`` say of a pause of the lock's task or group (``celery locks
    pause``, a body's ``pause_for``): seconds left and until when (``now`` plus them, by this
    machine's clock), or until resumed (``inf``)."""
    if math.isinf(paused_for):
        return "paused: no start until `celery locks resume` (celery locks pause)"
    return (
        f"paused: no start for {paused_for:.1f}s more, until {_iso(now + paused_for)} "
        "(celery locks pause, pause_for)"
    )


def _iso(at: float) -> str:
    return datetime.fromtimestamp(at, timezone.utc).isoformat(timespec="milliseconds")


def read_live_rules(target: Target) -> dict[str, LiveRule]:
    """The live caps and pauses of tasks and groups (``celery locks limit / pause``), by
    family, in one read of the rule index; none where there are no live rules (a Redlock
    quorum, a Redis Cluster)."""
    rules = None if target.quorum else target.backend.live_rules
    return {} if rules is None else asking(target, rules.every)


def rule_json(family: str, rule: LiveRule, now: float) -> dict[str, Any]:
    """A family's live rule as ``list --json``, the console and the Django admin show it:
    its live cap (None: its declared lock_limit holds), whether it is paused, and until when
    (``paused_until``, seconds since the epoch by this machine's clock; None while paused:
    until resumed)."""
    paused_for = rule.paused_for
    ends = paused_for is not None and not math.isinf(paused_for)
    return {
        "family": family,
        "live_cap": rule.cap,
        "paused": paused_for is not None,
        "paused_for": paused_for if ends else None,
        "paused_until": now + paused_for if ends and paused_for is not None else None,
    }


def paused_until_text(rule: LiveRule, now: float) -> str:
    """A pause's end for a table cell: an ISO time, "until resumed", or "" (not paused)."""
    if rule.paused_for is None:
        return ""
    if math.isinf(rule.paused_for):
        return "until resumed"
    return _iso(now + rule.paused_for)
