"""The one seam between the Celery layer and a lock server: what it asks of a backend.

Two backends sit side by side behind it (as httpx's transports sit behind its client):
:class:`~.locker.RedisLocker`, leases on one Redis server (or a Sentinel group's primary, or a
Redis Cluster), and :class:`~.redlock.QuorumLocker`, which *composes* one ``RedisLocker`` per
independent server. Neither subclasses the other: each implements :class:`LockBackend`, and
what a backend cannot do is said by its :class:`Capabilities`, read by the Celery layer to
refuse an option when a task is registered and when a worker starts, never found out from an
``isinstance`` check or a method that turns out to be a stub.

As redis-py's ``lock.py`` does, the public methods shared by both (:class:`BackendBase`)
validate, then delegate to a small method each backend writes (``_acquire``): the checks are
written once.
"""

from __future__ import annotations

import logging
from typing import (
    TYPE_CHECKING,
    Any,
    Callable,
    NamedTuple,
    Optional,
    Protocol,
    Sequence,
    Union,
)

from celery_singleton_lock.engine.capabilities import Capabilities
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.latest import Latest
from celery_singleton_lock.engine.lease import Lease, LockHolder, LostCallback, Owner, Parked
from celery_singleton_lock.engine.renewer import process_renewer  # at import: a hot path
from celery_singleton_lock.errors import LockConfigurationError, LockError

if TYPE_CHECKING:
    from collections.abc import Iterator

    from celery_singleton_lock.engine.renewer import Renewer

log_release = logging.getLogger("celery_singleton_lock.release")

#: What an acquire returns: the :class:`Lease` when acquired, the current :class:`LockHolder`
#: when someone else holds the lock, :class:`Parked` when the call was parked behind it (only
#: with ``park``). Each says which it is in ``state`` ("acquired", "held", "parked"); no object
#: is made to wrap it (the acquire is the hot path).
AcquireOutcome = Union[Lease, LockHolder, Parked]
#: What an acquire without ``park`` returns.
AcquireResult = Union[Lease, LockHolder]


class AcquireRequest(NamedTuple):
    """One acquire (see :meth:`BackendBase.try_acquire` for what each field asks).

    A named tuple, not a dataclass: immutable, and as cheap to make as a tuple (it is made for
    every task execution); Python 3.9 has no slotted dataclasses.
    """

    name: str
    ttl: float
    owner: Optional[Owner] = None
    fencing: bool = False
    renew: bool = True
    max_lifetime: Optional[float] = None
    on_lost: Optional[LostCallback] = None
    unless_finished: bool = False
    min_replicas: int = 0
    replica_timeout: float = 1.0
    take_queued: bool = False
    park: Optional[bytes] = None
    reservation_ttl: float = 30.0
    token: Optional[str] = None
    latest: Optional[Latest] = None
    #: at most this many holders of ``name`` at once (:mod:`.slots`); 1 is the mutex
    limit: int = 1
    #: at most ``rate[0]`` acquisitions of ``name`` in any ``rate[1]`` seconds, or None
    rate: Optional[tuple[int, float]] = None
    finished_ttl: float = 3600.0
    #: with ``take_queued``: keep the marker while another owner holds the lock (the caller
    #: sends the call again: it is still queued, see ACQUIRE's ARGV[6])
    queued_while_held: bool = False


class ReleaseSubscription(Protocol):
    """A subscription to one lock's release channel (redis-py's ``PubSub`` is one)."""

    def get_message(
        self, ignore_subscribe_messages: bool = False, timeout: float = 0.0
    ) -> Optional[dict[str, Any]]: ...

    def close(self) -> None: ...


class LockReader(Protocol):
    """Reads of the locks under a backend's prefix (:class:`~.reading.LockInspector`)."""

    @property
    def prefix(self) -> str: ...

    def read(self, name: str) -> Optional[LockHolder]: ...

    def holders(self, name: str, limit: int) -> list[LockHolder]: ...

    def per_server(self, name: str) -> list[tuple[str, Any]]: ...

    def fence(self, name: str) -> int: ...

    def parked(self, name: str) -> list[str]: ...

    def waiting_newest(self, name: str) -> Optional[tuple[str, Optional[float]]]: ...

    def parked_counts(self, lock_keys: list[str]) -> list[int]: ...

    def rate_use(self, lock_keys: list[str]) -> list[tuple[int, Optional[float]]]: ...

    def scan(self, count: int = 500) -> Iterator[LockHolder]: ...

    def queued_names(self, count: int = 500) -> Iterator[str]: ...


