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
from functools import partial
from typing import Any, Callable, Optional, Sequence, Union

from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.exceptions import NoScriptError, RedisError

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import scripts, server_errors
from celery_singleton_lock.engine.keys import LockKeys, handoff_index, validate_prefix
from celery_singleton_lock.engine.lease import Lease, LockHolder, LostCallback, Owner, Parked
from celery_singleton_lock.engine.pinned import PinnedConnections
from celery_singleton_lock.engine.reading import Client, LockInspector
from celery_singleton_lock.engine.renewer import Renewer, process_renewer
from celery_singleton_lock.errors import (
    AlreadyFinished,
    LockBackendUnavailable,
    LockConfigurationError,
    LockError,
    ReplicasUnavailable,
)

log_acquire = logging.getLogger("celery_singleton_lock.acquire")
log_release = logging.getLogger("celery_singleton_lock.release")

AcquireResult = Union[Lease, LockHolder]


def new_token() -> str:
    """A fresh 128-bit random owner token (hex), from ``os.urandom`` as ``secrets`` does."""
    return os.urandom(16).hex()


def _as_bytes(reply: Union[bytes, str]) -> bytes:
    # a client made with decode_responses=True hands back str
    return reply.encode("utf-8", "surrogateescape") if isinstance(reply, str) else reply


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class RedisLocker:
    """Leases on one Redis server (or one primary behind Sentinel), or on a Redis Cluster.

    Args:
        client: a redis-py client (``redis.Redis``, or ``redis.cluster.RedisCluster`` for a
            cluster). Its connections, timeouts and retry policy are used as they are; the
            engine adds none of its own.
        prefix: namespace of every key this locker writes.
        renewer: renews the leases; defaults to the one renewer of this process.
        wall_clock: clock stored as ``acquired_at`` (seconds since the epoch).

    Attributes:
        inspect: reads the locks under the same prefix (:class:`~.inspect.LockInspector`).
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
        self._renewer = renewer
        self.wall_clock = wall_clock
        self.inspect = LockInspector(client, prefix=self.prefix)
        self._acquire: Script = client.register_script(scripts.ACQUIRE)
        self._release: Script = client.register_script(scripts.RELEASE)
        self._renew: Script = client.register_script(scripts.RENEW)
        self._release_abandoned: Script = client.register_script(scripts.RELEASE_ABANDONED)
        self._renew_by_owner: Script = client.register_script(scripts.RENEW_BY_OWNER)
        self._enqueue: Script = client.register_script(scripts.ENQUEUE)
        self._clear_queued: Script = client.register_script(scripts.CLEAR_QUEUED)
        self._acquire_or_park: Script = client.register_script(scripts.ACQUIRE_OR_PARK)
        self._release_and_hand_off: Script = client.register_script(scripts.RELEASE_AND_HAND_OFF)
        self._handoff_due: Script = client.register_script(scripts.HANDOFF_DUE)
        self._drop_parked: Script = client.register_script(scripts.DROP_PARKED)
        #: True for a Redis Cluster client: scripts run through it, renewal per node.
        self.cluster = isinstance(client, RedisCluster)
        #: Acquire and release run here: connections kept checked out of the client's pool.
        #: None on a cluster, which has a pool per node and routes each call by its key.
        self.connections = None if isinstance(client, RedisCluster) else PinnedConnections(client)
        self._pinned: Any = self.connections if self.connections is not None else client

    @property
    def renewer(self) -> Renewer:
        return self._renewer if self._renewer is not None else process_renewer()

    def keys(self, name: str) -> LockKeys:
        """Key names of the lock called ``name`` under this locker's prefix."""
        return LockKeys.build(self.prefix, name)

    # -- acquire ------------------------------------------------------------------------------

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
    ) -> Union[AcquireResult, Parked]:
        """Take the lock ``name`` for ``ttl`` seconds, in one round trip, without waiting.

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
            min_replicas: hold the lock only once this many replicas acknowledged it (and its
                fence), waiting up to ``replica_timeout`` seconds (``WAIT``, sent with the
                acquire in the same round trip); otherwise it is released again and
                ``LockBackendUnavailable`` raised.
            take_queued: delete the lock's queued marker (see :meth:`enqueue`) if it holds
                ``owner.task_id``, whatever the outcome, in the same round trip: this
                message is no longer queued.
            park: this task id's message. When the lock is held (or free but promised to an
                older parked task id), the message is parked behind it, in arrival order,
                and :class:`Parked` returned; a release with :meth:`release_handing_off`
                then reserves the lock for the oldest parked id and returns its message to
                publish. A lock reserved for ``owner.task_id`` is taken over. Not on a
                cluster (the hand-off index is one key per prefix).
            reservation_ttl: with ``park``: seconds a reservation made by this call lives.
            token: the owner token to write (a fresh one by default); a quorum sends the
                same token to each of its servers (:mod:`.redlock`).

        Raises:
            AlreadyFinished: with ``unless_finished``, that record exists.
            LockBackendUnavailable: the server could not be reached or refused the write.
            LockNotOwnedError: the lock's key holds data this package did not write.
        """
        if not ttl > 0:
            raise ValueError(f"ttl must be a positive number of seconds, got {ttl!r}")
        if max_lifetime is not None and not max_lifetime > 0:
            raise ValueError(f"max_lifetime must be positive or None, got {max_lifetime!r}")
        owner = owner or Owner()
        if (unless_finished or take_queued or park is not None) and not owner.task_id:
            raise ValueError("unless_finished, take_queued and park need an owner with a task_id")
        keys = self.keys(name)
        token = token or new_token()
        renewer = self.renewer
        sent_at = renewer.clock()
        script = self._acquire
        if park is None:
            script_keys, args = self._acquire_call(
                keys, ttl, token, owner, fencing, unless_finished, take_queued
            )
        else:
            script = self._acquire_or_park
            script_keys, args = self._park_call(
                keys, ttl, token, owner, fencing, unless_finished, park, reservation_ttl
            )
        acknowledged = None
        if min_replicas:
            reply, acknowledged = self._run_acknowledged(
                script, keys.lock, script_keys, args, min_replicas, replica_timeout
            )
        else:
            reply = self._run(script, keys.lock, script_keys, args, pinned=True)
        if type(reply) is list:
            return self._parked(keys, reply)
        if type(reply) is not int:
            text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
            pttl, _, fields = text.partition("|")
            holder = LockHolder.parse(keys.lock, fields, pttl)
            if holder is None:
                raise server_errors.not_a_lock(keys.lock)
            return holder
        if reply == -1:
            raise AlreadyFinished(
                f"task id {owner.task_id} already ran to the end under lock {keys.lock} "
                f"(recorded at {keys.finished(owner.task_id)}): nothing was taken",
                keys.lock,
                {"task_id": owner.task_id},
            )
        lease = Lease(
            locker=self,
            keys=keys,
            token=token,
            ttl=ttl,
            owner=owner,
            fence=reply or None,
            confirmed_at=sent_at,
            deadline=None if max_lifetime is None else sent_at + max_lifetime,
        )
        if acknowledged is not None and acknowledged < min_replicas:
            self.release(lease)
            raise ReplicasUnavailable(
                f"lock {keys.lock} was written, but only {acknowledged} of {min_replicas} "
                f"replica(s) acknowledged it within {replica_timeout}s; released it again",
                keys.lock,
            )
        if on_lost is not None:
            lease.on_lost(on_lost)
        if renew:
            renewer.add(lease)
        log_acquire.debug("acquired %s (fence=%s)", keys.lock, lease.fence)
        return lease

    def _acquire_call(
        self,
        keys: LockKeys,
        ttl: float,
        token: str,
        owner: Owner,
        fencing: bool,
        unless_finished: bool,
        take_queued: bool = False,
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of the acquire script (see its contract in :mod:`.scripts`)."""
        # The value with an empty fence; the script fills the fence in when fencing.
        value = f"{token}||{int(self.wall_clock() * 1000)}|{owner.fields}"
        if not (fencing or unless_finished or take_queued):
            return [keys.lock], [_ms(ttl), value]
        script_keys = [keys.lock, keys.fence]
        if unless_finished:
            script_keys.append(keys.finished(owner.task_id))
        args: list[Any] = [_ms(ttl), value, "1" if fencing else "0"]
        if take_queued:
            script_keys.append(keys.queued)
            args.append(owner.task_id)
        return script_keys, args

    def _park_call(
        self,
        keys: LockKeys,
        ttl: float,
        token: str,
        owner: Owner,
        fencing: bool,
        unless_finished: bool,
        message: bytes,
        reservation_ttl: float,
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of ACQUIRE_OR_PARK (see its contract in :mod:`.scripts`)."""
        if self.cluster:
            raise LockConfigurationError(
                f"parking duplicates (on_duplicate='queue') is not supported on Redis Cluster: "
                f"its hand-off index is one key for every lock ({keys.handoff_due})",
                keys.lock,
            )
        value = f"{token}||{int(self.wall_clock() * 1000)}|{owner.fields}"
        script_keys = [keys.lock, keys.fence, keys.parked, keys.parked_messages, keys.handoff_due]
        if unless_finished:
            script_keys.append(keys.finished(owner.task_id))
        args = [
            _ms(ttl),
            value,
            "1" if fencing else "0",
            owner.task_id,
            message,
            keys.name,
            _ms(reservation_ttl),
        ]
        return script_keys, args

    @staticmethod
    def _parked(keys: LockKeys, reply: list[Any]) -> Parked:
        fields, position, handed = reply
        holder = None
        if fields:
            pttl, _, rest = _lease.as_text(fields).partition("|")
            holder = LockHolder.parse(keys.lock, rest, pttl)
        return Parked(
            key=keys.lock,
            holder=holder,
            position=int(position),
            handed=None if handed is None else _as_bytes(handed),
        )

    # -- queued markers (enqueue deduplication) -------------------------------------------------

    def enqueue(
        self, name: str, task_id: str, ttl: float, *, resend: bool = False, running: bool = True
    ) -> Optional[str]:
        """Mark ``task_id`` as queued under the lock ``name``, unless another message is
        queued or an execution is running there; in one round trip.

        Returns None when the caller should publish ``task_id`` (the marker now holds it, for
        ``ttl`` seconds), or the task id already queued or running under ``name`` (nothing
        was written: publish nothing). ``resend``: the message is sent again under its own
        id (a retry): never reported as a duplicate; the marker is written only if absent.
        ``running=False``: only a queued message is a duplicate, not a running execution.
        The acquire of ``task_id`` with ``take_queued`` deletes the marker.

        Raises:
            LockBackendUnavailable: the server could not be reached or refused the write.
        """
        if not task_id:
            raise ValueError("enqueue needs a task id")
        keys = self.keys(name)
        reply = self._run(
            self._enqueue,
            keys.lock,
            [keys.lock, keys.queued],
            [task_id, _ms(ttl), "1" if resend else ("0" if running else "2")],
        )
        return None if reply is None else _lease.as_text(reply)

    def clear_queued(self, name: str, task_id: Optional[str] = None) -> bool:
        """Delete the queued marker of the lock ``name``; with ``task_id``, only if it holds
        exactly that id (compare-and-delete). True if a marker was deleted.

        For a publish that failed, a revoked message, or a purged queue (otherwise the
        marker expires after its TTL).
        """
        keys = self.keys(name)
        args = [task_id] if task_id else []
        return bool(self._run(self._clear_queued, keys.queued, [keys.queued], args))

    def queued_for(self, name: str) -> Optional[float]:
        """Seconds the queued marker of the lock ``name`` still lives; None without one."""
        key = self.keys(name).queued
        pttl = server_errors.call(lambda: self.client.pttl(key), key)
        return None if pttl < 0 else pttl / 1000.0

    def queued(self, name: str) -> Optional[str]:
        """The task id queued under the lock ``name`` (its marker), or None."""
        keys = self.keys(name)
        value = server_errors.call(lambda: self.client.get(keys.queued), keys.queued)
        return None if value is None else _lease.as_text(value)

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
        script_keys = [lease.key]
        args: list[Any] = [lease.token, lease.keys.channel]
        if remember_for is not None and lease.owner.task_id:
            script_keys.append(lease.keys.finished(lease.owner.task_id))
            args.append(_ms(remember_for))
        return bool(self._release_with(lease, self._release, script_keys, args))

    def release_handing_off(
        self, lease: Lease, *, reservation_ttl: float, remember_for: Optional[float] = None
    ) -> tuple[bool, Optional[bytes]]:
        """Release ``lease`` as :meth:`release` does, and in the same round trip reserve the
        lock for ``reservation_ttl`` seconds for the oldest task id parked behind it (see
        ``park`` in :meth:`try_acquire`).

        Returns whether the lock was still ours, and the parked message the caller must now
        publish (None when nothing is parked, or the lock was not ours). A message that is
        never published is not lost: when the reservation runs out, a sweeper
        (:meth:`hand_off_if_free`) reserves the lock for the same task id again.
        """
        keys = lease.keys
        script_keys = [lease.key, keys.parked, keys.parked_messages, keys.handoff_due]
        args: list[Any] = [lease.token, keys.channel, keys.name, _ms(reservation_ttl)]
        if remember_for is not None and lease.owner.task_id:
            script_keys.append(keys.finished(lease.owner.task_id))
            args.append(_ms(remember_for))
        reply = self._release_with(lease, self._release_and_hand_off, script_keys, args)
        if isinstance(reply, (bytes, str)):
            return True, _as_bytes(reply)
        return bool(reply), None

    def _release_with(
        self, lease: Lease, script: Script, script_keys: list[str], args: list[Any]
    ) -> Any:
        """Run a release ``script`` for ``lease`` once (its reply), or return 0 without a
        round trip for a lease already released or inherited from the parent process."""
        if lease.pid != os.getpid():  # inherited from the parent: never touched here
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

    # -- hand-off sweeping -------------------------------------------------------------------

    def hand_off_due(self, limit: int = 100) -> list[str]:
        """Names of the locks with parked task ids whose holder's TTL or reservation has run
        out by the server's clock (at most ``limit``): a sweeper looks at each with
        :meth:`hand_off_if_free`."""
        key = handoff_index(self.prefix)
        return [_lease.as_text(name) for name in self._run(self._handoff_due, key, [key], [limit])]

    def hand_off_if_free(self, name: str, *, reservation_ttl: float) -> Optional[bytes]:
        """If the lock ``name`` is free and task ids are parked behind it, reserve it for the
        oldest for ``reservation_ttl`` seconds and return its message, to publish; else None
        (a held lock is looked at again when its TTL runs out)."""
        keys = self.keys(name)
        reply = self._run(
            self._release_and_hand_off,
            keys.lock,
            [keys.lock, keys.parked, keys.parked_messages, keys.handoff_due],
            ["", keys.channel, keys.name, _ms(reservation_ttl)],
        )
        return _as_bytes(reply) if isinstance(reply, (bytes, str)) else None

    def drop_parked(self, name: str, task_id: str, *, reservation_ttl: float) -> Union[bool, bytes]:
        """Take ``task_id`` out of the calls parked behind the lock ``name`` for good (its
        message was revoked, expired, or cannot be read), and, if the lock was reserved for
        it, reserve it for the next parked id for ``reservation_ttl`` seconds at once.

        Returns that next id's message, to publish; else True if ``task_id`` was parked or
        reserved for (now dropped), False if it was neither. A lock held by ``task_id``
        itself is never touched.
        """
        keys = self.keys(name)
        reply = self._run(
            self._drop_parked,
            keys.lock,
            [keys.lock, keys.parked, keys.parked_messages, keys.handoff_due],
            [task_id, keys.name, _ms(reservation_ttl)],
        )
        return _as_bytes(reply) if isinstance(reply, (bytes, str)) else bool(reply)

    def hand_off_soon(self, name: str) -> int:
        """After the lock ``name`` was released without a hand-off (by hand, or by a plain
        release): how many task ids are parked behind it; if any, the name is made due in
        the hand-off index now, so a sweeper hands the lock on at its next tick instead of
        at the old holder's TTL."""
        keys = self.keys(name)
        parked = int(server_errors.call(lambda: self.client.llen(keys.parked), keys.parked))
        if parked:
            index = keys.handoff_due
            server_errors.call(lambda: self.client.zadd(index, {keys.name: 0}), index)
        return parked

    def release_abandoned(self, name: str, *, task_id: str, host: str, pid: int) -> bool:
        """Release the lock ``name`` if it is held by that (dead) execution; True if released.

        For a supervisor whose child died holding a lock: it cannot know the child's token,
        so the owner metadata stands in for it. Callers must first make sure that ``pid`` on
        ``host`` is really gone.
        """
        keys = self.keys(name)
        owner = Owner(task_id=task_id, host=host, pid=pid)
        return bool(
            self._run(self._release_abandoned, keys.lock, [keys.lock], [owner.fields, keys.channel])
        )

    def release_all(self) -> int:
        """Release every lease this process still holds through this locker; returns how
        many were released here.

        At shutdown: a plain release, without a hand-off (no message is sent from a process
        on its way out), but a lock with task ids parked behind it is made due in the
        hand-off index (:meth:`hand_off_soon`), so a sweeper hands it on at its next tick
        rather than at the old holder's TTL.
        """
        released = 0
        for lease in self.renewer.leases():
            if lease.locker is self and lease.held:
                try:
                    if self.release(lease):
                        released += 1
                        if not self.cluster:  # nothing is parked on a cluster
                            self.hand_off_soon(lease.keys.name)
                except LockError as exc:
                    log_release.error("could not release %s: %s", lease.key, exc)
        return released

    # -- renew --------------------------------------------------------------------------------

    def renew_batch(self, leases: Sequence[Lease], *, now: float) -> list[int]:
        """Renew ``leases`` in one round trip; return the indices of the leases NOT renewed.

        Each TTL is replaced (never extended past ``ttl`` from now), and capped at the lease's
        deadline so renewal never outlives its maximum lifetime. One script call whatever the
        number of leases: the keys, the first lease's TTL as the default, the tokens back to
        back in one argument, then (index, TTL) pairs for the leases whose TTL differs. On a
        cluster: one call per lease (its key, its TTL, its token), one round trip per node.
        """
        if not leases:
            return []
        ttls = [
            lease.ttl_ms if lease.deadline is None else _ms(min(lease.ttl, lease.deadline - now))
            for lease in leases
        ]
        if self.cluster:
            return self._run_each(
                self._renew,
                [([lease.key], [ttl_ms, lease.token]) for lease, ttl_ms in zip(leases, ttls)],
            )
        default_ms = leases[0].ttl_ms
        args: list[Any] = [default_ms, "".join(lease.token for lease in leases)]
        for index, ttl_ms in enumerate(ttls):
            if ttl_ms != default_ms:
                args += (index + 1, ttl_ms)
        keys = [lease.key for lease in leases]
        lost = self._run(self._renew, keys[0], keys, args)
        return [int(index) - 1 for index in lost]

    def renew_by_owner(self, held: Sequence[tuple[str, Owner, float]]) -> list[int]:
        """Renew, in one round trip, each lock ``name`` whose value names exactly ``owner``,
        for ``ttl`` seconds; return the indices (into ``held``) of the locks NOT renewed.

        ``held`` is ``(name, owner, ttl)`` per lock. For a supervisor keeping alive the locks
        of its children without knowing their tokens (a child whose body holds the GIL cannot
        renew its own lease). A lock that is gone (released, expired) or held by any other
        owner is left untouched; none is ever created. Each TTL is replaced, never added to.
        """
        if not held:
            return []
        keys = [self.keys(name).lock for name, _, _ in held]
        if self.cluster:  # one call per key (one slot each)
            return self._run_each(
                self._renew_by_owner,
                [([key], [owner.fields, _ms(ttl)]) for key, (_, owner, ttl) in zip(keys, held)],
            )
        args = [owner.fields for _, owner, _ in held] + [_ms(ttl) for _, _, ttl in held]
        lost = self._run(self._renew_by_owner, keys[0], keys, args)
        return [int(index) - 1 for index in lost]

    # -- plumbing -----------------------------------------------------------------------------

    def _run_acknowledged(
        self,
        script: Script,
        key: str,
        keys: list[str],
        args: list[Any],
        replicas: int,
        timeout: float,
    ) -> tuple[Any, int]:
        """``script``, then ``WAIT replicas timeout``, sent together on one kept connection
        (``WAIT`` counts the replicas that acknowledged that connection's writes): the script's
        reply and how many replicas acknowledged it."""
        if self.connections is None:
            raise LockConfigurationError(
                f"min_replicas ({replicas}) is not supported on Redis Cluster: WAIT must follow "
                "the acquire on one connection; set lock_min_replicas to 0 there",
                key,
            )
        command = ("EVALSHA", script.sha, len(keys), *keys, *args)
        wait = ("WAIT", replicas, _ms(timeout))
        for _ in range(2):
            reply, acknowledged = server_errors.call(
                partial(self.connections.call_many, command, wait), key
            )
            if isinstance(reply, NoScriptError):  # loaded as redis-py's Script would load it
                script.sha = server_errors.call(lambda: self.client.script_load(script.script), key)
                command = ("EVALSHA", script.sha, *command[2:])
                continue
            if isinstance(reply, RedisError):
                raise server_errors.translate(reply, key)
            return reply, int(acknowledged)
        raise LockBackendUnavailable(f"script for {key} kept disappearing (NOSCRIPT)", key)

    def _run(
        self, script: Script, key: str, keys: list[str], args: list[Any], *, pinned: bool = False
    ) -> Any:
        """Run ``script`` (EVALSHA, loading it on NOSCRIPT), on the kept connections when
        ``pinned``; redis-py's errors said as ``LockError`` about ``key``."""
        client: Any = self._pinned if pinned else self.client
        return server_errors.call(lambda: script(keys=keys, args=args, client=client), key)

    def _run_each(self, script: Script, calls: list[tuple[list[str], list[Any]]]) -> list[int]:
        """Run ``script`` once per ``(keys, args)`` of ``calls`` in one cluster pipeline (one
        round trip per node); return the indices of the calls whose reply names a key NOT
        renewed (a non-empty list, as the renew scripts return for a lost key).

        redis-py's cluster pipeline refuses ``evalsha()`` and does not load scripts: the
        EVALSHA commands are sent as they are and, when a node does not know the script (a
        promoted replica, a restarted node), it is loaded on every primary and the pipeline
        sent once more (every renew script only replaces TTLs: sending it again is harmless).
        Each command names the node of its key from the client's slot map: without it,
        redis-py 8 asks a server for the keys of every EVALSHA in a pipeline (``COMMAND
        GETKEYS``, one round trip each). A command sent to a node that lost the slot is
        redirected (MOVED) by redis-py as any other.
        """
        client: Any = self.client

        def send() -> list[Any]:
            pipe = client.pipeline(transaction=False)
            for keys, args in calls:
                node = client.get_node_from_key(keys[0])
                pipe.execute_command(
                    "EVALSHA", script.sha, len(keys), *keys, *args, target_nodes=node
                )
            return pipe.execute(raise_on_error=False)  # type: ignore[no-any-return]

        def run() -> list[Any]:
            replies = send()
            if any(isinstance(reply, NoScriptError) for reply in replies):
                script.sha = client.script_load(script.script)
                replies = send()
            for reply, (keys, _) in zip(replies, calls):
                if isinstance(reply, Exception):
                    raise server_errors.translate(reply, keys[0])
            return replies

        replies = server_errors.call(run, calls[0][0][0])
        return [index for index, reply in enumerate(replies) if reply]
