"""At most N holders per lock name (``lock_limit``): N slots, each an ordinary lock key.

Slot 1 of a lock is the lock key itself (``P:{N}``); slot ``k`` > 1 is ``P:{N}:slot:k``. Every
slot holds a lock value of the one shape (lua/includes/lock_value.lua: token, fence, owner
fields), so everything that works on one lock key by its name works on a slot unchanged: the
batched RENEW of the pool's renewer (it sends each lease's own key), the owner-checked RELEASE, and
the key's TTL after ``kill -9``. A slot is released only by its token, so a slot freed by one
holder is never released by another. The slots share the lock's hash tag (one Cluster slot)
and its fence counter (a fence strictly increasing per lock name, whichever slot is taken).

Cost: linear in N. An acquire passes the N slot keys in ``KEYS`` (a script is handed every key
it touches, and it may take any slot) and reads them in one MGET, plus a PTTL per slot when
all are held to name the holder that frees first: 4 / 149 us of server time at N = 1 / 1,000
free, 435 us with N-1 held. Passing the keys alone is linear (an EVALSHA that only returns:
0.8 us with one key, 34 us with 1,000), so no index beside numbered keys can make the acquire
flat while the script must be handed the key it takes: that needs the holders in keys whose
names do not depend on the slot (a sorted set by expiry and a hash of values), which moves
renewal, release, the reads and the slot queue with it (docs/explanation/benchmarks.md). The
worker's main process renews a child's slot by owner, and remembers which slot that was
(:mod:`.server_renewal`): its every slot is sent once per execution, not at every tick.

A limit of 1 never comes here unless a rate is asked for (``lock_rate``: the same script
counts the starts of the lock in a sorted set, ``P:{N}:starts``, by the server's clock); else
it is the mutex of :mod:`.locker`, same script, same keys. The script: lua/acquire_slot.lua.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from celery_singleton_lock.engine.keys import LockKeys


def slot_key(keys: LockKeys, slot: int) -> str:
    """Key of the 1-based ``slot`` of the lock of ``keys`` (slot 1 is the lock key)."""
    return keys.lock if slot == 1 else f"{keys.lock}:slot:{slot}"


def slot_keys(keys: LockKeys, slot: int) -> LockKeys:
    """The keys a lease on ``slot`` uses: that slot's key and the lock's channel (a release of
    any slot wakes the lock's waiters)."""
    if slot == 1:
        return keys
    return LockKeys(lock=slot_key(keys, slot), channel=keys.channel)


def slot_of(key: str) -> int:
    """The 1-based slot of a lock or slot key."""
    head, _, slot = key.rpartition(":slot:")
    return int(slot) if head.endswith("}") and slot.isdigit() else 1


def acquire_call(
    keys: LockKeys,
    limit: int,
    ttl_ms: int,
    value: str,
    fencing: bool,
    rate: Optional[tuple[int, float]],
    shared: tuple[str, str],
    task_id: str,
    unless_finished: bool,
    cap_key: str = "",
    held: Sequence[str] = (),
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of lua/acquire_slot.lua (``rate``: at most that many starts per that many
    seconds, or None; ``shared``: the fence counter and the finish-record set of ``task_id``
    on the lock's server or slot; ``unless_finished``: to look for that record; ``cap_key``:
    the task's live cap, or "")."""
    script_keys = [slot_key(keys, slot) for slot in range(1, limit + 1)]
    counter, finished = shared
    script_keys += (counter, keys.starts, finished)
    if cap_key:
        script_keys.append(cap_key)
    args: list[Any] = [ttl_ms, value, "1" if fencing else "0", limit]
    args += ("", "") if rate is None else (rate[0], max(1, int(rate[1] * 1000)))
    args += (task_id, "1" if unless_finished else "", "1" if held else "")
    script_keys += held  # the held index, last (ARGV[9])
    return script_keys, args
