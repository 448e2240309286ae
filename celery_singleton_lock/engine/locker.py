"""Leases on one Redis server: the backend composed of one small object per job.

Knows nothing of Celery. One round trip to acquire, one to release, one per tick to renew
every lease of the process (see :mod:`.renewer`). :class:`~.redis_server.RedisServer` talks
to the server; each kind of lock (:mod:`.kinds`: the mutex, the slots, the cooldown, the
queues, latest wins, the queued markers), the releases (:mod:`.server_leases`) and the renewal
(:mod:`.server_renewal`) hold it and run their own scripts through it. :class:`RedisLocker`
builds them, answers the leases of :mod:`.backend` with them, and hands out the parts beside
the leases (the queue, latest wins, the queued markers, the cooldown) as they are. Acquire and
release run on connections kept checked out of the client's pool
(:class:`.redis_server.PinnedConnections`); renewal runs through the client itself.

On a Redis Cluster (a redis-py ``RedisCluster`` client) every script runs through the client,
which sends it to the primary of its keys' slot (each lock's keys share one hash tag) and
follows MOVED, ASK and failovers itself. Renewal cannot send the keys of many slots to one
script there: it sends one single-key script call per lease in a cluster pipeline, which
redis-py groups by node, so a tick is still one round trip per primary, not one per lease.
Reading locks is :mod:`.reading`'s job, waiting for a release :mod:`.waiting`'s.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Callable, Optional, Sequence

from celery_singleton_lock.engine import acquire_request, checks, waiting
from celery_singleton_lock.engine.acquire_request import (
    AcquireOutcome,
    AcquireRequest,
    ChosenAcquire,
    PreparedAcquire,
    Take,
    check_call,
)
from celery_singleton_lock.engine.backend import ReleaseSubscription
from celery_singleton_lock.engine.capabilities import Capabilities
from celery_singleton_lock.engine.keys import (
    LockKeys,
    SharedKeys,
    held_index,
    marker_index,
    validate_prefix,
)
from celery_singleton_lock.engine.kinds.cancels import Cancels
from celery_singleton_lock.engine.kinds.cooldown import Cooldown
from celery_singleton_lock.engine.kinds.latest import LatestWins
from celery_singleton_lock.engine.kinds.markers import Markers
from celery_singleton_lock.engine.kinds.mutex import Mutex, PackedMutex
from celery_singleton_lock.engine.kinds.slot_queue import SlotQueue
from celery_singleton_lock.engine.kinds.slots import Slots
from celery_singleton_lock.engine.lease import Lease, Owner
from celery_singleton_lock.engine.live_rules import RedisLiveRules
from celery_singleton_lock.engine.reading import Client, LockInspector
from celery_singleton_lock.engine.redis_server import RedisServer
from celery_singleton_lock.engine.renewer import Renewer, process_renewer
from celery_singleton_lock.engine.server_leases import Issuer, Releases
from celery_singleton_lock.engine.server_renewal import ServerRenewal
from celery_singleton_lock.errors import LockError

#: One Redis server, or a Sentinel group's primary: everything is supported.
SINGLE_SERVER = Capabilities(
    fencing=True,
    replica_acks=True,
    parking=True,
    enqueue_markers=True,
    cluster=False,
    kind="one Redis server",
)
#: A Redis Cluster: a lock's keys share one slot, and so do the keys many locks share there
#: (the fence counter, the finish records, the indexes of due locks: one of each per slot,
#: see keys.py); but WAIT must follow the acquire on one connection. A sweeper reads the due
#: locks of a window of slots per tick, not all of them, plus the slots the summary of due
#: slots names (see slot_sweep.py), which the queue's and latest wins' scripts' callers mark.
CLUSTER = Capabilities(
    fencing=True,
    replica_acks=False,
    parking=True,
    enqueue_markers=True,
    cluster=True,
    kind="a Redis Cluster",
    reasons=(("replica_acks", "WAIT must follow the acquire on one connection"),),
    instead="use one Redis server or Sentinel",
)


class RedisLocker:
    """Leases on one Redis server (or one primary behind Sentinel), or on a Redis Cluster: the
    single-server backend of :mod:`.backend`, composed of one object per job (see the module
    docstring).

    Args:
        client: a redis-py client (``redis.Redis``, or ``redis.cluster.RedisCluster`` for a
            cluster). Its connections, timeouts and retry policy are used as they are; the
            engine adds none of its own.
        prefix: namespace of every key this locker writes.
        renewer: renews the leases; defaults to the one renewer of this process.
        wall_clock: clock stored as ``acquired_at`` (seconds since the epoch).

    Attributes:
        inspect: reads the locks under the same prefix (:class:`~.reading.LockInspector`).
        capabilities: :data:`SINGLE_SERVER`, or :data:`CLUSTER` for a cluster client.
        queue: calls parked behind a lock (:class:`~.kinds.slot_queue.SlotQueue`).
        latest: the newest call wins (:class:`~.kinds.latest.LatestWins`).
        cancels: the running call asked to stop (:class:`~.kinds.cancels.Cancels`).
        markers: queued markers (:class:`~.kinds.markers.Markers`).
        cooldown: the release into a cooldown (:class:`~.kinds.cooldown.Cooldown`).
    """

    try_acquire = checks.try_acquire

    def __init__(
        self,
        client: Client,
        *,
        prefix: str = "singleton-lock",
        renewer: Optional[Renewer] = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.prefix = validate_prefix(prefix)
        self.renewer = renewer if renewer is not None else process_renewer()
        self.inspect = LockInspector(client, prefix=self.prefix)
        self.server = server = RedisServer(client)
        self.capabilities = CLUSTER if server.cluster else SINGLE_SERVER
        self.shared = SharedKeys(self.prefix, cluster=server.cluster)
        #: Acquire/release connections kept out of the pool (None on a cluster: pool per node).
        self.connections = server.connections
        # the held index is one key per prefix: not on a cluster (see keys.held_index)
        held = None if server.cluster else held_index(self.prefix)
        markers = None if server.cluster else marker_index(self.prefix)
        self.issuer = issuer = Issuer(
            self, self.prefix, self.shared, self.renewer, wall_clock, held, markers
        )
        self.releases = releases = Releases(server, issuer)
        self.renewal = ServerRenewal(server, issuer)
        self.mutex = Mutex(server, issuer)
        self.slots = Slots(server, issuer)
        self.cooldown = Cooldown(server, releases)
        self.markers = Markers(server, issuer)
        # every key of a lock's parked calls, latest wins and cancel flag shares the lock's
        # hash tag, and the indexes of due locks are one per slot on a Cluster (with a
        # summary of the slots due, slot_sweep.py): all of them run there
        queue = SlotQueue(server, issuer, releases)
        self.queue: Optional[SlotQueue] = queue
        # latest wins' waiting calls share the queue's hand-off indexes, and so its summary
        self.latest: Optional[LatestWins] = LatestWins(server, issuer, releases, queue.due_slots)
        self.cancels = Cancels(server, issuer)
        #: the families' live caps and pauses (one key per family; on a cluster a copy per
        #: slot)
        self.live_rules = RedisLiveRules(server, self.prefix)
        # A task's release is the hot path: the releases' own methods, bound here, cost no
        # call more than before; the methods below (the same) are what is documented and typed.
        self.release = releases.release  # type: ignore[method-assign]
        self.release_later = releases.release_later  # type: ignore[method-assign]

    def keys(self, name: str) -> LockKeys:
        """Key names of the lock called ``name`` under this backend's prefix."""
        return LockKeys.build(self.prefix, name)

    # -- acquire ------------------------------------------------------------------------------

    def acquire(self, request: AcquireRequest) -> AcquireOutcome:
        """Take the lock ``request.name`` (see :func:`~.checks.try_acquire` for each field),
        after checking the request against this backend's capabilities, in one round trip: a
        mutex, one of N slots (a limit or a rate), or parked behind either."""
        acquire_request.check(request, self.capabilities, self.prefix)
        owner = request.owner or Owner()
        check_call(request, owner, request.max_lifetime)
        return self._kind(request)(request, owner)

    def _kind(self, request: AcquireRequest) -> Take:
        """The kind of lock that takes ``request``: a mutex, one of N slots (a limit or a
        rate), or parked behind either."""
        if request.park is not None:
            assert self.queue is not None and self.latest is not None
            if request.latest is not None:
                return partial(self.mutex.acquire, queue=self.latest)
            return self.queue.acquire
        if request.slotted or request.limit != 1 or request.rate is not None:
            return self.slots.acquire
        return self.mutex.acquire

    def prepare(self, request: AcquireRequest) -> PreparedAcquire:
        """``request`` checked once for many calls that each set its name, owner and time
        limit (see :mod:`.acquire_request`), and the kind of lock that takes it chosen once:
        packed once when it is a mutex on one server with kept connections."""
        acquire_request.check(request, self.capabilities, self.prefix)
        connections = self.connections
        if (
            connections is not None
            and connections.keeps_connections
            and request.limit == 1
            and request.rate is None
            and not request.slotted
            and request.park is None
            and not request.min_replicas
            and request.token is None
        ):
            return PackedMutex(self.mutex, request)
        return ChosenAcquire(self._kind(request), request)

    # -- release ------------------------------------------------------------------------------

    def release(self, lease: Lease, *, remember_for: Optional[float] = None) -> bool:
        """See :meth:`.server_leases.Releases.release`."""
        return self.releases.release(lease, remember_for=remember_for)

    def release_later(
        self,
        lease: Lease,
        then: Callable[[Optional[bool], Optional[LockError]], None],
        *,
        remember_for: Optional[float] = None,
    ) -> bool:
        """See :meth:`.server_leases.Releases.release_later`."""
        return self.releases.release_later(lease, then, remember_for=remember_for)

    def settle(self) -> None:
        """See :meth:`.server_leases.Releases.settle`."""
        self.releases.settle()

    def release_abandoned(
        self, name: str, *, task_id: str, host: str, pid: int, slot: Optional[int] = None
    ) -> bool:
        """See :meth:`.server_leases.Releases.release_abandoned`."""
        return self.releases.release_abandoned(name, task_id=task_id, host=host, pid=pid, slot=slot)

    def release_all(self) -> int:
        """See :func:`.checks.release_all`."""
        return checks.release_all(self)

    # -- renew --------------------------------------------------------------------------------

    def renew_batch(self, leases: Sequence[Lease], *, now: float) -> list[int]:
        """See :meth:`.server_renewal.ServerRenewal.renew_batch`."""
        return self.renewal.renew_batch(leases, now=now)

    def renew_by_owner(
        self, held: Sequence[tuple[str, Owner, float]], *, limits: Optional[Sequence[int]] = None
    ) -> list[int]:
        """See :meth:`.server_renewal.ServerRenewal.renew_by_owner`."""
        return self.renewal.renew_by_owner(held, limits=limits)

    # -- the rest of the seam ------------------------------------------------------------------

    def subscribe_releases(self, name: str) -> ReleaseSubscription:
        """A subscription to the release channel of the lock ``name`` (the caller closes it)."""
        return waiting.subscribe_releases(self.client, self.keys(name).channel)  # type: ignore[arg-type]

    def close(self) -> None:
        """See :meth:`.redis_server.RedisServer.close`; this process's watch of cancel
        channels stops too."""
        self.cancels.close()
        self.server.close()
