"""One renewer per process: a lazily started daemon thread that keeps every lease alive.

Each tick renews every due lease of the process in ONE round trip per lock server (one
script over N keys). A lease is due a third of its TTL after it was last confirmed; leases
that fall due within the next half interval are renewed in the same round trip, so leases
with equal TTLs share ticks instead of spreading out.

Failure handling: a refusal from Redis marks the lease lost at once; an unreachable Redis
marks it lost only once its TTL has certainly run out (``confirmed_at + ttl``), and the
renewer keeps trying until then.

Fork safety: a forked child starts with an empty renewer of its own; the parent's leases are
never renewed (nor released, see ``Lease.inherited``) from the child.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from typing import Callable, Optional

from ..errors import LockBackendUnavailable
from .lease import Lease

log = logging.getLogger("celery_singleton_lock.renewal")

Clock = Callable[[], float]

#: Seconds to wait before trying again after the lock server could not be reached.
RETRY_AFTER_ERROR = 0.2

_instances: weakref.WeakSet[Renewer] = weakref.WeakSet()


class Renewer:
    """Renews the leases of this process; see the module docstring.

    Args:
        clock: monotonic clock in seconds; swap it to test timing logic without sleeping.
        autostart: start the daemon thread when the first lease is added. With ``False``,
            drive it by calling :meth:`run_once`.
    """

    def __init__(self, *, clock: Clock = time.monotonic, autostart: bool = True) -> None:
        self.clock = clock
        self.autostart = autostart
        #: round trips sent (one per lock server per tick), for tests and benchmarks.
        self.round_trips = 0
        self._reset()
        _instances.add(self)

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._leases: dict[int, Lease] = {}
        self._wakeup = threading.Condition()
        self._thread: Optional[threading.Thread] = None

    # -- registry -----------------------------------------------------------------------------

    def add(self, lease: Lease) -> None:
        """Start renewing ``lease``."""
        with self._wakeup:
            self._leases[id(lease)] = lease
            if self.autostart and self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="celery-singleton-lock-renewer", daemon=True
                )
                self._thread.start()
            self._wakeup.notify()

    def discard(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (released, lost or handed over)."""
        with self._wakeup:
            self._leases.pop(id(lease), None)

    def leases(self) -> list[Lease]:
        """The leases being renewed now."""
        with self._wakeup:
            return list(self._leases.values())

    # -- ticking ------------------------------------------------------------------------------

    def run_once(self) -> Optional[float]:
        """Renew what is due now; return seconds until the next tick (None: nothing held)."""
        now = self.clock()
        leases = self.leases()
        if not leases:
            return None
        interval = min(lease.ttl for lease in leases) / 3.0
        batches: dict[int, list[Lease]] = {}
        for lease in leases:
            if lease.deadline is not None and now >= lease.deadline:
                log.info("renewal of %s stopped: its maximum lifetime has passed", lease.key)
                self.discard(lease)
            elif lease.renew_due <= now + interval / 2.0:
                batches.setdefault(id(lease.locker), []).append(lease)
        for batch in batches.values():
            self._renew_batch(batch, now)
        remaining = self.leases()
        if not remaining:
            return None
        return max(0.0, min(lease.renew_due for lease in remaining) - self.clock())

    def _renew_batch(self, batch: list[Lease], sent_at: float) -> None:
        locker = batch[0].locker
        self.round_trips += 1
        try:
            still_ours = locker.renew_many(batch, now=sent_at)
        except LockBackendUnavailable as exc:
            for lease in batch:
                if sent_at - lease.confirmed_at >= lease.ttl:
                    self.discard(lease)
                    lease.mark_lost(f"lock server unreachable for longer than the TTL ({exc})")
                else:
                    lease.renew_due = sent_at + RETRY_AFTER_ERROR
            log.warning("renewal of %d lease(s) failed, will retry: %s", len(batch), exc)
            return
        for lease, ours in zip(batch, still_ours):
            if ours:
                lease.confirmed_at = sent_at
                lease.renew_due = sent_at + lease.ttl / 3.0
            else:
                self.discard(lease)
                if not lease.released:
                    lease.mark_lost("Redis no longer holds our token (expired or taken over)")

    def _run(self) -> None:
        while True:
            try:
                delay = self.run_once()
            except Exception:
                # The renewer must outlive any single bad tick, or every lease would expire.
                log.exception("renewer tick failed; retrying")
                delay = RETRY_AFTER_ERROR
            with self._wakeup:
                if os.getpid() != self._pid:
                    return
                self._wakeup.wait(timeout=delay)


def _reset_after_fork() -> None:
    for renewer in list(_instances):
        renewer._reset()


os.register_at_fork(after_in_child=_reset_after_fork)

_process_renewer: Optional[Renewer] = None
_process_renewer_lock = threading.Lock()


def process_renewer() -> Renewer:
    """The renewer shared by every locker of this process (created on first use)."""
    global _process_renewer
    if _process_renewer is None:
        with _process_renewer_lock:
            if _process_renewer is None:
                _process_renewer = Renewer()
    return _process_renewer
