"""Naming of the Redis keys and channel that belong to one lock.

Layout, for prefix ``P`` and lock name ``N``::

    P:{N}            the lock (a string with a TTL, see lua/includes/lock_value.lua)
    P:{N}:slots, P:{N}:slot-data
                     the slot table of a lock taken by up to N holders (``lock_limit``,
                     ``lock_rate``, policy ``queue``; see slots.py and
                     lua/includes/slot_table.lua): its slot numbers by when each frees (or
                     given back), and their lock values with the slot of each token, owner,
                     task id and reservation. Slot k is shown as ``P:{N}:slot:<k>`` (slot 1
                     as ``P:{N}``), a name, not a key of its own
    P:{N}:starts     its recent acquisitions, token scored by the server's clock in ms, trimmed
                     to the window of ``lock_rate`` (see slots.py)
    P:{N}:released   the channel its releases are published on
    P:{N}:queued     the task id of the message queued under this name (opt-in enqueue
                     deduplication): written by ENQUEUE with its own TTL, deleted by the
                     acquire of that task id or by a compare-and-delete (see lua/enqueue.lua)
    P:{N}:parked     the task ids parked behind the lock, scored by arrival (policy ``queue``)
    P:{N}:parked-messages
                     their parked messages, by task id
    P:{N}:parked-rule
                     'slots|rate|window ms' of calls parked over slots, a rate or a cooldown
                     (see lua/includes/slot_queue.lua), while any is parked
    P:{N}:parked-rounds
                     the arrival counter of parked calls and, parked fairly, each fairness
                     value's last round (see lua/includes/fair_queue.lua), while any is parked
    P:{N}:parked-fair, P:{N}:parked-fair-ids
                     calls parked fairly and not yet handed a slot, by value, then priority,
                     then arrival (a sorted set read by lex order), and each one's member there
                     by task id: which call takes its value's turn (lua/includes/fair_queue.lua)
    P:held           (one per prefix, no hash tag: one server only, never on a Cluster) the held
                     index: every held lock key and every slot table (its P:{N}:slots key,
                     read as its live slots), scored by when its (latest) lease ends
                     (lua/includes/held_index.lua), for reading the held locks without a SCAN
    P:queued         (one per prefix, no hash tag: one server only) the marker index: every queued
                     marker key, scored by when it expires (as the held index, written by
                     lua/enqueue.lua, acquire.lua and clear_queued.lua)
    P:{N}:cancel     policy restart: the task id of the running call asked to stop, and
    P:{N}:cancel-asked  the channel that task id is published on (see kinds/cancels.py)
    P:handoff-due    (one per prefix; one per slot on a Cluster, see below) lock
                     names a hand-off sweeper should look at, scored by when (see
                     lua/includes/handoff.lua)
    P:cap:F          (one per family F, a task's or group's name; on a Cluster a copy per
                     slot, ``P:cap:F:{T}``, see SharedKeys below) the live rule of its locks,
                     a hash: 'cap' (``celery locks limit``) and 'until' (``celery locks
                     pause``, ``pause_for``), see live_rules.py
    P:rules          (one per prefix, no hash tag) the families F that have had a live rule
                     (a set), so that listing them needs no SCAN
    P:due-slots      (one per prefix, no hash tag; a Redis Cluster only) the slots whose
                     hand-off index a sweeper should read, scored by when (slot_sweep.py)

Keys shared by many locks: the fence counter and the finish-record sets, so the number of
keys is bounded whatever the number of distinct lock names:


    P:fence                        the fence counter of the whole server (one string, never
                                   expires). Strictly increasing overall, hence strictly
                                   increasing per lock name.
    P:finished:<n>                 finish records (lua/includes/finish_records.lua): a sorted
                                   set of task ids scored by their expiry, for the ids with
                                   ``crc32(task_id) % SHARDS == n``. The client names it, so
                                   it is among the script's KEYS (Redis Cluster, its proxies
                                   and Dragonfly refuse a key made inside a script). At 1,000
                                   finished tasks/s kept 1 h (3.6M records) a set holds ~110,
                                   within Redis's compact listpack encoding (128 entries by
                                   default): ~50 bytes a record, and what expires at once
                                   is one small set.

    P:handoff-due                  the lock names a hand-off sweeper should look at, by when
                                   (lua/includes/handoff.lua)
    P:superseded-due               the lock names with displaced calls left to mark, by when
                                   (lua/includes/displace.lua)
    P:cap:F                        a family's live rule (live_rules.py); on a cluster only
                                   its copies, one per slot

On a Redis Cluster a script may only touch keys of one hash slot, so there is one counter,
one set of finish-record sets, one of each index and a copy of each live rule per slot: the
same names with ``:{T}`` inserted after ``fence`` / ``finished`` (appended to the indexes and
rules), where ``T`` is a short tag hashing to the lock's slot (:func:`slot_tag`), and
``CLUSTER_SHARDS`` sets per slot (fewer: the records spread over the slots; all of them in
one slot, e.g. a single lock name, still leave ~3,500 per set). At most 16,384 counters,
however many lock names. The scripts that use them: ``lua/includes/take_lock.lua``,
``lua/includes/finish_records.lua``, and those of the queue and latest wins; a sweeper reads
the indexes of a window of slots per tick (:mod:`.slot_sweep`).

``{N}`` is a Redis Cluster hash tag: the lock and its keys always share a slot, so one
script may touch them all (the shared keys carry a tag of the same slot).
"""

