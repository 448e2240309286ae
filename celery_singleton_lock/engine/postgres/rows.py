"""The row names of locks and their slots in the leases table (see :mod:`.slots`): slot 1 is
the lock's own row (its name), slot k > 1 the row ``{name}:slot:k``, what follows the prefix
in the slot's Redis key (:mod:`...slots`); no lock has that name (lock names have no
braces)."""

from __future__ import annotations

from celery_singleton_lock.engine.keys import LockKeys


def row_name(keys: LockKeys) -> str:
    """The leases table's row name of the lock or slot ``keys``: the lock's name for the lock
    (and its slot 1), ``{name}:slot:k`` for a further slot (what follows the prefix in its
    key)."""
    lock = keys.lock
    if lock[-1] == "}":
        return keys.name
    return lock[lock.index(":{") + 1 :]


def slot_row(name: str, slot: int) -> str:
    """The row name of ``slot`` (1-based) of the lock ``name``."""
    return name if slot == 1 else f"{{{name}}}:slot:{slot}"


def key_of_row(prefix: str, row: str) -> str:
    """The lock or slot key (``prefix:{name}``, ``prefix:{name}:slot:k``) of a row name."""
    return f"{prefix}:{row}" if row[:1] == "{" else f"{prefix}:{{{row}}}"


def announced(keys: LockKeys) -> str:
    """The lock key a release of the lock or slot ``keys`` NOTIFYs (a waiter listens for the
    lock's, whichever slot frees: its channel is the lock's)."""
    return keys.channel[: -len(":released")]
