"""One releaser per process: a lazily started daemon thread that releases leases off the
caller's path.

A caller that need not wait for its release (a task whose body has returned) hands the lease
over and goes on; the release script runs here, one per lease, in hand-over order. Renewal of
a handed-over lease stops at once (the locker marks it released before handing it over), so
the lock is held a moment longer at most, never renewed past its owner's end.

If the process dies before a handed-over release ran, the lock's TTL frees it. A forked child
starts with an empty queue: its parent's pending releases are the parent's to run.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections import deque
from typing import TYPE_CHECKING, Callable, Optional

from ..errors import LockError

if TYPE_CHECKING:
    from .lease import Lease

log = logging.getLogger("celery_singleton_lock.release")

#: Called with True (released), False (it was no longer ours) or None (the release failed).
ReleaseCallback = Callable[[Optional[bool]], None]

_instances: weakref.WeakSet[Releaser] = weakref.WeakSet()


class Releaser:
    """Runs handed-over releases in a background thread; see the module docstring."""

    def __init__(self) -> None:
        self._reset()
        _instances.add(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._queue: deque[tuple[Lease, Optional[ReleaseCallback]]] = deque()
        self._wakeup = threading.Condition()
        self._busy = False
        self._thread: Optional[threading.Thread] = None

    def submit(self, lease: Lease, on_done: Optional[ReleaseCallback] = None) -> None:
        """Queue the release of ``lease`` (already marked released by its locker)."""
        with self._wakeup:
            self._queue.append((lease, on_done))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-singleton-lock-releaser", daemon=True
                )
                self._thread.start()
            self._wakeup.notify()

    def pending(self) -> int:
        """Releases queued or running now."""
        with self._wakeup:
            return len(self._queue) + self._busy

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued release has run; False if ``timeout`` passed first."""
        with self._wakeup:
            return self._wakeup.wait_for(lambda: not self._queue and not self._busy, timeout)

    def _run(self) -> None:
        while True:
            with self._wakeup:
                self._wakeup.wait_for(lambda: self._queue or os.getpid() != self._pid)
                if os.getpid() != self._pid:
                    return
                lease, on_done = self._queue.popleft()
                self._busy = True
            owned: Optional[bool] = None
            try:
                owned = lease.locker.send_release(lease)
            except LockError as exc:
                log.error(
                    "could not release %s (%s); it frees itself within its TTL", lease.key, exc
                )
            except Exception:  # the thread must survive anything, or no release runs again
                log.exception("release of %s failed", lease.key)
            if on_done is not None:
                try:
                    on_done(owned)
                except Exception:
                    log.exception("release callback for %s raised", lease.key)
            with self._wakeup:
                self._busy = False
                self._wakeup.notify_all()


def _reset_after_fork() -> None:
    for releaser in list(_instances):
        releaser._reset()


os.register_at_fork(after_in_child=_reset_after_fork)

_process_releaser: Optional[Releaser] = None
_process_releaser_lock = threading.Lock()


def process_releaser() -> Releaser:
    """The releaser shared by every locker of this process (created on first use)."""
    global _process_releaser
    if _process_releaser is None:
        with _process_releaser_lock:
            if _process_releaser is None:
                _process_releaser = Releaser()
    return _process_releaser
