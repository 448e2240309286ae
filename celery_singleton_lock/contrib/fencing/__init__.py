"""Fence checks in the user's own transaction: a write made conditional on the lock's fence,
so that the database itself refuses the write of a holder whose lock was lost and taken over.

A task with ``lock_fencing=True`` reads its fence from ``self.request.lock.fence`` (whatever
lock server issued it: Redis, Sentinel, Cluster, the Redlock quorum or PostgreSQL). Each
helper writes that fence beside the data and refuses the write, raising
:class:`~celery_singleton_lock.errors.StaleFenceError`, when the row already carries a higher
one (a lower fence is an older holder; the same fence is the same holder writing again):

* ``celery_singleton_lock.contrib.fencing.psycopg``: plain psycopg 3 (extra ``[postgres]``);
* ``celery_singleton_lock.contrib.fencing.sqlalchemy``: SQLAlchemy Core (extra ``[sqlalchemy]``);
* ``celery_singleton_lock.contrib.django.fencing``: the Django ORM (extra ``[django]``).

This module holds what they share: the check of the fence they are given and the error they
raise. Each helper imports its own library; nothing else in the package imports them.
"""

from __future__ import annotations

from typing import Any, Optional

from celery_singleton_lock.errors import StaleFenceError

__all__ = ["checked_fence", "stale"]


def checked_fence(fence: Any) -> int:
    """``fence`` as the helpers take it: an ``int`` (``self.request.lock.fence``).

    ``None`` is what ``self.request.lock.fence`` is without ``lock_fencing=True``: writing it
    would switch the check off, so it is refused here, before any SQL.
    """
    if fence is None:
        raise ValueError(
            "a fenced write needs the lock's fence, and it is None: give the task "
            "lock_fencing=True (self.request.lock.fence is None without it)"
        )
    if isinstance(fence, bool) or not isinstance(fence, int):
        raise TypeError(f"a fence is an int (self.request.lock.fence), not {fence!r}")
    return fence


def stale(what: str, fence: int, seen: Optional[int]) -> StaleFenceError:
    """The error of a fenced write refused because ``what`` carries the fence ``seen``."""
    return StaleFenceError(
        f"write of {what} with fence {fence} refused: it already carries fence {seen}, "
        "written by a newer holder of the lock (this holder's lock was lost)",
        what,
        {"fence": fence, "seen": seen},
    )
