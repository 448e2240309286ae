"""Value objects of the engine: who owns a lock, who holds it, and a held lease."""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from .keys import LockKeys

if TYPE_CHECKING:
    from .locker import RedisLocker

log = logging.getLogger("celery_singleton_lock.renewal")


@dataclass(frozen=True)
class Owner:
    """Metadata stored with a lock so that inspecting it needs no other key."""

    task_id: str = ""
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)


@dataclass(frozen=True)
class LockHolder:
    """Who holds a lock we failed to take (or that we inspected)."""

    key: str
    task_id: str
    host: str
    pid: Optional[int]
    acquired_at: Optional[float]  # seconds since the epoch, holder's clock
    fence: Optional[int]
    ttl: Optional[float]  # seconds left; None when the key has no TTL

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "task_id": self.task_id,
            "host": self.host,
            "pid": self.pid,
            "acquired_at": self.acquired_at,
            "fence": self.fence,
            "ttl": self.ttl,
        }


LostCallback = Callable[["Lease"], None]


class Lease:
    """A lock this process holds.

    A lease is renewed by its process's :class:`~celery_singleton_lock.engine.renewer.Renewer`
    until it is released, lost, or reaches ``max_lifetime``. ``lost`` is set (and the
    ``on_lost`` callbacks fire, once, from the renewer thread) when Redis says the lock is no
    longer ours, or when Redis could not be reached for longer than the TTL.
    """

    __slots__ = (
        "_lost_callbacks",
        "_state_lock",
        "confirmed_at",
        "deadline",
        "fence",
        "keys",
        "locker",
        "lost",
        "owner",
        "pid",
        "released",
        "renew_due",
        "token",
        "ttl",
    )

    def __init__(
        self,
        *,
        locker: RedisLocker,
        keys: LockKeys,
        token: str,
        ttl: float,
        owner: Owner,
        fence: Optional[int],
        confirmed_at: float,
        deadline: Optional[float],
    ) -> None:
        self.locker = locker
        self.keys = keys
        self.token = token
        self.ttl = ttl
        self.owner = owner
        self.fence = fence
        #: renewer-clock time just before the last request that set our TTL was sent:
        #: the lock is certainly ours until ``confirmed_at + ttl``.
        self.confirmed_at = confirmed_at
        #: renewer-clock time after which renewal stops (max lifetime), or None.
        self.deadline = deadline
        self.renew_due = confirmed_at + ttl / 3.0
        self.pid = os.getpid()
        self.lost = threading.Event()
        self.released = False
        self._lost_callbacks: list[LostCallback] = []
        self._state_lock = threading.Lock()

    @property
    def key(self) -> str:
        return self.keys.lock

    @property
    def inherited(self) -> bool:
        """True in a forked child: the lease belongs to the parent and is never touched here."""
        return self.pid != os.getpid()

    @property
    def held(self) -> bool:
        return not (self.released or self.lost.is_set() or self.inherited)

    def on_lost(self, callback: LostCallback) -> None:
        """Call ``callback(lease)`` once when the lease is lost (immediately if it already is)."""
        with self._state_lock:
            if not self.lost.is_set():
                self._lost_callbacks.append(callback)
                return
        callback(self)

    def mark_lost(self, reason: str) -> None:
        """Flag the lease lost and fire its callbacks; later calls do nothing."""
        with self._state_lock:
            if self.lost.is_set() or self.released:
                return
            self.lost.set()
            callbacks, self._lost_callbacks = self._lost_callbacks, []
        log.error("lease on %s lost: %s", self.key, reason)
        for callback in callbacks:
            try:
                callback(self)
            except Exception:
                log.exception("lost-lease callback for %s raised", self.key)

    def release(self) -> bool:
        """Release through the locker that granted the lease; True if it was still ours."""
        return self.locker.release(self)

    def __enter__(self) -> Lease:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self.held else ("lost" if self.lost.is_set() else "released")
        return f"<Lease {self.key} fence={self.fence} {state}>"
