"""Leases on a quorum of independent Redis masters (the Redlock algorithm), opt-in.

A :class:`QuorumLocker` is a lock backend (:class:`~.backend.LockBackend`, so the Celery
layer, the renewer and the CLI take it where they take a ``RedisLocker``) that composes N >= 3
``RedisLocker`` objects, one per independent server:

* **acquire**: the same random token is sent to every server at once (one thread per server
  from a small pool of this locker). The lock is held when a majority (``N // 2 + 1``) took it
  and the *validity* is still positive: ``ttl - elapsed - drift``, elapsed measured from just
  before the first send to the reply that made the majority, drift = ``ttl * 0.01 + 2 ms`` (the
  Redlock specification's allowance for clocks running at different rates). Otherwise it is
  released on every server where it may have been written (compare-and-delete with our token,
  concurrently) and the holder seen on most servers returned; ``LockBackendUnavailable`` when
  fewer than a majority answered at all. A split vote (no one on a majority) is retried after a
  short random delay, as the specification recommends, before a holder is reported.
* **release, renew**: on every server at once; a lease is lost when fewer than a majority
  renewed it, and a release raises ``LockBackendUnavailable`` when fewer than a majority
  answered (the lease keeps its token: release may be called again).
* **waiting for a release**: the release script publishes on each server; a waiter subscribes
  on every server that answers (:class:`~.quorum_reading.QuorumSubscription`).
* **an acquire's stragglers**: the acquire returns once a majority answered; the replies still
  on their way are kept on the lease (:meth:`QuorumLease.settle`), and a release waits for them
  first, so a write that lands late is never left behind a release.

What it cannot do is said, each with its reason, by its capabilities (:data:`QUORUM`), and
refused with ``LockConfigurationError`` when asked for: fencing tokens, waiting for replicas,
the queued markers of enqueue deduplication and parking. Its reader reads only who holds a
lock (no :class:`~.backend.PartsReader`: nothing is parked nor marked here).

Safety rests on timing assumptions (bounded clock drift, bounded process pauses and network
delays); see docs/explanation/redlock-safety.md: the fence, not the quorum, protects data,
and there is no fence here.
"""

from __future__ import annotations

import logging
import random
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import Any, Callable, Optional, Sequence, Union, cast

import redis

from celery_singleton_lock.engine import acquire_request, checks
from celery_singleton_lock.engine.acquire_request import (
    AcquireOutcome,
    AcquireRequest,
    GeneralAcquire,
    PreparedAcquire,
    check_call,
)
from celery_singleton_lock.engine.fan_out import FanOut
from celery_singleton_lock.engine.keys import LockKeys, validate_prefix
from celery_singleton_lock.engine.lease import Lease, LockHolder, Owner, new_token
from celery_singleton_lock.engine.locker import RedisLocker
from celery_singleton_lock.engine.quorum_reading import QUORUM, QuorumInspector, QuorumSubscription
from celery_singleton_lock.engine.renewer import Renewer, process_renewer
from celery_singleton_lock.errors import (
    AlreadyFinished,
    LockBackendUnavailable,
    LockConfigurationError,
    LockError,
)

log = logging.getLogger("celery_singleton_lock.acquire")

#: The fewest servers a quorum may have: with 2, a majority is both, and one outage stops it.
MIN_SERVERS = 3
#: Clock drift allowance, as the Redlock specification: this share of the TTL, plus a floor.
DRIFT_FACTOR = 0.01
DRIFT_FLOOR = 0.002
#: Attempts at an acquire that ended in a split vote (no one on a majority) before a holder
#: is reported, and the bound of the random delay between them (seconds).
SPLIT_VOTE_ATTEMPTS = 3
SPLIT_VOTE_DELAY = 0.05
#: Longest a release waits for the acquire replies still on their way (seconds): a write that
#: lands after our delete would otherwise keep the key until its TTL.
PENDING_WAIT = 5.0


def drift(ttl: float) -> float:
    """Clock-drift allowance for a lock of ``ttl`` seconds (Redlock: ttl * 0.01 + 2 ms)."""
    return ttl * DRIFT_FACTOR + DRIFT_FLOOR


