"""The one seam between the Celery layer and a lock server: what it asks of a backend.

Two backends sit side by side behind it (as httpx's transports sit behind its client):
:class:`~.locker.RedisLocker`, leases on one Redis server (or a Sentinel group's primary, or a
Redis Cluster), and :class:`~.redlock.QuorumLocker`, which *composes* one ``RedisLocker`` per
independent server. Neither subclasses the other: each implements :class:`LockBackend`, and
what a backend cannot do is said by its :class:`Capabilities`, read by the Celery layer to
refuse an option when a task is registered and when a worker starts, never found out from an
``isinstance`` check or a method that turns out to be a stub.

The request and outcome of one acquire are in :mod:`.acquire_request`; the checks both
backends make in :mod:`.checks`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, Optional, Protocol, Sequence, Union, runtime_checkable

from celery_singleton_lock.engine.acquire_request import (
    AcquireOutcome,
    AcquireRequest,
    PreparedAcquire,
)
from celery_singleton_lock.engine.cancel_watch import CancelSignal
from celery_singleton_lock.engine.capabilities import Capabilities
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.kinds.slot_queue import Due
from celery_singleton_lock.engine.lease import Lease, LeaseKeeper, LockHolder, Owner
from celery_singleton_lock.engine.renewer import Renewer


class ReleaseSubscription(Protocol):
    """A subscription to one lock's release channel (redis-py's ``PubSub`` is one)."""

    def get_message(
        self, ignore_subscribe_messages: bool = False, timeout: float = 0.0
    ) -> Optional[dict[str, Any]]: ...

    def close(self) -> None: ...


class LockReader(Protocol):
    """Reads of the locks under a backend's prefix (:class:`~.reading.LockInspector`): who
    holds them, their fences. The reads of the parts a backend may not have are
    :class:`PartsReader` and :class:`KeyspaceReader`: a reader declares them only where the
    parts exist, and a caller asks for them (``isinstance``) rather than read a stub's
    "none"."""

    @property
    def prefix(self) -> str: ...

    def read(self, name: str) -> Optional[LockHolder]: ...

    def holders(self, name: str, limit: int) -> list[LockHolder]: ...

    def per_server(self, name: str) -> list[tuple[str, Any]]: ...

    def fence(self, name: str) -> int: ...

    def scan(self, count: int = 500) -> Iterator[LockHolder]: ...


@runtime_checkable
class PartsReader(LockReader, Protocol):
    """Reads of the parts beside the leases: the calls parked behind a lock (policies
    ``queue``, ``replace``), a rate's window (``lock_rate``), the queued markers
    (``dedupe_on_enqueue``). Redis and PostgreSQL; not a quorum, which refuses those parts."""

    def parked(self, name: str) -> list[str]: ...

    def waiting_newest(self, name: str) -> Optional[tuple[str, Optional[float]]]: ...

    def parked_counts(self, lock_keys: list[str]) -> list[int]: ...

    def parked_locks(self, limit: int = 10_000) -> list[tuple[str, int, bool]]: ...

    def rate_use(self, lock_keys: list[str]) -> list[tuple[int, Optional[float]]]: ...

    def queued_names(self, count: int = 500) -> Iterator[str]: ...


@runtime_checkable
class KeyspaceReader(PartsReader, Protocol):
    """Reads of the keys themselves, for ``locks doctor``: Redis only (one server, Sentinel,
    a Cluster), whose markers and shared counters are keys."""

    def shared_counts(self) -> Optional[tuple[int, int]]: ...

    def marker_keys(self, count: int = 500) -> Iterator[str]: ...


class ParkingQueue(Protocol):
    """Calls parked behind a lock's slots and the hand-off of each freed slot (policy
    ``queue``; :class:`~.kinds.slot_queue.SlotQueue`). A call is parked by an acquire with
    ``park``."""

    def release_handing_on(
        self,
        lease: Lease,
        *,
        limit: int,
        rate: Optional[tuple[int, float]] = None,
        cooldown: Optional[float] = None,
        reservation_ttl: float,
        remember_for: Optional[float] = None,
        cap_key: str = "",
    ) -> tuple[bool, list[bytes]]: ...

    def hand_off_due(self, limit: int = 100) -> Due: ...

    def hand_on(self, name: str, *, reservation_ttl: float) -> list[bytes]: ...

    def handed(self, name: str, task_id: str, *, reservation_ttl: float) -> bool: ...

    def drop_parked(
        self, name: str, task_id: str, *, reservation_ttl: float
    ) -> Union[bool, bytes]: ...

    def hand_off_soon(self, name: str) -> int: ...


class LatestQueue(Protocol):
    """The newest call waits alone behind a lock (policy ``replace``, ``lock_debounce``;
    :class:`~.kinds.latest.LatestWins`). A call waits by an acquire with ``latest``."""

    def release_latest(
        self, lease: Lease, *, reservation_ttl: float, remember_for: Optional[float] = None
    ) -> tuple[bool, Optional[bytes]]: ...

    def superseded_left(self, limit: int = 100) -> list[tuple[str, list[bytes]]]: ...

    def clear_superseded(
        self, name: str, task_ids: Sequence[str], *, look_again_in: float = 0.0
    ) -> int: ...


class QueuedMarkers(Protocol):
    """Markers of the message queued under a lock name (``dedupe_on_enqueue``;
    :class:`~.kinds.markers.Markers`)."""

    def enqueue(
        self, name: str, task_id: str, ttl: float, *, resend: bool = False, running: bool = True
    ) -> Optional[str]: ...

    def clear_queued(self, name: str, task_id: Optional[str] = None) -> bool: ...

    def queued_for(self, name: str) -> Optional[float]: ...

    def queued(self, name: str) -> Optional[str]: ...


class CooldownRelease(Protocol):
    """A release that leaves the lock taken for a while (``lock_cooldown``;
    :class:`~.kinds.cooldown.Cooldown`)."""

    def release_cooling(
        self, lease: Lease, cooldown: float, *, remember_for: Optional[float] = None
    ) -> bool: ...


class CancelFlags(Protocol):
    """A running call asked to stop by the newest (policy ``restart``, beside latest wins:
    :class:`~.kinds.cancels.Cancels`, :class:`~.postgres.cancels.PostgresCancels`). The body
    reads its flag; a backend that can also push the news says so with
    :class:`PushedCancelFlags`."""

    def cancel_holder(self, name: str, by: str) -> Optional[str]: ...

    def cancel_requested(self, held: Sequence[tuple[str, str]]) -> list[bool]: ...


@runtime_checkable
class PushedCancelFlags(CancelFlags, Protocol):
    """Cancel flags whose stop is also pushed to the process of the running call (Redis:
    pub/sub on the lock's cancel channel, :mod:`.cancel_watch`), so its body need not read."""

    def watch(self, name: str, task_id: str) -> CancelSignal:
        """The running call ``task_id`` of the lock ``name`` told, in this process, when it is
        asked to stop (pushed; see :mod:`.cancel_watch`)."""
        ...

    def unwatch(self, signal: CancelSignal) -> None: ...


class LiveRule(NamedTuple):
    """A family's live rule as read now."""

    #: at most this many slots of each lock taken at once, or None
    cap: Optional[int]
    #: seconds the pause still lasts (None: not paused; ``float("inf")``: until resumed)
    paused_for: Optional[float]


class LiveRules(Protocol):
    """The live caps of lock families (a task's or group's name): at most so many slots of
    each of the family's locks taken at once (``celery locks limit``), read by every acquire
    that names the family's key (:func:`~.keys.cap_key`). Redis:
    :class:`~.live_rules.RedisLiveRules`, a hash per family (a copy per slot on a Cluster);
    PostgreSQL: :class:`~.postgres.live_rules.PostgresLiveRules`, a row per family. A backend
    whose rules can also pause declares :class:`PausingRules`."""

    def read(self, family: str) -> LiveRule: ...

    def set_cap(self, family: str, cap: Optional[int]) -> None: ...

    def every(self, limit: int = 1000) -> dict[str, LiveRule]: ...


@runtime_checkable
class PausingRules(LiveRules, Protocol):
    """Live rules that also pause every start of a family (``celery locks pause``,
    ``resume``, a body's ``pause_for``): Redis only, where the acquire scripts read the pause
    in the same call. PostgreSQL keeps caps but no pause, and so does not declare this:
    callers ask with ``isinstance`` and refuse, naming the backend."""

    def pause(self, family: str, seconds: Optional[float], *, lengthen: bool = False) -> float: ...

    def resume(self, family: str) -> None: ...


class LockBackend(LeaseKeeper, Protocol):
    """What the Celery layer, the renewer and the CLI need of a lock server (the releases and
    renewal of a lease: :class:`~.lease.LeaseKeeper`).

    The leases are all a backend must do. The queue, latest wins, queued markers and the
    cooldown are parts beside them (:class:`ParkingQueue`, :class:`LatestQueue`,
    :class:`QueuedMarkers`, :class:`CooldownRelease`), None on a backend that has none:
    nothing there answers with a stub. An acquire its :class:`Capabilities` exclude (with
    ``fencing``, ``park``...) is refused with ``LockConfigurationError``; its reader declares
    no reads of the parts it has not (:class:`LockReader`).
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

    def prepare(self, request: AcquireRequest) -> PreparedAcquire: ...

    def settle(self) -> None: ...

    def renew_by_owner(
        self, held: Sequence[tuple[str, Owner, float]], *, limits: Optional[Sequence[int]] = None
    ) -> list[int]: ...

    def release_abandoned(
        self, name: str, *, task_id: str, host: str, pid: int, slot: Optional[int] = None
    ) -> bool: ...

    def release_all(self) -> int: ...

    def subscribe_releases(self, name: str) -> ReleaseSubscription: ...

    # -- the parts beside the leases: None where the backend has none (its capabilities say
    # why, and registration refuses the option that needs it)
    @property
    def queue(self) -> Optional[ParkingQueue]: ...

    @property
    def latest(self) -> Optional[LatestQueue]: ...

    @property
    def markers(self) -> Optional[QueuedMarkers]: ...

    @property
    def cooldown(self) -> Optional[CooldownRelease]: ...

    @property
    def cancels(self) -> Optional[CancelFlags]: ...

    @property
    def live_rules(self) -> Optional[LiveRules]: ...

    def close(self) -> None: ...
