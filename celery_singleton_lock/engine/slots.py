"""At most N holders per lock name (``lock_limit``): a slot table per lock, whatever N.

A lock taken by up to N holders keeps its slots in two keys beside the lock key, with its hash
tag (lua/includes/slot_table.lua): a sorted set of the slot numbers by when each frees (ms, by
the server's clock; a number given back is scored below any time), and a hash of their lock
values (the one shape of lua/includes/lock_value.lua) and of the slot each token, owner, task
id and reservation holds. An acquire takes the smallest free number (the lowest given back,
else the next never issued), so a slot's number stays below N; a holder that died is given
back lazily, a bounded number per call. Every script that reads or writes a slot finds it in
O(log n) by token (renewal, release), by owner (the worker's main process renewing or freeing
a child's slot), by task id or reservation (the slot queue), so none is handed the N slots and
none grows with N: an acquire is 7 commands, ~17 us of server time at N = 10 and at N = 1,000
(166 us at 1,000 when each slot was a key of its own; docs/explanation/benchmarks.md). Both
keys live at least as long as their last slot (at most twice its TTL) and go with the release
of the last one.

A slot has no key of its own: slot ``k`` is shown (``Lease.key``, ``LockHolder.key``,
``celery locks list``) as ``P:{N}:slot:k``, slot 1 as the lock key ``P:{N}``. Its fence comes
from the lock's shared counter (strictly increasing per name, whichever slot is taken).

Which locks live here is chosen once per task (``AcquireRequest.slotted``, the Celery layer's
``LockOptions.slotted``): a ``lock_limit`` other than the static 1 (a callable one too, whatever
it returns for a call), a rate (``lock_rate``: the same script counts the starts of the lock in
a sorted set, ``P:{N}:starts``, by the server's clock), or the duplicates queue (policy
``queue`` parks behind the slots at any N, :mod:`.kinds.slot_queue`); any other lock is the
mutex of :mod:`.locker` and its lock key. The script: lua/acquire_slot.lua, sent by
:mod:`.kinds.slots` (what is here: the names of slots, which reading and PostgreSQL use too).
"""

from __future__ import annotations

from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.lease import slot_name


def slot_key(keys: LockKeys, slot: int) -> str:
    """Name of the 1-based ``slot`` of the lock of ``keys`` (slot 1 is shown as the lock key)."""
    return slot_name(keys.lock, slot)


def slot_keys(keys: LockKeys, slot: int) -> LockKeys:
    """The keys a lease on ``slot`` of a lock kept in rows, one per slot (PostgreSQL
    admission, postgres/slots.py), uses: that slot's name and the lock's channel (a release of
    any slot wakes the lock's waiters)."""
    if slot == 1:
        return keys
    return LockKeys(lock=slot_key(keys, slot), channel=keys.channel)


def slot_of(key: str) -> int:
    """The 1-based slot of a lock key or slot name."""
    head, _, slot = key.rpartition(":slot:")
    return int(slot) if head.endswith("}") and slot.isdigit() else 1