from __future__ import annotations

import re
from typing import NamedTuple, Optional
from zlib import crc32

from redis.crc import REDIS_CLUSTER_HASH_SLOTS, key_slot

from celery_singleton_lock.errors import LockConfigurationError

_PREFIX_PATTERN = re.compile(r"^[A-Za-z0-9_.:\-/|@#=+]{1,64}$")
_NAME_FORBIDDEN = re.compile(r"[{}\s]")
MAX_NAME_LENGTH = 512
_new = tuple.__new__


def validate_prefix(prefix: str) -> str:
    """Return ``prefix`` if it is safe as a key namespace, else raise ``LockConfigurationError``.

    Braces would break the hash tag and whitespace or control characters make keys unreadable
    in ``redis-cli``; both are refused rather than silently escaped.
    """
    if not isinstance(prefix, str) or not _PREFIX_PATTERN.match(prefix):
        raise LockConfigurationError(
            f"lock key prefix {prefix!r} is invalid: use 1-64 characters from "
            "letters, digits and _ . : - / | @ # = + (no braces, spaces or control characters)"
        )
    return prefix


def held_index(prefix: str) -> str:
    """Key of the held index of ``prefix`` (lua/includes/held_index.lua): the lock keys held
    and the slot tables with a slot taken (their ``:slots`` key: a slot has no key of its own),
    scored by when their lease ends (server ms). It has no hash tag, so no lock's script
    may write it on a Redis Cluster (another slot): it is kept on one server or a Sentinel
    group's primary only, and a Cluster is read by SCAN (reading.py)."""
    return f"{prefix}:held"


def marker_index(prefix: str) -> str:
    """Key of the marker index of ``prefix``: the queued marker keys (``LockKeys.queued``),
    scored by when they expire (server ms), kept by the scripts that write and delete them
    (lua/includes/held_index.lua's functions). One server only, as :func:`held_index`."""
    return f"{prefix}:queued"


def rule_index(prefix: str) -> str:
    """Key of the set of families with a live rule under ``prefix`` (:func:`cap_key`), written
    where a rule is (pause.lua, ``set_cap``), read by ``celery locks list`` instead of a SCAN.
    One server only, as the rules themselves."""
    return f"{prefix}:rules"