class LockBackend(Protocol):
    """What the Celery layer, the renewer and the CLI need of a lock server.

    Operations a backend's :class:`Capabilities` exclude are refused (``acquire`` with
    ``fencing``, ``park``..., and ``enqueue``) with ``LockConfigurationError``; the reads of
    parked calls and queued markers answer "none" there, which is true: none can be made.
    """

    @property
    def prefix(self) -> str: ...

    @property
    def inspect(self) -> LockReader: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def renewer(self) -> Renewer: ...

    def keys(self, name: str) -> LockKeys: ...

    # -- leases
    def acquire(self, request: AcquireRequest) -> AcquireOutcome: ...

    def release(self, lease: Lease, *, remember_for: Optional[float] = None) -> bool: ...

    def release_cooling(
        self, lease: Lease, cooldown: float, *, remember_for: Optional[float] = None
    ) -> bool: ...

    def release_later(
        self,
        lease: Lease,
        then: Callable[[Optional[bool], Optional[LockError]], None],
        *,
        remember_for: Optional[float] = None,
    ) -> bool: ...

    def settle(self) -> None: ...

    def release_handing_off(
        self, lease: Lease, *, reservation_ttl: float, remember_for: Optional[float] = None
    ) -> tuple[bool, Optional[bytes]]: ...

    def release_latest(
        self, lease: Lease, *, reservation_ttl: float, remember_for: Optional[float] = None
    ) -> tuple[bool, Optional[bytes]]: ...

    def release_handing_on(
        self,
        lease: Lease,
        *,
        limit: int,
        rate: Optional[tuple[int, float]] = None,
        cooldown: Optional[float] = None,
        reservation_ttl: float,
        remember_for: Optional[float] = None,
    ) -> tuple[bool, list[bytes]]: ...

    def renew_batch(self, leases: Sequence[Lease], *, now: float) -> list[int]: ...

    def renew_by_owner(
        self, held: Sequence[tuple[str, Owner, float]], *, limits: Optional[Sequence[int]] = None
    ) -> list[int]: ...

    def release_abandoned(
        self, name: str, *, task_id: str, host: str, pid: int, slot: int = 1
    ) -> bool: ...

    def release_all(self) -> int: ...

    def subscribe_releases(self, name: str) -> ReleaseSubscription: ...

    # -- queued markers (capabilities.enqueue_markers)
    def enqueue(
        self, name: str, task_id: str, ttl: float, *, resend: bool = False, running: bool = True
    ) -> Optional[str]: ...

    def clear_queued(self, name: str, task_id: Optional[str] = None) -> bool: ...

    def queued_for(self, name: str) -> Optional[float]: ...

    def queued(self, name: str) -> Optional[str]: ...

    # -- parking (capabilities.parking)
    def hand_off_due(self, limit: int = 100) -> list[str]: ...

    def hand_off_if_free(self, name: str, *, reservation_ttl: float) -> Optional[bytes]: ...

    def hand_on(self, name: str, *, reservation_ttl: float) -> list[bytes]: ...

    def drop_parked(
        self, name: str, task_id: str, *, reservation_ttl: float
    ) -> Union[bool, bytes]: ...

    def hand_off_soon(self, name: str) -> int: ...

    # -- latest wins: displaced calls their worker did not mark
    def superseded_left(self, limit: int = 100) -> list[tuple[str, list[bytes]]]: ...

    def clear_superseded(
        self, name: str, task_ids: Sequence[str], *, look_again_in: float = 0.0
    ) -> int: ...

    def close(self) -> None: ...


#: field of the request -> the capability it needs, and the option it comes from (for people)
_NEEDS = (
    ("fencing", "fencing", "lock_fencing (a fencing token)"),
    ("min_replicas", "replica_acks", "lock_min_replicas"),
    ("take_queued", "enqueue_markers", "dedupe_on_enqueue (queued markers)"),
    ("park", "parking", "on_duplicate='queue' (parked messages)"),
)


def unsupported(capabilities: Capabilities, what: str, feature: str, name: str) -> LockError:
    """The error for asking ``capabilities`` for ``feature`` (said to people as ``what``)."""
    return LockConfigurationError(
        f"{what} is not supported on {capabilities.kind}: {capabilities.why_not(feature)}; "
        f"{capabilities.instead} for it",
        name,
    )


