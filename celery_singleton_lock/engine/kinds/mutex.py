"""The mutex: one holder per lock name, with fencing, finish records and the take of a queued
marker, in one round trip (lua/acquire.lua). Latest wins (:mod:`.latest`) waits behind it: it
sends its own script in the same round trip and reads its own reply when the call waits
(:class:`MutexQueue`). Policy ``queue`` parks behind the lock's slots (:mod:`.slot_queue`: a
mutex is the lock with one slot).
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Protocol

from redis.commands.core import Script

from celery_singleton_lock.engine import redis_server, server_errors
from celery_singleton_lock.engine.acquire_request import (
    AcquireOutcome,
    AcquireRequest,
    AcquireResult,
)
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.kinds.issuer import Issuer
from celery_singleton_lock.engine.lease import (
    Lease,
    LockHolder,
    Owner,
    Parked,
    already_finished,
    new_token,
)
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import Acknowledged, RedisServer, _ms
from celery_singleton_lock.errors import AlreadySuperseded, ReplicasUnavailable

log_acquire = logging.getLogger("celery_singleton_lock.acquire")


def send(
    server: RedisServer,
    script: Script,
    keys: LockKeys,
    script_keys: list[str],
    args: list[Any],
    request: AcquireRequest,
) -> tuple[Any, Optional[int]]:
    """Send an acquire ``script`` on the lock's pinned connection: its reply, and with
    ``request.min_replicas`` how many replicas acknowledged the write (WAIT in the same
    round trip; None without)."""
    min_replicas = request.min_replicas
    if not min_replicas:
        return server.run(script, keys.lock, script_keys, args, pinned=True), None
    connections = server.connections
    assert connections is not None  # refused on a cluster by its capabilities
    sender: Any = Acknowledged(connections, min_replicas, request.replica_timeout)
    reply, acknowledged = redis_server.run(script, keys.lock, script_keys, args, sender)
    return reply, acknowledged


def confirm_replicas(lease: Lease, acknowledged: Optional[int], request: AcquireRequest) -> None:
    """Keep ``lease`` only if ``request.min_replicas`` replicas acknowledged it; else release
    it again and raise :class:`ReplicasUnavailable`."""
    if acknowledged is None or acknowledged >= request.min_replicas:
        return
    lease.release()
    raise ReplicasUnavailable(
        f"lock {lease.key} was written, but only {acknowledged} of {request.min_replicas} "
        f"replica(s) acknowledged it within {request.replica_timeout}s; released it again",
        lease.key,
    )


class MutexQueue(Protocol):
    """A queue behind the mutex: the script that takes the lock or parks the call, its KEYS
    and ARGV, and what its reply says when the call waits (a list)."""

    acquire_script: Script

    def acquire_call(
        self, request: AcquireRequest, keys: LockKeys, value: str, owner: Owner
    ) -> tuple[list[str], list[Any]]: ...

    def parked(self, keys: LockKeys, reply: list[Any]) -> Parked: ...


class Mutex:
    """The mutex acquire on ``server`` (see the module docstring)."""

    def __init__(self, server: RedisServer, issuer: Issuer) -> None:
        self.server = server
        self.issuer = issuer
        self._acquire_script: Script = server.register(source("acquire"))

    def acquire(
        self, request: AcquireRequest, owner: Owner, queue: Optional[MutexQueue] = None
    ) -> AcquireOutcome:
        """One round trip (the request was checked by the backend's ``acquire``); with
        ``queue``, the call waits in it when the lock is taken."""
        issuer = self.issuer
        keys = issuer.keys(request.name)
        token = request.token or new_token()
        sent_at = issuer.renewer.clock()
        # The value with an empty fence; the script fills the fence in when fencing.
        value = f"{token}||{int(issuer.wall_clock() * 1000)}|{owner.fields}"
        if queue is None:
            script = self._acquire_script
            script_keys, args = self._acquire_call(request, keys, value, owner)
        else:
            script = queue.acquire_script
            script_keys, args = queue.acquire_call(request, keys, value, owner)
        reply, acknowledged = send(self.server, script, keys, script_keys, args, request)
        if type(reply) is list and queue is not None:  # ACQUIRE's list: paused (outcome)
            return queue.parked(keys, reply)
        outcome = self.outcome(keys, token, owner, reply, sent_at, request)
        if type(outcome) is not Lease:
            return outcome
        confirm_replicas(outcome, acknowledged, request)
        log_acquire.debug("acquired %s (fence=%s)", outcome.key, outcome.fence)
        return outcome

    def outcome(
        self,
        keys: LockKeys,
        token: str,
        owner: Owner,
        reply: Any,
        sent_at: float,
        request: AcquireRequest,
        max_lifetime: Optional[float] = None,
    ) -> AcquireResult:
        """What the ACQUIRE script's ``reply`` (not a list) says: the lease taken, or the
        holder; raises for a finished or superseded task id."""
        if type(reply) is int:
            if reply >= 0:
                return self.issuer.lease(
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
        if type(reply) is list:  # {-3, ms}: the live rule pauses the name
            return LockHolder.paused_for(keys.lock, reply[1])
        text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
        pttl, _, fields = text.partition("|")
        holder = LockHolder.parse(keys.lock, fields, pttl)
        if holder is None:
            raise server_errors.not_a_lock(keys.lock)
        return holder

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
        held = self.issuer.held_keys
        # the live rule (a pause) is read in the same call, only beside the held index (one
        # server; neither on a cluster: see lua/acquire.lua's contract)
        rule = [request.cap_key] if request.cap_key and held else []
        if not (fencing or unless_finished or take_queued):
            return [keys.lock, *held, *rule], [_ms(request.ttl), value]
        counter, finished = self.issuer.shared.of(keys.lock, owner.task_id)
        script_keys = [keys.lock, counter, finished, keys.queued, *held, *self.issuer.marker_keys]
        script_keys += rule
        args: list[Any] = [
            _ms(request.ttl),
            value,
            "1" if fencing else "0",
            owner.task_id,
            "1" if unless_finished else "",
            ("2" if request.queued_while_held else "1") if take_queued else "0",
        ]
        return script_keys, args