def handoff_index(prefix: str) -> str:
    """Key of the sorted set of lock names a hand-off sweeper looks at (lua/handoff_due.lua)."""
    return f"{prefix}:handoff-due"


def due_slots(prefix: str) -> str:
    """Key of a Redis Cluster's summary of its hand-off indexes (slot_sweep.py's
    :class:`~.slot_sweep.DueSlots`): the slot numbers whose index a sweeper should read,
    scored by when. No hash tag: one key, written by the client after a script, never by one."""
    return f"{prefix}:due-slots"


class LockKeys(NamedTuple):
    """The lock key and release channel of one name.

    A named tuple, not a frozen dataclass: made for every acquire, and a tuple is made in a
    third of the time (immutable all the same)."""

    lock: str
    channel: str

    @classmethod
    def build(cls, prefix: str, name: str) -> LockKeys:
        if not name or len(name) > MAX_NAME_LENGTH or _NAME_FORBIDDEN.search(name):
            raise LockConfigurationError(
                f"lock name {name[:80]!r} is invalid: it must be 1-{MAX_NAME_LENGTH} characters "
                "without braces or whitespace"
            )
        lock = f"{prefix}:{{{name}}}"
        return _new(cls, (lock, f"{lock}:released"))

    @property
    def queued(self) -> str:
        """Key of the queued marker: the task id published under this name (see module doc)."""
        return f"{self.lock}:queued"

    @property
    def starts(self) -> str:
        """Key of the sorted set of this lock's recent body starts (``lock_rate``)."""
        return f"{self.lock}:starts"

    @property
    def slot_table(self) -> list[str]:
        """The two keys of this lock's slot table (``lock_limit``, lua/includes/slot_table.lua):
        its slot numbers by when each frees, and their values with its index."""
        lock = self.lock
        return [f"{lock}:slots", f"{lock}:slot-data"]

    @property
    def parked(self) -> str:
        """Key of the sorted set of task ids parked behind this lock, in the order they are
        handed a slot (arrival, or rounds with ``fair``)."""
        return f"{self.lock}:parked"

    @property
    def parked_messages(self) -> str:
        """Key of the hash of parked messages, by task id."""
        return f"{self.lock}:parked-messages"

    @property
    def parked_rule(self) -> str:
        """Key of the rule of calls parked over slots, a rate or a cooldown (slot_queue.py)."""
        return f"{self.lock}:parked-rule"

    @property
    def parked_rounds(self) -> str:
        """Key of the hash of the arrival counter of parked calls and, parked fairly
        (``fair``), each fairness value's last round (see lua/includes/fair_queue.lua)."""
        return f"{self.lock}:parked-rounds"

    @property
    def parked_fair(self) -> list[str]:
        """Keys of the fair order (a sorted set, by value, priority and arrival) of calls
        parked fairly and not yet handed a slot, and of each one's member there by task id
        (a hash): lua/includes/fair_queue.lua."""
        return [f"{self.lock}:parked-fair", f"{self.lock}:parked-fair-ids"]

    @property
    def name(self) -> str:
        """The lock name between the hash-tag braces."""
        # rindex: a slot's name (``P:{N}:slot:k``, see slots.py) goes on after the brace
        return self.lock[self.lock.index("{") + 1 : self.lock.rindex("}")]


def cap_key(prefix: str, family: str) -> str:
    """Key of the live rule (a hash: ``cap``, ``until``; see live_rules.py) of the locks whose
    names start with ``family`` (a task's or group's name) and a colon: at most ``cap`` slots
    of each lock taken at once, whatever its ``lock_limit``, and no start before ``until``.
    Without a hash tag: a Cluster keeps a copy of it per slot (``SharedKeys.rule_of``)."""
    return f"{prefix}:cap:{family}"


# -- keys shared by many locks ------------------------------------------------------------------

#: finish-record sets of one server (see the module docstring)
SHARDS = 32_768
#: finish-record sets of one cluster slot
CLUSTER_SHARDS = 1_024

