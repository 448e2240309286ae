""" "Latest wins" (policy ``replace``, and ``lock_debounce``): how a call asks for it
(:class:`Latest`) and the keys it uses; the kind itself is :mod:`.kinds.latest`.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from celery_singleton_lock.engine.keys import LockKeys


class Latest(NamedTuple):
    """How an acquire with ``park`` waits when the newest call wins (``AcquireRequest.latest``).

    ``debounce``: seconds a call is held before it may run, even on a free lock; a newer call
    within them takes its place and starts them again (0: none, the lock is taken when free).
    ``debounce_max``: seconds from a burst's first call after which the waiting call is due
    however many newer ones came (None: no bound).
    ``sent``: when the call was sent, as a string that sorts in sending order (16 digits of
    epoch microseconds, then a tie-breaker): a call sent before the newest that waits, holds
    or held the lock is refused as superseded (``AlreadySuperseded``), never waits or runs
    ("": the order of arrival decides).
    """

    debounce: float = 0.0
    debounce_max: Optional[float] = None
    sent: str = ""


#: Seconds a worker has to mark the calls it displaced before a sweeper does it for them.
SUPERSEDED_GRACE = 5.0
#: Task ids remembered as superseded per lock, at most (the oldest are forgotten first; the
#: scripts' own constant, lua/includes/displace.lua).
MAX_SUPERSEDED = 1000


def debounce_key(keys: LockKeys) -> str:
    """Key of the lock's debounce hash (see lua/includes/displace.lua)."""
    return f"{keys.lock}:latest"


def superseded_keys(keys: LockKeys, index: str) -> list[str]:
    """Keys of the lock's superseded ids, of its calls left to mark, and ``index``, the index
    of those that holds the lock (the prefix's, or its slot's on a Cluster: see
    keys.py; lua/includes/displace.lua)."""
    return [f"{keys.lock}:superseded", f"{keys.lock}:superseded-left", index]