class QuorumLease(Lease):
    """A lease held on a majority of a quorum's servers."""

    __slots__ = ("pending",)

    #: acquire replies not yet in when the majority was reached (see :meth:`settle`)
    pending: list[Future[Any]]

    def settle(self, timeout: float = PENDING_WAIT) -> bool:
        """Wait up to ``timeout`` seconds for the acquire's replies still on their way (the
        acquire returned once a majority answered); True once every server has answered.
        A release waits for them itself."""
        if self.pending:
            self.pending = list(wait(self.pending, timeout=timeout).not_done)
        return not self.pending


class QuorumLocker:
    """Leases on a majority of ``clients`` (N >= 3 independent Redis masters), composed of one
    :class:`~.locker.RedisLocker` per server; see the module.

    Args:
        clients: one plain redis-py client per server (no Sentinel, no Cluster).
        prefix, renewer, wall_clock: as :class:`~.locker.RedisLocker`.
    """

    capabilities = QUORUM
    #: none of the parts beside the leases (see :data:`QUORUM` for why): not declared, so an
    #: option that needs one is refused at registration
    queue: None = None
    latest: None = None
    markers: None = None
    cooldown: None = None
    cancels: None = None
    live_rules: None = None  # a live rule read on each master apart would not be one rule
    try_acquire = checks.try_acquire

    def __init__(
        self,
        clients: Sequence[redis.Redis],
        *,
        prefix: str = "singleton-lock",
        renewer: Optional[Renewer] = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if len(clients) < MIN_SERVERS:
            raise LockConfigurationError(
                f"a Redlock quorum needs at least {MIN_SERVERS} independent Redis servers, got "
                f"{len(clients)}; give 3 or 5 URLs, or one URL for a single server"
            )
        self.prefix = validate_prefix(prefix)
        self.renewer = renewer if renewer is not None else process_renewer()
        #: one locker per server, in the order given
        self.servers = [
            RedisLocker(client, prefix=self.prefix, renewer=renewer, wall_clock=wall_clock)
            for client in clients
        ]
        #: asks every server at once; ``quorum``: how many must agree
        self.fan_out = FanOut(self.servers)
        self.quorum = self.fan_out.quorum
        #: reads the locks held on a majority, and each server's view
        self.inspect = QuorumInspector(self.fan_out, self.prefix)

    def keys(self, name: str) -> LockKeys:
        """Key names of the lock called ``name`` under this backend's prefix."""
        return LockKeys.build(self.prefix, name)

    # -- acquire ------------------------------------------------------------------------------

    def prepare(self, request: AcquireRequest) -> PreparedAcquire:
        """``request``, checked once, for many calls that each set its name, owner and time
        limit (see :mod:`.acquire_request`)."""
        acquire_request.check(request, QUORUM, self.prefix)
        return GeneralAcquire(self, request)

    def acquire(self, request: AcquireRequest) -> AcquireOutcome:
        """Take the lock on a majority of the servers (see the module docstring), after
        checking the request against :data:`QUORUM`.

        Raises:
            AlreadyFinished: with ``unless_finished``, a server holds that record.
            LockBackendUnavailable: fewer than a majority answered, or the majority came
                too late (no validity left); nothing is held.
        """
        acquire_request.check(request, QUORUM, self.prefix)
        owner = request.owner or Owner()
        check_call(request, owner, request.max_lifetime)
        ttl = request.ttl
        for attempt in range(SPLIT_VOTE_ATTEMPTS):
            last = attempt + 1 == SPLIT_VOTE_ATTEMPTS
            outcome = self._attempt(request, owner, last=last)
            if outcome is not None:
                break
            time.sleep(random.uniform(0, min(SPLIT_VOTE_DELAY, ttl / 10)))
        assert outcome is not None
        if isinstance(outcome, Lease):
            if request.max_lifetime is not None:
                outcome.deadline = outcome.confirmed_at + request.max_lifetime
            if request.on_lost is not None:
                outcome.on_lost(request.on_lost)
            if request.renew:
                outcome.keep_renewed(self.renewer)
        return outcome

    def _attempt(
        self, request: AcquireRequest, owner: Owner, *, last: bool
    ) -> Optional[Union[Lease, LockHolder]]:
        """One round of acquires on every server: the lease, the holder, or None for a split
        vote worth trying again (never when ``last``)."""
        name, ttl = request.name, request.ttl
        keys = self.keys(name)
        token = request.token or new_token()
        on_server = AcquireRequest(
            name,
            ttl,
            owner,
            renew=False,
            unless_finished=request.unless_finished,
            token=token,
            finished_ttl=request.finished_ttl,
        )
        clock = self.renewer.clock
        sent_at = clock()
        futures = self.fan_out.each(lambda server: server.acquire(on_server))
        taken, refused = 0, 0
        pending = set(futures)
        while pending and taken < self.quorum and refused <= len(futures) - self.quorum:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                if future.exception() is None and isinstance(future.result(), Lease):
                    taken += 1
                else:
                    refused += 1
        validity = ttl - (clock() - sent_at) - drift(ttl)
        lease = QuorumLease(
            locker=self,
            keys=keys,
            token=token,
            ttl=ttl,
            owner=owner,
            fence=None,
            confirmed_at=sent_at,
            deadline=None,
        )
        if taken >= self.quorum and validity > 0:
            lease.pending = [future for future in futures if not future.done()]
            log.debug("acquired %s on %d of %d servers", keys.lock, taken, len(futures))
            return lease
        # Not held: take back whatever was written, once every reply is in.
        lease.pending = futures
        try:
            self._release_everywhere(lease, None)
        except LockBackendUnavailable:
            pass  # best effort: what was written on a server out of reach expires at its TTL
        holders: list[LockHolder] = []
        failures: list[str] = []
        for future in futures:
            error = future.exception()
            if isinstance(error, AlreadyFinished):
                raise error
            if isinstance(error, LockBackendUnavailable):
                failures.append(error.message)
            elif error is not None:
                raise error
            elif isinstance(future.result(), LockHolder):
                holders.append(cast(LockHolder, future.result()))
        answered = len(futures) - len(failures)
        if taken >= self.quorum:
            raise LockBackendUnavailable(
                f"lock {keys.lock} was taken on {taken} of {len(futures)} servers, but too late: "
                f"no validity left of its {ttl}s TTL (slow servers?); released it again",
                keys.lock,
            )
        if answered < self.quorum:
            raise LockBackendUnavailable(
                f"only {answered} of {len(futures)} lock servers answered about {keys.lock}, "
                f"{self.quorum} needed ({'; '.join(failures)}); released what was taken",
                keys.lock,
            )
        if not holders:  # cannot happen: a server that answered took it or named a holder
            raise LockBackendUnavailable(f"no majority for {keys.lock}", keys.lock)
        seen = Counter((h.task_id, h.host, h.pid) for h in holders)
        owner_key, count = seen.most_common(1)[0]
        if count < self.quorum and not last:
            return None  # a split vote: nobody holds a majority, maybe not even the holders
        return max(
            (h for h in holders if (h.task_id, h.host, h.pid) == owner_key),
            key=lambda h: h.ttl or 0.0,
        )

    # -- release ------------------------------------------------------------------------------

    def release(self, lease: Lease, *, remember_for: Optional[float] = None) -> bool:
        """Release ``lease`` on every server at once (compare-and-delete with its token), once
        the acquire's replies still on their way are in (:meth:`QuorumLease.settle`).

        True if it was still ours on a majority. ``remember_for``: see
        :meth:`RedisLocker.release` (the record is written on each server that still held it).

        Raises:
            LockBackendUnavailable: fewer than a majority answered; the lease is no longer
                ``held`` but keeps its token, so ``release`` may simply be called again.
        """
        if not lease.releasing():
            return False
        try:
            released = self._release_everywhere(lease, remember_for)
        except LockError:
            lease.not_released()
            raise
        return released >= self.quorum

    def release_later(
        self,
        lease: Lease,
        then: Callable[[Optional[bool], Optional[LockError]], None],
        *,
        remember_for: Optional[float] = None,
    ) -> bool:
        """False: nothing is sent without waiting on a quorum (it waits for its majority);
        the caller calls :meth:`release`."""
        return False

    def settle(self) -> None:
        """Nothing to read: no release is sent without waiting here."""

    def release_all(self) -> int:
        """See :func:`.checks.release_all`."""
        return checks.release_all(self)

    def _release_everywhere(self, lease: Lease, remember_for: Optional[float]) -> int:
        """Compare-and-delete ``lease``'s token on every server; how many deleted it."""
        if isinstance(lease, QuorumLease):
            lease.settle()

        def release_on(server: RedisLocker) -> bool:
            return server.release(self._lease_on(server, lease), remember_for=remember_for)

        replies = self.fan_out.answers(self.fan_out.each(release_on), lease.key)
        return sum(1 for released in replies if released)

    @staticmethod
    def _lease_on(server: RedisLocker, lease: Lease) -> Lease:
        """``lease`` as seen by one server: the same key and token, released there only."""
        return Lease(
            locker=server,
            keys=lease.keys,
            token=lease.token,
            ttl=lease.ttl,
            owner=lease.owner,
            fence=None,
            confirmed_at=lease.confirmed_at,
            deadline=None,
        )

    def release_abandoned(
        self, name: str, *, task_id: str, host: str, pid: int, slot: Optional[int] = None
    ) -> bool:
        """Release the lock ``name`` of a dead execution on every server; True if it was
        released on any (see :meth:`RedisLocker.release_abandoned`; a quorum has one slot:
        its capabilities refuse more)."""
        futures = self.fan_out.each(
            lambda server: server.release_abandoned(name, task_id=task_id, host=host, pid=pid)
        )
        replies: list[Optional[bool]] = self.fan_out.answers(futures, self.keys(name).lock)
        return any(replies)

    # -- renew --------------------------------------------------------------------------------

    def renew_batch(self, leases: Sequence[Lease], *, now: float) -> list[int]:
        """Renew ``leases`` on every server at once; the indices of the leases renewed on
        fewer than a majority (lost).

        Raises:
            LockBackendUnavailable: fewer than a majority answered (the renewer tries again
                until the TTL has certainly run out).
        """
        if not leases:
            return []
        futures = self.fan_out.each(lambda server: server.renew_batch(leases, now=now))
        return self._lost(self.fan_out.answers(futures, leases[0].key), len(leases))

    def renew_by_owner(
        self, held: Sequence[tuple[str, Owner, float]], *, limits: Optional[Sequence[int]] = None
    ) -> list[int]:
        """:meth:`RedisLocker.renew_by_owner` on every server; lost below a majority (a
        quorum has one slot per lock: its capabilities refuse more, ``limits`` are all 1)."""
        if not held:
            return []
        futures = self.fan_out.each(lambda server: server.renew_by_owner(held))
        return self._lost(self.fan_out.answers(futures, self.keys(held[0][0]).lock), len(held))

    def _lost(self, replies: list[Optional[list[int]]], count: int) -> list[int]:
        renewed = [0] * count
        for lost in replies:
            if lost is None:
                continue
            gone = set(lost)
            for index in range(count):
                if index not in gone:
                    renewed[index] += 1
        return [index for index, times in enumerate(renewed) if times < self.quorum]

    # -- waiting for a release ----------------------------------------------------------------

    def subscribe_releases(self, name: str) -> QuorumSubscription:
        """A subscription to the release of ``name`` on every server that answers.

        Raises:
            LockBackendUnavailable: no server could be subscribed to.
        """
        return QuorumSubscription(self.servers, self.keys(name).channel)

    # -- queued markers and parking: none on a quorum (see QUORUM) ----------------------------

    def close(self) -> None:
        """Stop the thread pool (acquires not yet started are dropped) and close every
        server's connections."""
        self.fan_out.close()