_slot_tags: Optional[list[str]] = None


def slot_tag(slot: int) -> str:
    """A short hash tag whose Redis Cluster slot is ``slot`` (the table is made once, on a
    cluster only: about 170,000 CRC16 computations in C, a fraction of a second)."""
    global _slot_tags
    if _slot_tags is None:
        tags: list[Optional[str]] = [None] * REDIS_CLUSTER_HASH_SLOTS
        missing, i = REDIS_CLUSTER_HASH_SLOTS, 0
        while missing:  # ends: base-36 counting covers every slot within a few 10^5 tags
            tag = _base36(i)
            found = key_slot(tag.encode())
            if tags[found] is None:
                tags[found] = tag
                missing -= 1
            i += 1
        _slot_tags = [tag for tag in tags if tag is not None]
    return _slot_tags[slot]


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
        if not number:
            return text


class SharedKeys:
    """The fence counter and finish-record sets shared by the locks of a prefix (on a cluster:
    by the locks of one slot)."""

    __slots__ = (
        "_per_slot",
        "cluster",
        "counter",
        "finished",
        "handoff",
        "prefix",
        "shards",
        "superseded",
    )

    def __init__(self, prefix: str, *, cluster: bool) -> None:
        self.prefix = prefix
        self.cluster = cluster
        self.counter = f"{prefix}:fence"
        self.finished = f"{prefix}:finished"
        #: the indexes of due locks: one each per prefix (per slot on a cluster: ``:{T}``)
        self.handoff = handoff_index(prefix)
        self.superseded = f"{prefix}:superseded-due"
        #: how many sets the finish records are spread over (per slot on a cluster)
        self.shards = CLUSTER_SHARDS if cluster else SHARDS
        self._per_slot: dict[int, tuple[str, str]] = {}

    def of(self, lock_key: str, task_id: str = "") -> tuple[str, str]:
        """``(fence counter key, finish-record set of task_id)`` for the lock at ``lock_key``."""
        counter, finished = self.counter, self.finished
        if self.cluster:
            slot = key_slot(lock_key.encode())
            pair = self._per_slot.get(slot)
            if pair is None:
                tag = slot_tag(slot)
                pair = (f"{counter}:{{{tag}}}", f"{finished}:{{{tag}}}")
                self._per_slot[slot] = pair
            counter, finished = pair
        return counter, f"{finished}:{crc32(task_id.encode()) % self.shards}"

    def handoff_index(self, lock_key: str) -> str:
        """The hand-off index that holds the lock at ``lock_key`` (its slot's on a cluster)."""
        if not self.cluster:
            return self.handoff
        return f"{self.handoff}:{{{slot_tag(key_slot(lock_key.encode()))}}}"

    def superseded_index(self, lock_key: str) -> str:
        """The index of displaced calls left to mark that holds the lock at ``lock_key``."""
        if not self.cluster:
            return self.superseded
        return f"{self.superseded}:{{{slot_tag(key_slot(lock_key.encode()))}}}"

    def rule_of(self, cap_key: str, lock_key: str) -> str:
        """The copy of a family's live rule ``cap_key`` (:mod:`.live_rules`) that the acquire
        of the lock at ``lock_key`` reads: the key itself on one server, its copy in the
        lock's slot on a cluster ("" without a rule). A copy is returned as it is: the rule
        a parked call stored names its copy (a family, a lock name's start, has no brace)."""
        if not (self.cluster and cap_key) or cap_key.endswith("}"):
            return cap_key
        return f"{cap_key}:{{{slot_tag(key_slot(lock_key.encode()))}}}"

    @staticmethod
    def of_slot(index: str, slot: int) -> str:
        """The cluster slot ``slot``'s copy of the prefix-wide key ``index``."""
        return f"{index}:{{{slot_tag(slot)}}}"
