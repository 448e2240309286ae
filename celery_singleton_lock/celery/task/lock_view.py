"""``self.request.lock``: what a running task knows about its lock."""

from __future__ import annotations

from typing import Optional

from celery_singleton_lock.engine import Lease, slot_of
from celery_singleton_lock.errors import LockError, LockLostError


class LockHandle:
    """The lock of one execution, attached to its request (so it is per thread).

    Attributes:
        key: the Redis key of the lock (None when no lock could be computed).
        reentrant: this run is nested inside a run of this thread holding the same key; the
            outer run owns (and will release) the lock.
        locked: False when the task runs without a lock (``lock_on_backend_error="run"``).
    """

    __slots__ = ("_lease", "key", "locked", "reentrant")

    def __init__(
        self,
        key: Optional[str],
        lease: Optional[Lease] = None,
        *,
        reentrant: bool = False,
        locked: bool = True,
    ) -> None:
        self.key = key
        self._lease = lease
        self.reentrant = reentrant
        self.locked = locked

    @property
    def lease(self) -> Optional[Lease]:
        """The engine lease this execution owns (None for reentrant or unlocked runs)."""
        return self._lease

    @property
    def fence(self) -> Optional[int]:
        """The fencing token of this acquisition (strictly increasing per key), if fencing."""
        return None if self._lease is None else self._lease.fence

    @property
    def slot(self) -> Optional[int]:
        """Which of the key's ``lock_limit`` slots this execution holds (1-based; always 1
        with a limit of 1); None without a lock."""
        return None if self.key is None or not self.locked else slot_of(self.key)

    @property
    def lost(self) -> bool:
        """True once Redis said the lock is no longer ours (or was unreachable past its TTL)."""
        return self._lease is not None and self._lease.lost.is_set()

    @property
    def held(self) -> bool:
        """True while the lock is ours: acquired, not lost, not released."""
        return self._lease is not None and self._lease.held

    def check(self) -> None:
        """Raise ``LockLostError`` if the lock was lost: call it before irreversible steps."""
        if self.lost:
            raise LockLostError(
                f"lock {self.key} was lost while the task ran (expired or taken over); "
                "stop before writing",
                self.key,
            )

    @property
    def cancelled(self) -> bool:
        """True once a newer call asked this one to stop (``on_duplicate="restart"``); always
        False for the other policies. The body may return early, or call
        :meth:`raise_if_cancelled`."""
        return False

    def raise_if_cancelled(self) -> None:
        """End this call as superseded (REVOKED, reason ``"superseded"``) if a newer call asked
        it to stop (``on_duplicate="restart"``); its lock goes to that call. Else nothing."""

    def pause_for(self, seconds: float) -> float:
        """No new start of this lock's task (or ``lock_group``) for ``seconds``, on every
        worker, whatever the arguments (an API answered 429 with a Retry-After): each call
        follows its ``on_duplicate`` policy as with a held lock (parked calls wake when the
        pause ends). Only lengthens a pause already set. Returns the pause's end (lock
        server's clock, seconds since the epoch). Needs one Redis server, Sentinel or a
        Redis Cluster."""
        raise LockError(f"this run holds no lock ({self.key}): there is no lock name to pause")

    def nested(self) -> LockHandle:
        """The handle of a reentrant run inside this one: same key and fence, owns nothing."""
        return _NestedHandle(self)

    def __repr__(self) -> str:
        state = "reentrant" if self.reentrant else ("held" if self.held else "not held")
        return f"<LockHandle {self.key} fence={self.fence} {state}>"


class _NestedHandle(LockHandle):
    """A reentrant run's view of the outer run's lock: reads through, never releases."""

    __slots__ = ("_outer",)

    def __init__(self, outer: LockHandle) -> None:
        super().__init__(outer.key, None, reentrant=True, locked=outer.locked)
        self._outer = outer

    @property
    def fence(self) -> Optional[int]:
        return self._outer.fence

    @property
    def lost(self) -> bool:
        return self._outer.lost

    @property
    def held(self) -> bool:
        return self._outer.held

    @property
    def cancelled(self) -> bool:
        return self._outer.cancelled

    def raise_if_cancelled(self) -> None:
        self._outer.raise_if_cancelled()

    def pause_for(self, seconds: float) -> float:
        return self._outer.pause_for(seconds)
