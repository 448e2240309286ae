"""One renewer per process: a lazily started daemon thread that keeps every lease alive.

Each tick renews every due lease of the process in ONE round trip per lock server (one
script over N keys). A lease is due a third of its TTL after it was last confirmed; leases
that fall due within the next half interval are renewed in the same round trip, so leases
with equal TTLs share ticks instead of spreading out. The thread sleeps until the earliest due
time; adding a lease wakes it only if that lease falls due sooner, so acquiring and releasing
locks costs the thread nothing. When it finds no lease at all it still looks again one renewal
interval later rather than sleeping until woken: a process that takes short locks one after
another (a worker running tasks) would otherwise wake it once per lock.

Deferred releases (``Releases.release_later``): the reply of a release sent without waiting is
read by the next command on its connection (a busy worker's next acquire), or here when none
followed within :data:`SETTLE_WITHIN` (an idle worker), see :meth:`Renewer.settle_soon`.

Failure handling: a refusal from the lock server marks the lease lost at once (the message
names the server's kind: Redis, a Redlock quorum, PostgreSQL); an unreachable server marks it
lost only once its TTL has certainly run out (``confirmed_at + ttl``), and the
renewer keeps trying until then.

Fork safety: a forked child starts with an empty renewer of its own (:mod:`.fork_safety`); the
parent's leases are never renewed (nor released, see ``Lease.inherited``) from the child.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from operator import attrgetter
from typing import Any, Callable, Optional

from celery_singleton_lock.engine.fork_safety import ForkSafeLock, reset_in_forked_children
from celery_singleton_lock.engine.lease import Lease
from celery_singleton_lock.errors import LockBackendUnavailable

log = logging.getLogger("celery_singleton_lock.renewal")

Clock = Callable[[], float]

#: Seconds to wait before trying again after the lock server could not be reached.
RETRY_AFTER_ERROR = 0.2
#: Seconds after which the reply of a release sent without waiting is read here when no command
#: read it (an idle worker; up to twice that after a busy spell): ``lock_released`` is sent then.
SETTLE_WITHIN = 0.05

_lease_ttl = attrgetter("ttl")


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
        #: times adding a lease or a deferred release had to wake the thread, for tests and
        #: benchmarks.
        self.wakeups = 0
        #: ticks run (run_once), for tests and benchmarks.
        self.ticks = 0
        self._reset()
        reset_in_forked_children(self)

    def after_fork_in_child(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._leases: dict[int, Lease] = {}
        self._lock = threading.Lock()
        self._wakeup = threading.Condition(self._lock)
        self._thread: Optional[threading.Thread] = None
        #: clock time of the next tick as planned so far (inf: none planned). A tick resets it
        #: to inf when it takes its snapshot, so a lease added during the tick sets it again.
        self._wake_at = math.inf
        #: renewal interval of the last lease added: how long the thread sleeps when idle.
        self._idle_interval = math.inf
        #: kept connections that sent a release whose reply may still be unread, and what
        #: each owed at the last look (see settle_soon)
        self._watched: dict[int, Any] = {}
        self._seen: dict[int, tuple[Any, ...]] = {}
        #: the leases held at the last look: others held now mean tasks still come and go
        self._seen_leases: list[Lease] = []

    # -- registry -----------------------------------------------------------------------------

    def add(self, lease: Lease) -> None:
        """Start renewing ``lease``."""
        with self._lock:
            self._leases[id(lease)] = lease
            self._idle_interval = lease._third
            if lease.renew_due < self._wake_at:
                # Due before the planned tick: wake the thread (a no-op when none waits).
                # Otherwise the thread is left asleep; it will see the lease at its next tick.
                self._wake_at = lease.renew_due
                self.wakeups += 1
                self._wakeup.notify()
            if self._thread is None:
                self._start_locked()

    def settle_soon(self, connections: Any) -> None:
        """Watch ``connections`` (:class:`.redis_server.PinnedConnections`), which just sent a
        release without waiting: a reply still owed at two looks :data:`SETTLE_WITHIN` apart
        is read here (``connections.settle_idle()``), so an idle worker reports its release
        within that time. A busy worker's next acquire reads the reply first: the looks find
        new replies owed, or other leases held, and read nothing; they go on, one per
        :data:`SETTLE_WITHIN` and not one per task, until a look finds neither."""
        if self._watched.get(id(connections)) is connections:
            return  # watched: a look comes within SETTLE_WITHIN (a busy worker: no lock taken)
        with self._lock:
            self._watched[id(connections)] = connections
            self._seen[id(connections)] = connections.owed()
            due = self.clock() + SETTLE_WITHIN
            if due < self._wake_at:
                self._wake_at = due
                self.wakeups += 1
                self._wakeup.notify()
            self._start_locked()

    def _look(self, connections: Any, leases: list[Lease]) -> None:
        """Read the replies ``connections`` has owed since the last look (no command came to
        read them); stop watching it once it owes nothing and no other lease came since."""
        key = id(connections)
        owed = connections.owed()
        if any(settle in self._seen.get(key, ()) for settle in owed):
            try:
                connections.settle_idle()
            except Exception:  # one locker's trouble must not stop the renewal of the others
                log.exception("reading the replies of deferred releases failed")
        seen = {id(lease) for lease in self._seen_leases}  # alive until replaced: ids unique
        coming = any(id(lease) not in seen for lease in leases)
        with self._lock:
            self._watched.pop(key, None)  # first: a release sent from now on watches it again
            owed = connections.owed()  # then: one sent before found it watched, and is here
            if owed or coming:
                self._watched[key] = connections
                self._seen[key] = owed
            else:
                self._seen.pop(key, None)

    def _start_locked(self) -> None:
        """Start the thread if it is not running (called holding ``_lock``)."""
        if self.autostart and self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="celery-singleton-lock-renewer", daemon=True
            )
            self._thread.start()

    def discard(self, lease: Lease) -> None:
        """Stop renewing ``lease`` (released, lost or handed over)."""
        with self._lock:
            self._leases.pop(id(lease), None)

    def leases(self) -> list[Lease]:
        """The leases being renewed now."""
        with self._lock:
            return list(self._leases.values())

    # -- ticking ------------------------------------------------------------------------------

    def run_once(self) -> Optional[float]:
        """Renew what is due now; return seconds until the next tick (None: nothing held)."""
        now = self.clock()
        self.ticks += 1
        with self._lock:
            leases = list(self._leases.values())
            self._wake_at = math.inf
            watched = list(self._watched.values())
        for connections in watched:
            self._look(connections, leases)
        self._seen_leases = leases
        next_due = math.inf
        if leases:
            interval = min(map(_lease_ttl, leases)) / 3.0
            horizon = now + interval / 2.0
            batches: dict[int, list[Lease]] = {}
            batch: list[Lease] = []
            batch_locker: object = None
            for lease in leases:
                if lease.deadline is not None and now >= lease.deadline:
                    # Its key expires now (renewal capped its TTL at the deadline): a body
                    # still running must learn that it no longer holds the lock.
                    self.discard(lease)
                    lease.mark_lost("its maximum lifetime has passed; renewal stopped")
                    continue
                due = lease.renew_due
                if due > horizon:
                    if due < next_due:
                        next_due = due
                    continue
                if lease.locker is not batch_locker:
                    batch_locker = lease.locker
                    batch = batches.setdefault(id(batch_locker), [])
                batch.append(lease)
            for batch in batches.values():
                retry_at = self._renew_batch(batch, now)
                next_due = min(next_due, now + interval if retry_at is None else retry_at)
        with self._lock:
            if self._watched:
                self._wake_at = min(self._wake_at, now + SETTLE_WITHIN)
            if not self._leases:
                # Look again an interval from now (see the module docstring); a lease added
                # meanwhile that falls due before that still wakes the thread.
                self._wake_at = min(self._wake_at, now + self._idle_interval)
                return None
            if next_due < self._wake_at:
                self._wake_at = next_due
            if self._wake_at == math.inf:  # cannot happen; never sleep forever holding leases
                self._wake_at = min(lease.renew_due for lease in self._leases.values())
            wake_at = self._wake_at
        return max(0.0, wake_at - self.clock())

    def _renew_batch(self, batch: list[Lease], sent_at: float) -> Optional[float]:
        """Renew ``batch`` (one lock server); return the retry time if it was unreachable."""
        locker = batch[0].locker
        self.round_trips += 1
        try:
            lost = locker.renew_batch(batch, now=sent_at)
        except LockBackendUnavailable as exc:
            retry_at = sent_at + RETRY_AFTER_ERROR
            for lease in batch:
                if sent_at - lease.confirmed_at >= lease.ttl:
                    self.discard(lease)
                    lease.mark_lost(f"lock server unreachable for longer than the TTL ({exc})")
                else:
                    lease.renew_due = retry_at
            log.warning("renewal of %d lease(s) failed, will retry: %s", len(batch), exc)
            return retry_at
        renewed = batch
        if lost:
            gone = set(lost)
            renewed = [lease for index, lease in enumerate(batch) if index not in gone]
        for lease in renewed:
            lease.confirmed_at = sent_at
            lease.renew_due = sent_at + lease._third
        for index in lost:
            lease = batch[index]
            self.discard(lease)
            if not lease.released:
                lease.mark_lost(
                    f"the lock server ({lease.locker.capabilities.kind}) no longer holds our "
                    "token (expired or taken over)"
                )
        return None

    def _run(self) -> None:
        while True:
            failed = False
            try:
                self.run_once()
            except Exception:
                # The renewer must outlive any single bad tick, or every lease would expire.
                log.exception("renewer tick failed; retrying")
                failed = True
            self._sleep(RETRY_AFTER_ERROR if failed else None)

    def _sleep(self, at_most: Optional[float]) -> None:
        """Until the planned tick (``_wake_at``), or ``at_most`` seconds if given. Woken early
        by :meth:`add` or :meth:`settle_soon`, which plan an earlier tick, it sleeps on until
        that one: ticking at every wake-up would tick once per task in a busy worker."""
        with self._lock:
            limit = math.inf if at_most is None else self.clock() + at_most
            while True:
                # Read under the lock: a lease added since run_once returned lowered it.
                wake_at = min(self._wake_at, limit)
                delay = None
                if wake_at != math.inf:
                    delay = wake_at - self.clock()
                    if delay <= 0:
                        return
                if not self._wakeup.wait(timeout=delay):
                    return  # timed out: the planned time has come


_process_renewer: Optional[Renewer] = None
_process_renewer_lock = ForkSafeLock()


def process_renewer() -> Renewer:
    """The renewer shared by every locker of this process (created on first use)."""
    global _process_renewer
    if _process_renewer is None:
        with _process_renewer_lock:
            if _process_renewer is None:
                _process_renewer = Renewer()
    return _process_renewer
