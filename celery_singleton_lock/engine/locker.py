"""Leases on one Redis server: acquire, release and renew, the only writes the engine makes.

Knows nothing of Celery. One round trip to acquire, one to release, one per tick to renew
every lease of the process (see :mod:`.renewer`). Each runs one script of ``lua/``
(:mod:`.lua_scripts`) through a redis-py ``Script`` object. Acquire and release run on
connections the locker keeps checked out of its client's pool (:mod:`.pinned`); renewal runs
through the client itself.

On a Redis Cluster (a redis-py ``RedisCluster`` client) every script runs through the client,
which sends it to the primary of its keys' slot (each lock's keys share one hash tag) and
follows MOVED, ASK and failovers itself. Renewal cannot send the keys of many slots to one
script there: it sends one single-key script call per lease in a cluster pipeline, which
redis-py groups by node, so a tick is still one round trip per primary, not one per lease.
Reading locks is :mod:`.reading`'s job, waiting for a release :mod:`.waiting`'s.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import script_calls, server_errors, slots, waiting
from celery_singleton_lock.engine.acquire_request import (
    AcquireOutcome,
    AcquireRequest,
    AcquireResult,
)
from celery_singleton_lock.engine.backend import ReleaseSubscription
from celery_singleton_lock.engine.backend_base import BackendBase
from celery_singleton_lock.engine.capabilities import Capabilities
from celery_singleton_lock.engine.cooldown import CooldownOperations
from celery_singleton_lock.engine.keys import LockKeys, validate_prefix
from celery_singleton_lock.engine.latest import LatestOperations
from celery_singleton_lock.engine.lease import Lease, LockHolder, Owner, already_finished, new_token
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.pinned import PinnedConnections
from celery_singleton_lock.engine.prepared_acquire import (
    GeneralAcquire,
    PackedMutex,
    PreparedAcquire,
)
from celery_singleton_lock.engine.queueing import QueueOperations, park_call
from celery_singleton_lock.engine.reading import Client, LockInspector
from celery_singleton_lock.engine.releases import Releases
from celery_singleton_lock.engine.renewer import Renewer, process_renewer
from celery_singleton_lock.engine.script_calls import Acknowledged, EachKey
from celery_singleton_lock.engine.server_renewal import RenewOperations
from celery_singleton_lock.engine.shared_keys import SharedKeys
from celery_singleton_lock.engine.slot_queue import SlotQueueOperations
from celery_singleton_lock.errors import AlreadySuperseded, ReplicasUnavailable

log_acquire = logging.getLogger("celery_singleton_lock.acquire")

#: One Redis server, or a Sentinel group's primary: everything is supported.
SINGLE_SERVER = Capabilities(
    fencing=True,
    replica_acks=True,
    parking=True,
    enqueue_markers=True,
    cluster=False,
    kind="one Redis server",
)
#: A Redis Cluster: a lock's keys share one slot, but the hand-off index is one key per
#: prefix, and WAIT must follow the acquire on one connection.
CLUSTER = Capabilities(
    fencing=True,
    replica_acks=False,
    parking=False,
    enqueue_markers=True,
    cluster=True,
    kind="a Redis Cluster",
    reasons=(
        ("parking", "its parked messages are found through one index key per prefix"),
        ("replica_acks", "WAIT must follow the acquire on one connection"),
    ),
    instead="use one Redis server or Sentinel",
)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisLocker(
    Releases,
    BackendBase,
    RenewOperations,
    QueueOperations,
    SlotQueueOperations,
    LatestOperations,
    CooldownOperations,
):
    """Leases on one Redis server (or one primary behind Sentinel), or on a Redis Cluster: the
    single-server backend of :mod:`.backend` (queued markers and parking: :mod:`.queueing`).

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
    """

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
        self.wall_clock = wall_clock
        self.inspect = LockInspector(client, prefix=self.prefix)
        self._acquire_script: Script = client.register_script(source("acquire"))
        self._release: Script = client.register_script(source("release"))
        self._renew: Script = client.register_script(source("renew"))
        self._release_abandoned: Script = client.register_script(source("release_abandoned"))
        self._renew_by_owner: Script = client.register_script(source("renew_by_owner"))
        self._acquire_slot: Script = client.register_script(source("acquire_slot"))
        self._release_cooling: Script = client.register_script(source("release_into_cooldown"))
        self._register_queue_scripts(client)
        self._register_slot_queue_scripts(client)
        self._register_latest_scripts(client)
        #: True for a Redis Cluster client: scripts run through it, renewal per node.
        self.cluster = isinstance(client, RedisCluster)
        self.capabilities = CLUSTER if self.cluster else SINGLE_SERVER
        self.shared = SharedKeys(self.prefix, cluster=self.cluster)
        #: Acquire/release connections kept out of the pool (None on a cluster: pool per node).
        self.connections = None if isinstance(client, RedisCluster) else PinnedConnections(client)
        self._pinned: Any = self.connections if self.connections is not None else client

    # -- acquire ------------------------------------------------------------------------------

    def _acquire(self, request: AcquireRequest, owner: Owner) -> AcquireOutcome:
        """One round trip (see :meth:`~.backend.BackendBase.try_acquire`); the request was
        checked by :meth:`~.backend.BackendBase.acquire`."""
        if request.limit != 1 or request.rate is not None:
            return self._acquire_one_of(request, owner)
        keys = self.keys(request.name)
        token = request.token or new_token()
        renewer = self.renewer
        sent_at = renewer.clock()
        # The value with an empty fence; the script fills the fence in when fencing.
        value = f"{token}||{int(self.wall_clock() * 1000)}|{owner.fields}"
        if request.park is None:
            script = self._acquire_script
            script_keys, args = self._acquire_call(request, keys, value, owner)
        elif request.latest is not None:
            script = self._acquire_or_replace
            script_keys, args = self._replace_call(request, request.latest, keys, value, owner)
        else:
            script = self._acquire_or_park
            script_keys, args = park_call(self, request, keys, value, owner)
        acknowledged = None
        min_replicas = request.min_replicas
        if min_replicas:
            assert self.connections is not None  # refused on a cluster by its capabilities
            sender: Any = Acknowledged(self.connections, min_replicas, request.replica_timeout)
            reply, acknowledged = script_calls.run(script, keys.lock, script_keys, args, sender)
        else:
            reply = self._run(script, keys.lock, script_keys, args, pinned=True)
        if type(reply) is list:
            return (
                self._parked(keys, reply) if request.latest is None else self._waiting(keys, reply)
            )
        outcome = self._mutex_outcome(keys, token, owner, reply, sent_at, request)
        if type(outcome) is not Lease:
            return outcome
        if acknowledged is not None and acknowledged < min_replicas:
            self.release(outcome)
            raise ReplicasUnavailable(
                f"lock {keys.lock} was written, but only {acknowledged} of {min_replicas} "
                f"replica(s) acknowledged it within {request.replica_timeout}s; released it "
                "again",
                keys.lock,
            )
        return self._hold(request, outcome, renewer)

    def _mutex_outcome(
        self,
        keys: LockKeys,
        token: str,
        owner: Owner,
        reply: Any,
        sent_at: float,
        request: AcquireRequest,
        max_lifetime: Optional[float] = None,
    ) -> AcquireResult:
        """What the ACQUIRE script's ``reply`` (not a list) says: the lease taken (not yet
        renewed), or the holder; raises for a finished or superseded task id."""
        if type(reply) is int:
            if reply >= 0:
                return self._lease(
                    request, keys, token, owner, reply or None, sent_at, max_lifetime
                )
            if reply == -1:
                raise already_finished(keys, owner)
            if reply == -2:
                raise AlreadySuperseded(
                    f"task id {owner.task_id} was superseded by a newer call of lock "
                    f"{keys.lock}: nothing was taken",
                    keys.lock,
                    {"task_id": owner.task_id},
                )
        text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
        pttl, _, fields = text.partition("|")
        holder = LockHolder.parse(keys.lock, fields, pttl)
        if holder is None:
            raise server_errors.not_a_lock(keys.lock)
        return holder

    def prepare(self, request: AcquireRequest) -> PreparedAcquire:
        """``request`` checked once for many calls that each set its name, owner and time
        limit (see :mod:`.prepared_acquire`): packed once when it is a mutex on one server
        with kept connections."""
        self._check(request)
        connections = self.connections
        if (
            connections is not None
            and connections.keeps_connections
            and request.limit == 1
            and request.rate is None
            and request.park is None
            and not request.min_replicas
            and request.token is None
        ):
            return PackedMutex(self, request)
        return GeneralAcquire(self, request)

    def _acquire_one_of(self, request: AcquireRequest, owner: Owner) -> AcquireOutcome:
        """Take one of ``request.limit`` slots (:mod:`.slots`), or park behind them
        (:mod:`.slot_queue`), in one round trip."""
        keys = self.keys(request.name)
        token = request.token or new_token()
        renewer = self.renewer
        sent_at = renewer.clock()
        value = f"{token}||{int(self.wall_clock() * 1000)}|{owner.fields}"
        if request.park is not None:
            return self._acquire_slot_or_park(request, owner, token, value, sent_at)
        script_keys, args = slots.acquire_call(
            keys,
            request.limit,
            _ms(request.ttl),
            value,
            request.fencing,
            request.rate,
            self.shared.of(keys.lock),
            owner.task_id,
            _ms(request.finished_ttl) if request.unless_finished else None,
        )
        reply = self._run(self._acquire_slot, keys.lock, script_keys, args, pinned=True)
        if type(reply) is list:
            slot, fence = int(reply[0]), int(reply[1])
            if slot == 0:  # over the rate: ``fence`` is the wait in ms
                return LockHolder(keys.lock, "", "", None, None, None, fence / 1000.0, False, True)
            lease = self._lease(
                request, slots.slot_keys(keys, slot), token, owner, fence or None, sent_at
            )
            return self._hold(request, lease, renewer)
        if reply == -1:
            raise already_finished(keys, owner)
        pttl, _, fields = _lease.as_text(reply).partition("|")
        holder = LockHolder.parse(keys.lock, fields, pttl)
        if holder is None:
            raise server_errors.not_a_lock(keys.lock)
        return holder

    def _lease(
        self,
        request: AcquireRequest,
        keys: LockKeys,
        token: str,
        owner: Owner,
        fence: Optional[int],
        sent_at: float,
        max_lifetime: Optional[float] = None,
    ) -> Lease:
        """The lease an acquire took; ``max_lifetime``: the call's, else the request's."""
        if max_lifetime is None:
            max_lifetime = request.max_lifetime
        return Lease(
            locker=self,
            keys=keys,
            token=token,
            ttl=request.ttl,
            owner=owner,
            fence=fence,
            confirmed_at=sent_at,
            deadline=None if max_lifetime is None else sent_at + max_lifetime,
            on_lost=request.on_lost,
        )

    @staticmethod
    def _hold(request: AcquireRequest, lease: Lease, renewer: Renewer) -> Lease:
        """Renew ``lease`` as ``request`` asks (it was given its ``on_lost`` as it was made)."""
        if request.renew:
            renewer.add(lease)
        log_acquire.debug("acquired %s (fence=%s)", lease.key, lease.fence)
        return lease

    def _acquire_call(
        self, request: AcquireRequest, keys: LockKeys, value: str, owner: Owner
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the acquire script (see its contract in lua/acquire.lua) for the
        lock ``value`` (its fence empty)."""
        fencing, unless_finished, take_queued = (
            request.fencing,
            request.unless_finished,
            request.take_queued,
        )
        if not (fencing or unless_finished or take_queued):
            return [keys.lock], [_ms(request.ttl), value]
        counter, finished = self.shared.of(keys.lock)
        script_keys = [keys.lock, counter, finished, keys.queued]
        args: list[Any] = [
            _ms(request.ttl),
            value,
            "1" if fencing else "0",
            owner.task_id,
            _ms(request.finished_ttl) if unless_finished else "",
            ("2" if request.queued_while_held else "1") if take_queued else "0",
        ]
        return script_keys, args

    # -- plumbing -----------------------------------------------------------------------------

    def _run(
        self, script: Script, key: str, keys: list[str], args: list[Any], *, pinned: bool = False
    ) -> Any:
        """Run ``script`` (EVALSHA, loading it on NOSCRIPT), on the kept connections when
        ``pinned``; redis-py's errors said as ``LockError`` about ``key``."""
        connections = self.connections
        if pinned and connections is not None:
            body = connections.parts(len(keys), *keys, *args)
            return self._evalsha_packed(script, key, 1 + len(keys) + len(args), body)
        return script_calls.run(script, key, keys, args, self._pinned if pinned else self.client)

    def _evalsha_packed(self, script: Script, key: str, count: int, body: bytes) -> Any:
        """``EVALSHA`` of ``script`` with the ``count`` parts packed in ``body`` (numkeys,
        KEYS, ARGV) on a kept connection, without redis-py's Script wrappers (the hot path:
        every acquire and waited release). A server that lost the script (restart, failover,
        SCRIPT FLUSH) answers NOSCRIPT: loaded, sent again. Errors said as ``LockError``
        about ``key``."""
        connections = self.connections
        assert connections is not None
        try:
            start = connections.start("EVALSHA", script.sha)
            try:
                return connections.call_packed(b"*%d\r\n%b%b" % (start[0] + count, start[1], body))
            except NoScriptError:
                script.sha = connections.script_load(script.script)
                start = connections.start("EVALSHA", script.sha)
                return connections.call_packed(b"*%d\r\n%b%b" % (start[0] + count, start[1], body))
        except server_errors.REDIS_ERRORS as exc:
            server_errors.raise_translated(exc, key)

    def _run_each(self, script: Script, calls: list[tuple[list[str], list[Any]]]) -> list[int]:
        """Run ``script`` once per ``(keys, args)`` of ``calls`` in one cluster pipeline (one
        round trip per node, see :class:`~.script_calls.EachKey`); return the indices of the
        calls whose reply names a key NOT renewed (a non-empty list, as the renew scripts
        return for a lost key)."""
        replies = script_calls.run(script, calls[0][0][0], [], [], EachKey(self.client, calls))
        return [index for index, reply in enumerate(replies) if reply]

    # -- the rest of the seam ------------------------------------------------------------------

    def subscribe_releases(self, name: str) -> ReleaseSubscription:
        """A subscription to the release channel of the lock ``name`` (the caller closes it)."""
        return waiting.subscribe_releases(self.client, self.keys(name).channel)  # type: ignore[arg-type]

    def close(self) -> None:
        """Give back the kept connections, close the client's, and those to its sentinels if
        it has any."""
        if self.connections is not None:
            self.connections.close()
        self.client.close()
        manager = getattr(getattr(self.client, "connection_pool", None), "sentinel_manager", None)
        for sentinel in getattr(manager, "sentinels", ()):
            sentinel.close()
