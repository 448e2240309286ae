"""What the admin's page shows, read as ``celery locks list`` and ``show`` read it: the
locks held now (each slot of a lock_limit, a cooldown, the lock_rate window), the calls
parked behind them, the queued markers, the live caps and pauses of tasks and groups, and
whether each holder's worker node answers a ping.
No Django here: a plain function of a :class:`Target`."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from celery_singleton_lock.celery.cli.app_target import Target, asking
from celery_singleton_lock.celery.cli.lock_listing import (
    describe_holder,
    holder_json,
    is_worker_node,
    list_locks,
    paused_until_text,
    rate_row,
    read_live_rules,
    rule_json,
    waiting_line,
)
from celery_singleton_lock.engine import LiveRule, LockHolder, PartsReader

#: Locks listed at most (the page says when there are more).
LIST_LIMIT = 500
#: Queued markers listed at most.
QUEUED_LIMIT = 200
#: Parked calls named per lock at most (the count is always whole).
PARKED_NAMED = 20


@dataclass(frozen=True)
class HeldRow:
    """One held key: a lock, or one slot of a lock_limit."""

    #: the key as ``list`` prints it; what a release form posts
    key: str
    name: str
    slot: int
    task_id: str
    #: who holds it, in a sentence (``task T on node N, pid P``)
    holder: str
    age: Optional[float]
    ttl: Optional[float]
    fence: Optional[int]
    #: in its lock_cooldown: the run named has ended, ``ttl`` is the cooldown left
    cooling: bool
    #: True answers a ping, False does not, None cannot be asked (not a worker node)
    alive: Optional[bool]
    parked: int
    #: what ``show`` says of the calls waiting behind it; empty when none
    waiting: str
    #: what ``show`` says of its lock_rate window; empty without a rate
    rate: str


@dataclass(frozen=True)
class QueuedRow:
    """A queued marker (``dedupe_on_enqueue``): calls of ``name`` are not published while
    it lives."""

    name: str
    task_id: str
    #: seconds left; None: no TTL
    left: Optional[float]


@dataclass(frozen=True)
class RuleRow:
    """The live rule of a task or group (``celery locks limit / pause``)."""

    family: str
    #: the live cap; None: its declared lock_limit holds
    live_cap: Optional[int]
    paused: bool
    #: when the pause ends (ISO time), "until resumed", or "" (not paused)
    paused_until: str
    #: seconds the pause still lasts; None: not paused, or until resumed
    paused_for: Optional[float]


@dataclass
class Overview:
    server: str
    prefix: str
    held: list[HeldRow] = field(default_factory=list)
    queued: list[QueuedRow] = field(default_factory=list)
    #: the live caps and pauses of tasks and groups, by family
    rules: list[RuleRow] = field(default_factory=list)
    #: stopped at LIST_LIMIT (or QUEUED_LIMIT): there may be more
    truncated: bool = False
    #: other prefixes with locks, looked for when none is held under this one
    other_prefixes: list[str] = field(default_factory=list)


def read_overview(target: Target, app: Any, ping_timeout: float) -> Overview:
    """Everything the page shows, from ``target``'s server; ``app`` asks the holders' worker
    nodes (one broadcast ping, ``ping_timeout`` seconds at most).

    Raises:
        LockError: the server could not be read (said with its address).
    """
    listing = list_locks(target, LIST_LIMIT)
    inspector = target.inspector
    answering = answering_nodes(app, {h.host for h in listing.holders}, ping_timeout)
    now = time.time()
    held: list[HeldRow] = []
    said: set[str] = set()  # the locks whose waiting calls are said (on their first row)
    for holder, parked, rate in sorted(
        zip(listing.holders, listing.parked, listing.rates), key=lambda row: row[0].key
    ):
        row = _row(target, holder, parked, rate, answering, now, said)
        said.add(row.name)
        held.append(row)
    names = (
        asking(target, lambda: list(itertools.islice(inspector.queued_names(), QUEUED_LIMIT + 1)))
        if isinstance(inspector, PartsReader)
        else []  # a backend with no queued markers (a quorum)
    )
    queued = [
        row for row in (_queued(target, name) for name in sorted(names[:QUEUED_LIMIT])) if row
    ]
    rules = [
        RuleRow(
            family, rule.cap, shown["paused"], paused_until_text(rule, now), shown["paused_for"]
        )
        for family, rule in read_live_rules(target).items()
        for shown in (rule_json(family, rule, now),)
    ]
    return Overview(
        server=target.server,
        prefix=inspector.prefix,
        held=held,
        queued=queued,
        rules=rules,
        truncated=listing.truncated or len(names) > QUEUED_LIMIT,
        other_prefixes=listing.other_prefixes,
    )


def answering_nodes(app: Any, hosts: set[str], timeout: float) -> Optional[set[str]]:
    """The worker nodes among ``hosts`` that answer one broadcast ping within ``timeout``
    (it returns as soon as all have); None when the broker cannot be asked."""
    nodes = sorted(host for host in hosts if is_worker_node(host))
    if not nodes or app is None:
        return set()
    try:
        replies = app.control.ping(destination=nodes, timeout=timeout, limit=len(nodes))
    except Exception:  # noqa: BLE001 - a broker transport may raise anything; the page
        # then says "cannot be asked" rather than fail
        return None
    return {node for reply in replies or [] for node in reply}


def _row(
    target: Target,
    holder: LockHolder,
    parked: int,
    rate: tuple[int, Optional[float]],
    answering: Optional[set[str]],
    now: float,
    said: set[str],
) -> HeldRow:
    shown = holder_json(holder, target.inspector.prefix)
    name = str(shown["name"])
    waiting = ""
    inspector = target.inspector
    # said once per lock, on its first row; parked calls are counted only where they exist
    if parked and name not in said and isinstance(inspector, PartsReader):
        ids = asking(target, lambda: inspector.parked(name))
        newest = asking(target, lambda: inspector.waiting_newest(name))
        waiting = waiting_line(ids[:PARKED_NAMED], newest, now)
        if len(ids) > PARKED_NAMED:
            waiting += f" ... ({len(ids)} in all)"
    starts, empty_in = rate
    alive = (
        None if answering is None or not is_worker_node(holder.host) else holder.host in answering
    )
    return HeldRow(
        key=holder.key,
        name=name,
        slot=int(shown["slot"]),
        task_id=holder.task_id,
        holder=describe_holder(holder),
        age=None if holder.acquired_at is None else max(0.0, now - holder.acquired_at),
        ttl=holder.ttl,
        fence=holder.fence,
        cooling=holder.cooling,
        alive=alive,
        parked=parked,
        waiting=waiting,
        rate="" if empty_in is None else rate_row(starts, empty_in),
    )


def _rule_row(family: str, rule: LiveRule, now: float) -> RuleRow:
    shown = rule_json(family, rule, now)
    until = paused_until_text(rule, now)
    return RuleRow(family, rule.cap, bool(shown["paused"]), until, shown["paused_for"])


def _queued(target: Target, name: str) -> Optional[QueuedRow]:
    markers = target.backend.markers
    if markers is None:
        return None
    task_id = asking(target, lambda: markers.queued(name))
    if task_id is None:  # taken by its acquire since the scan
        return None
    return QueuedRow(name, task_id, asking(target, lambda: markers.queued_for(name)))