class BackendBase:
    """The public operations both backends share: validate, then delegate to ``_acquire`` (and
    the other small methods each backend writes). Not a backend by itself."""

    prefix: str
    capabilities: Capabilities
    _renewer: Optional[Renewer]

    @property
    def renewer(self) -> Renewer:
        return self._renewer if self._renewer is not None else process_renewer()

    def keys(self, name: str) -> LockKeys:
        """Key names of the lock called ``name`` under this backend's prefix."""
        return LockKeys.build(self.prefix, name)

    def try_acquire(
        self,
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
    ) -> AcquireOutcome:
        """Take the lock ``name`` for ``ttl`` seconds, without waiting: :meth:`acquire` of an
        :class:`AcquireRequest` of these arguments.

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
            finished_ttl: with ``unless_finished``: the ``remember_for`` of the releases
                whose records are looked for (records are kept in buckets of that width).
            min_replicas: hold the lock only once this many replicas acknowledged it (and its
                fence), waiting up to ``replica_timeout`` seconds (``WAIT``, sent with the
                acquire in the same round trip); otherwise it is released again and
                ``LockBackendUnavailable`` raised.
            take_queued: delete the lock's queued marker (see ``enqueue``) if it holds
                ``owner.task_id``, whatever the outcome, in the same round trip: this
                message is no longer queued.
            park: this task id's message. When the lock is held (or free but promised to an
                older parked task id), the message is parked behind it, in arrival order,
                and :class:`Parked` returned; a release with ``release_handing_off`` then
                reserves the lock for the oldest parked id and returns its message to
                publish. A lock reserved for ``owner.task_id`` is taken over.
            reservation_ttl: with ``park``: seconds a reservation made by this call lives.
            token: the owner token to write (a fresh one by default); a quorum sends the
                same token to each of its servers (:mod:`.redlock`).
            latest: with ``park``: the newest call wins (see :class:`~.latest.Latest`): at
                most one call waits, a newer one takes its place (:attr:`Parked.displaced`
                names the calls it displaced); release with ``release_latest``.
            limit: up to this many holders at once, each on its own slot (:mod:`.slots`);
                not with ``latest``, ``take_queued`` or ``min_replicas``. With ``park``,
                calls park behind the slots and are handed each freed slot in arrival order
                (:mod:`.slot_queue`): release with ``release_handing_on``.
            rate: ``(count, seconds)``: at most ``count`` acquisitions in any window of that
                many seconds (server clock); over it, a :class:`LockHolder` with
                ``over_rate`` and the wait as its ``ttl`` (with ``park``: parked, and handed
                a slot when the rate allows). Not with those three either.

        Raises:
            AlreadyFinished: with ``unless_finished``, that record exists.
            LockBackendUnavailable: the server could not be reached or refused the write.
            LockConfigurationError: an option this backend's capabilities exclude.
            LockNotOwnedError: the lock's key holds data this package did not write.
        """
        return self.acquire(
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
            )
        )

    def acquire(self, request: AcquireRequest) -> AcquireOutcome:
        """Take the lock ``request.name`` (see :meth:`try_acquire` for each field), after
        checking the request against this backend's capabilities."""
        ttl = request.ttl
        if not ttl > 0:
            raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
        if request.max_lifetime is not None and not request.max_lifetime > 0:
            raise ValueError(f"max_lifetime must be positive or None, got {request.max_lifetime!r}")
        owner = request.owner or Owner()
        if request.latest is not None and request.park is None:
            raise ValueError("latest needs park: the waiting call's message")
        if (
            request.unless_finished or request.take_queued or request.park is not None
        ) and not owner.task_id:
            raise ValueError("unless_finished, take_queued and park need an owner with a task_id")
        if request.fencing or request.min_replicas or request.take_queued or request.park:
            capabilities = self.capabilities
            for option, feature, what in _NEEDS:
                if getattr(request, option) and not getattr(capabilities, feature):
                    raise unsupported(capabilities, what, feature, self.keys(request.name).lock)
        if request.limit != 1 or request.rate is not None:
            self._check_limit(request)
        return self._acquire(request, owner)

    def _check_limit(self, request: AcquireRequest) -> None:
        limit = request.limit
        if type(limit) is not int or limit < 1:
            raise ValueError(f"limit must be an integer >= 1, got {limit!r}")
        if limit != 1 and not self.capabilities.slots:
            raise unsupported(
                self.capabilities, "lock_limit > 1", "slots", self.keys(request.name).lock
            )
        if request.rate is not None and not self.capabilities.rate:
            raise unsupported(self.capabilities, "lock_rate", "rate", self.keys(request.name).lock)
        if request.latest is not None or request.take_queued or request.min_replicas:
            raise LockConfigurationError(
                "a limit above 1 or a rate does not combine with latest wins, queued markers "
                "or replica acknowledgements (each of them is about one lock key)",
                self.keys(request.name).lock,
            )

    if TYPE_CHECKING:  # written by each backend

        def _acquire(self, request: AcquireRequest, owner: Owner) -> AcquireOutcome: ...

        def release(self, lease: Lease, *, remember_for: Optional[float] = None) -> bool: ...

        def hand_off_soon(self, name: str) -> int: ...

    def release_later(
        self,
        lease: Lease,
        then: Callable[[Optional[bool], Optional[LockError]], None],
        *,
        remember_for: Optional[float] = None,
    ) -> bool:
        """Send the release of ``lease`` without waiting for its reply, then report it through
        ``then``; False (nothing sent) where the backend cannot: call :meth:`release` then.
        This base cannot (a quorum waits for its majority)."""
        return False

    def settle(self) -> None:
        """Read the replies of releases sent with :meth:`release_later` (nothing here)."""

    def release_all(self) -> int:
        """Release every lease this process still holds through this backend; returns how
        many were released here.

        At shutdown: a plain release, without a hand-off (no message is sent from a process
        on its way out), but a lock with task ids parked behind it is made due in the
        hand-off index (``hand_off_soon``), so a sweeper hands it on at its next tick
        rather than at the old holder's TTL. One lease that cannot be released is logged and
        the others are still released.
        """
        self.settle()  # the deferred releases are reported before the process goes
        released = 0
        parking = self.capabilities.parking
        me: object = self
        for lease in self.renewer.leases():
            if lease.locker is me and lease.held:
                try:
                    if self.release(lease):
                        released += 1
                        if parking:
                            self.hand_off_soon(lease.keys.name)
                except LockError as exc:
                    log_release.error("could not release %s: %s", lease.key, exc)
        return released
