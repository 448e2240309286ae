"""Leases on one Redis server: acquire, release and renew, the only writes the engine makes.

Knows nothing of Celery. One round trip to acquire, one to release, one per tick to renew
every lease of the process (see :mod:`.renewer`). Each runs one script of :mod:`.scripts`
through a redis-py ``Script`` object. Acquire and release run on connections the locker keeps
checked out of its client's pool (:mod:`.pinned`); renewal runs through the client itself.

On a Redis Cluster (a redis-py ``RedisCluster`` client) every script runs through the client,
which sends it to the primary of its keys' slot (each lock's keys share one hash tag) and
follows MOVED, ASK and failovers itself. Renewal cannot send the keys of many slots to one
script there: it sends one single-key script call per lease in a cluster pipeline, which
redis-py groups by node, so a tick is still one round trip per primary, not one per lease.
Reading locks is :mod:`.reading`'s job, waiting for a release :mod:`.waiting`'s.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Optional

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import script_calls, scripts, server_errors, slots, waiting
from celery_singleton_lock.engine.acquire_request import AcquireOutcome, AcquireRequest
from celery_singleton_lock.engine.backend import ReleaseSubscription
from celery_singleton_lock.engine.backend_base import BackendBase
from celery_singleton_lock.engine.capabilities import Capabilities
from celery_singleton_lock.engine.cooldown import RELEASE_INTO_COOLDOWN, CooldownOperations
from celery_singleton_lock.engine.deferred import DeferredRelease
from celery_singleton_lock.engine.fork_safety import current_pid
from celery_singleton_lock.engine.keys import LockKeys, validate_prefix
from celery_singleton_lock.engine.latest import LatestOperations
from celery_singleton_lock.engine.lease import Lease, LockHolder, Owner, already_finished
from celery_singleton_lock.engine.pinned import PinnedConnections
from celery_singleton_lock.engine.queueing import QueueOperations, park_call
from celery_singleton_lock.engine.reading import Client, LockInspector
from celery_singleton_lock.engine.renewer import Renewer
from celery_singleton_lock.engine.script_calls import Acknowledged, EachKey
from celery_singleton_lock.engine.server_renewal import RenewOperations
from celery_singleton_lock.engine.shared_keys import SharedKeys
from celery_singleton_lock.engine.slot_queue import SlotQueueOperations
from celery_singleton_lock.errors import AlreadySuperseded, LockError, ReplicasUnavailable

log_acquire = logging.getLogger("celery_singleton_lock.acquire")
log_release = logging.getLogger("celery_singleton_lock.release")

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


def new_token() -> str:
    """A fresh 128-bit random owner token (hex), from ``os.urandom`` as ``secrets`` does."""
    return os.urandom(16).hex()


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisLocker(
    DeferredRelease,
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
        upgrading: bool = False,
    ) -> None:
        self.client = client
        #: True while workers of the previous version (per-name fence counters and finish
        #: records) run beside this one: the per-name keys are written too (see shared_keys).
        self.upgrading = upgrading
        self.prefix = validate_prefix(prefix)
        self._renewer = renewer
        self.wall_clock = wall_clock
        self.inspect = LockInspector(client, prefix=self.prefix)
        self._acquire_script: Script = client.register_script(scripts.ACQUIRE)
        self._release: Script = client.register_script(scripts.RELEASE)
        self._renew: Script = client.register_script(scripts.RENEW)
        self._release_abandoned: Script = client.register_script(scripts.RELEASE_ABANDONED)
        self._renew_by_owner: Script = client.register_script(scripts.RENEW_BY_OWNER)
        self._acquire_slot: Script = client.register_script(slots.ACQUIRE_SLOT)
        self._release_cooling: Script = client.register_script(RELEASE_INTO_COOLDOWN)
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
        if type(reply) is not int:
            text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
            pttl, _, fields = text.partition("|")
            holder = LockHolder.parse(keys.lock, fields, pttl)
            if holder is None:
                raise server_errors.not_a_lock(keys.lock)
            return holder
        if reply == -1:
            raise already_finished(keys, owner)
        if reply == -2:
            raise AlreadySuperseded(
                f"task id {owner.task_id} was superseded by a newer call of lock {keys.lock}: "
                "nothing was taken",
                keys.lock,
                {"task_id": owner.task_id},
            )
        lease = self._lease(request, keys, token, owner, reply or None, sent_at)
        if acknowledged is not None and acknowledged < min_replicas:
            self.release(lease)
            raise ReplicasUnavailable(
                f"lock {keys.lock} was written, but only {acknowledged} of {min_replicas} "
                f"replica(s) acknowledged it within {request.replica_timeout}s; released it "
                "again",
                keys.lock,
            )
        return self._hold(request, lease, renewer)

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
            self.upgrading,
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
    ) -> Lease:
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
        """KEYS and ARGV of the acquire script (see its contract in :mod:`.scripts`) for the
        lock ``value`` (its fence empty)."""
        fencing, unless_finished, take_queued = (
            request.fencing,
            request.unless_finished,
            request.take_queued,
        )
        if not (fencing or unless_finished or take_queued):
            return [keys.lock], [_ms(request.ttl), value]
        counter, finished = self.shared.of(keys.lock)
        task_id = owner.task_id
        script_keys = [
            keys.lock,
            counter,
            keys.fence,
            finished,
            # the previous version's record, looked for only with unless_finished
            keys.finished(task_id) if unless_finished else keys.lock,
            keys.queued,
        ]
        args: list[Any] = [
            _ms(request.ttl),
            value,
            "1" if fencing else "0",
            task_id,
            _ms(request.finished_ttl) if unless_finished else "",
            ("2" if request.queued_while_held else "1") if take_queued else "0",
            "1" if self.upgrading else "0",
        ]
        return script_keys, args

    def _with_finish_record(
        self,
        lease: Lease,
        remember_for: Optional[float],
        script_keys: list[str],
        args: list[Any],
    ) -> tuple[list[str], list[Any]]:
        """``script_keys`` and ``args`` of a release script, with the KEYS and ARGV that record
        that ``lease``'s owner ran to the end, for ``remember_for`` seconds, appended when
        asked and the owner has a task id (see RELEASE in :mod:`.scripts`)."""
        task_id = lease.owner.task_id
        if remember_for is None or not task_id:
            return script_keys, args
        return (
            [*script_keys, self.shared.of(lease.key)[1], lease.keys.finished(task_id)],
            [*args, _ms(remember_for), task_id, "1" if self.upgrading else "0"],
        )

    # -- release ------------------------------------------------------------------------------

    def release(self, lease: Lease, *, remember_for: Optional[float] = None) -> bool:
        """Release ``lease`` with a compare-and-delete, in one round trip.

        Returns True if the lock was still ours, False if it had expired or been taken over
        (nothing is deleted then). With ``remember_for`` (seconds), the same script records
        that the owner's task id ran to the end: for that long, an acquire of this lock by
        that task id with ``unless_finished`` takes nothing. Releasing twice, or from a forked
        child that inherited the lease, changes nothing and returns False.

        Raises:
            LockBackendUnavailable: the server could not be reached; the lease keeps its
                token (and stays unrenewed), so ``release`` may simply be called again.
        """
        script_keys, args = self._release_call(lease, remember_for)
        return bool(self._release_with(lease, self._release, script_keys, args))

    def _release_call(
        self, lease: Lease, remember_for: Optional[float]
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the release script (see its contract in :mod:`.scripts`)."""
        return self._with_finish_record(
            lease, remember_for, [lease.key], [lease.token, lease.keys.channel]
        )

    def _release_with(
        self,
        lease: Lease,
        script: Script,
        script_keys: list[str],
        args: list[Any],
        remember_for: Optional[float] = None,
    ) -> Any:
        """Run a release ``script`` for ``lease`` once (its reply), or return 0 without a
        round trip for a lease already released or inherited from the parent process. With
        ``remember_for``, the script records the owner's finish too
        (:meth:`_with_finish_record`)."""
        script_keys, args = self._with_finish_record(lease, remember_for, script_keys, args)
        if lease.pid != current_pid():  # inherited from the parent: never touched here
            return 0
        with _lease._state_lock:
            if lease.released:
                return 0
            lease.released = True  # from here a failed renewal is not reported as a loss
        self.renewer.discard(lease)
        try:
            released = self._run(script, lease.key, script_keys, args, pinned=True)
        except LockError:
            lease.released = False
            raise
        if not released:  # the caller reports it (the Celery layer, naming the task)
            log_release.debug("released %s but it was no longer ours", lease.key)
        return released

    def release_abandoned(
        self, name: str, *, task_id: str, host: str, pid: int, slot: int = 1
    ) -> bool:
        """Release the lock ``name`` (its ``slot``, :mod:`.slots`) if it is held by that
        (dead) execution; True if released.

        For a supervisor whose child died holding a lock: it cannot know the child's token,
        so the owner metadata stands in for it. Callers must first make sure that ``pid`` on
        ``host`` is really gone.
        """
        keys = self.keys(name)
        key = slots.slot_key(keys, slot)
        owner = Owner(task_id=task_id, host=host, pid=pid)
        return bool(self._run(self._release_abandoned, key, [key], [owner.fields, keys.channel]))

    # -- plumbing -----------------------------------------------------------------------------

    def _run(
        self, script: Script, key: str, keys: list[str], args: list[Any], *, pinned: bool = False
    ) -> Any:
        """Run ``script`` (EVALSHA, loading it on NOSCRIPT), on the kept connections when
        ``pinned``; redis-py's errors said as ``LockError`` about ``key``."""
        connections = self.connections
        if pinned and connections is not None:
            # The hot path (every acquire and waited release): EVALSHA packed here, on a kept
            # connection, without redis-py's Script wrappers. A server that lost the script
            # (restart, failover, SCRIPT FLUSH) answers NOSCRIPT: loaded, sent again.
            try:
                start = connections.start("EVALSHA", script.sha)
                packed = connections.pack(len(keys), *keys, *args, start=start)
                try:
                    return connections.call_packed(packed)
                except NoScriptError:
                    script.sha = connections.script_load(script.script)
                    return connections.call("EVALSHA", script.sha, len(keys), *keys, *args)
            except server_errors.REDIS_ERRORS as exc:
                server_errors.raise_translated(exc, key)
        return script_calls.run(script, key, keys, args, self._pinned if pinned else self.client)

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
