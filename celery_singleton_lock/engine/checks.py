"""What every backend (:mod:`.locker`, :mod:`.redlock`, :mod:`.postgres.locker`) does alike
over the seam, written once as functions they call: the part of a backend a caller needs
(:func:`required`: its queue, markers..., or the error naming the backend and the option), the
keyword form of an acquire (:func:`try_acquire`), and the release of every lease at shutdown
(:func:`release_all`). The checks of a request against a backend's capabilities are the
request's (:func:`.acquire_request.check`)."""

from __future__ import annotations

import logging
from typing import Optional, TypeVar

from celery_singleton_lock.engine.acquire_request import AcquireOutcome, AcquireRequest, unsupported
from celery_singleton_lock.engine.backend import LockBackend
from celery_singleton_lock.engine.latest import Latest
from celery_singleton_lock.engine.lease import LostCallback, Owner
from celery_singleton_lock.errors import LockError

log_release = logging.getLogger("celery_singleton_lock.release")


T = TypeVar("T")


def required(part: Optional[T], backend: LockBackend, what: str, feature: str) -> T:
    """``part`` of ``backend`` (its queue, markers...), or the error that it has none (said to
    people as ``what``). Registration refuses the options that need a part a backend lacks, so
    only a caller that skipped that check gets the error."""
    if part is None:
        raise unsupported(backend.capabilities, what, feature, backend.prefix)
    return part


def try_acquire(
    backend: LockBackend,
    name: str,
    ttl: float,
    *,
    owner: Optional[Owner] = None,
    fencing: bool = False,
    renew: bool = True,
    max_lifetime: Optional[float] = None,
    on_lost: Optional[LostCallback] = None,
    unless_finished: bool = False,
    min_replicas: int = 0,
    replica_timeout: float = 1.0,
    take_queued: bool = False,
    park: Optional[bytes] = None,
    reservation_ttl: float = 30.0,
    token: Optional[str] = None,
    latest: Optional[Latest] = None,
    limit: int = 1,
    rate: Optional[tuple[int, float]] = None,
    finished_ttl: float = 3600.0,
    fair: str = "",
    cap_key: str = "",
    priority: int = 0,
    slotted: bool = False,
) -> AcquireOutcome:
    """Take the lock ``name`` for ``ttl`` seconds, without waiting: ``backend.acquire`` of an
    :class:`AcquireRequest` of these arguments (each backend's ``try_acquire``).

    Returns the :class:`Lease` when acquired, or the current :class:`LockHolder` (with
    its remaining TTL) when someone else holds it, or :class:`Parked` with ``park``.

    Args:
        renew: keep the lease alive from the process renewer until it is released.
        max_lifetime: seconds after which renewal stops and the lease is lost (the key
            then expires); None renews until release.
        fencing: hand out a fencing token, strictly increasing per lock name.
        on_lost: called once, from the renewer thread, if the lease is lost.
        unless_finished: take nothing if ``owner.task_id`` already ran to the end under
            this lock (a release with ``remember_for`` recorded it), in the same round
            trip.
        finished_ttl: with ``latest``: how long superseded task ids are remembered (a
            finish record lives the ``remember_for`` of its release, whatever this says).
        min_replicas: hold the lock only once this many replicas acknowledged it (and its
            fence), waiting up to ``replica_timeout`` seconds (``WAIT``, sent with the
            acquire in the same round trip); otherwise it is released again and
            ``LockBackendUnavailable`` raised.
        take_queued: delete the lock's queued marker (see ``enqueue``) if it holds
            ``owner.task_id``, whatever the outcome, in the same round trip: this
            message is no longer queued.
        park: this task id's message. When every slot of the lock is held (or free but
            promised to an older parked task id), the message is parked behind them, in
            arrival order, and :class:`Parked` returned; a release with
            ``release_handing_on`` then reserves the freed slot for the oldest parked id
            and returns its message to publish (:mod:`.kinds.slot_queue`; a mutex is the
            lock with one slot). A slot reserved for ``owner.task_id`` is taken over.
        reservation_ttl: with ``park``: seconds a reservation made by this call lives.
        token: the owner token to write (a fresh one by default); a quorum sends the
            same token to each of its servers (:mod:`.redlock`).
        latest: with ``park``: the newest call wins (see :class:`~.latest.Latest`): at
            most one call waits, a newer one takes its place (:attr:`Parked.displaced`
            names the calls it displaced); release with ``release_latest``.
        limit: up to this many holders at once, each on its own slot (:mod:`.slots`);
            not with ``latest``, ``take_queued`` or ``min_replicas``.
        rate: ``(count, seconds)``: at most ``count`` acquisitions in any window of that
            many seconds (server clock); over it, a :class:`LockHolder` with
            ``over_rate`` and the wait as its ``ttl`` (with ``park``: parked, and handed
            a slot when the rate allows). Not with those three either.

        fair: with ``park`` (not ``latest``): the call's fairness value; parked calls are
            handed slots round robin across values, by ``priority`` then oldest first within
            one (see lua/includes/fair_queue.lua); "" for arrival order.
        cap_key: the key of the live rule of the lock's family (engine live_rules.py): its
            cap (with ``limit`` or ``rate``: at most that many slots taken at once, whatever
            ``limit`` says) and its pause (nothing taken: a :class:`LockHolder` with
            ``paused``; with ``park``: parked). Read in the same script call (on a cluster:
            its copy in the lock's slot).
        priority: with ``park``: the call's rank; parked calls of a higher rank are handed
            slots first (with ``fair``: within its fairness value), arrival order within one
            (-255..255).
        slotted: keep the lock in its slot table even with one slot and no rate (see
            :mod:`.slots`): as every other call of ``name`` does (a task whose limit may be
            1 for some calls, or whose calls queue).

    Raises:
        AlreadyFinished: with ``unless_finished``, that record exists.
        LockBackendUnavailable: the server could not be reached or refused the write.
        LockConfigurationError: an option this backend's capabilities exclude.
        LockNotOwnedError: the lock's key holds data this package did not write.
    """
    return backend.acquire(
        AcquireRequest(
            name,
            ttl,
            owner,
            fencing,
            renew,
            max_lifetime,
            on_lost,
            unless_finished,
            min_replicas,
            replica_timeout,
            take_queued,
            park,
            reservation_ttl,
            token,
            latest,
            limit,
            rate,
            finished_ttl,
            fair=fair,
            cap_key=cap_key,
            priority=priority,
            slotted=slotted,
        )
    )


def release_all(backend: LockBackend) -> int:
    """Release every lease this process still holds through ``backend``; returns how many
    were released here (each backend's ``release_all``).

    At shutdown: a plain release, without a hand-off (no message is sent from a process
    on its way out), but a lock with task ids parked behind it is made due in the
    hand-off index (``hand_off_soon``), so a sweeper hands it on at its next tick
    rather than at the old holder's TTL. One lease that cannot be released is logged and
    the others are still released.
    """
    backend.settle()  # the deferred releases are reported before the process goes
    released = 0
    queue = backend.queue
    me: object = backend
    for lease in backend.renewer.leases():
        if lease.locker is me and lease.held:
            try:
                if backend.release(lease):
                    released += 1
                    if queue is not None:
                        queue.hand_off_soon(lease.keys.name)
            except LockError as exc:
                log_release.error("could not release %s: %s", lease.key, exc)
    return released
