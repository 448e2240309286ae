"""The mutex: one holder per lock name, with fencing, finish records and the take of a queued
marker, in one round trip (lua/acquire.lua). Latest wins (:mod:`.latest`) waits behind it: it
sends its own script in the same round trip and reads its own reply when the call waits
(:class:`MutexQueue`). Policy ``queue`` parks behind the lock's slots (:mod:`.slot_queue`: a
mutex is the lock with one slot).

Its acquire prepared once for a task's calls (:class:`PackedMutex`, the hot path of a plain
lock; see :mod:`.acquire_request`): on one Redis server (or a Sentinel group's primary) with kept
connections, for a mutex (no slots, rate, parking, latest wins or replica acknowledgements), the
ACQUIRE script's ``EVALSHA`` is packed from parts packed once (its TTL, flags, the script's
SHA), sent on a kept connection, and its reply made into a lease. The same script, keys,
arguments and round trip as ``backend.acquire``; measured with ``python -m bench fastpath``,
see docs/explanation/benchmarks.md.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Protocol

from redis.commands.core import Script
from redis.exceptions import NoScriptError

from celery_singleton_lock.engine import redis_server, server_errors
from celery_singleton_lock.engine.acquire_request import (
    AcquireOutcome,
    AcquireRequest,
    AcquireResult,
    check_call,
)
from celery_singleton_lock.engine.keys import LockKeys
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
from celery_singleton_lock.engine.server_leases import Issuer
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
        issuer = self.issuer
        held = issuer.held_keys
        # the live rule (a pause) is read in the same call: a cluster, which keeps no held
        # index, names the rule's copy in the lock's slot instead (lua/acquire.lua's contract)
        rule = [issuer.shared.rule_of(request.cap_key, keys.lock)] if request.cap_key else []
        if not (fencing or unless_finished or take_queued):
            if held or not rule:
                return [keys.lock, *held, *rule], [_ms(request.ttl), value]
            return [keys.lock, *rule], [_ms(request.ttl), value, "1"]
        counter, finished = issuer.shared.of(keys.lock, owner.task_id)
        script_keys = [keys.lock, counter, finished, keys.queued, *held, *issuer.marker_keys]
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


class PackedMutex:
    """The mutex acquire on one Redis server, its constant parts packed once (see the module
    docstring). Made by ``RedisLocker.prepare`` for a request it can serve this way."""

    def __init__(self, mutex: Mutex, request: AcquireRequest) -> None:
        connections = mutex.server.connections
        assert connections is not None and connections.keeps_connections
        self.request = request
        self._mutex = mutex
        self._server = mutex.server
        self._issuer = mutex.issuer
        self._connections = connections
        self._renewer = mutex.issuer.renewer
        #: the short form of ACQUIRE (see its contract in lua/acquire.lua): KEYS lock [held
        #: rule], ARGV ttl and value; otherwise four to seven keys and seven arguments
        self._plain = not (request.fencing or request.unless_finished or request.take_queued)
        self._encoding = connections.encoding
        #: the start of the short form's command for the script's SHA (see acquire)
        self._sha, self._head = "", b""
        #: the short form's numkeys and TTL (ARGV[1], in ms as _ms makes it), packed once
        held = mutex.issuer.held_keys
        #: the task's live rule (a pause), read in the same call: KEYS[3], only beside the
        #: held index KEYS[2] (one server; neither on a cluster: see lua/acquire.lua)
        rule = [request.cap_key] if request.cap_key and held else []
        self._numkeys = connections.parts(1 + len(held) + len(rule))
        self._ttl = connections.parts(_ms(request.ttl))
        #: the held index and the rule (packed once; b"" without them) and the command's length
        self._extra = connections.parts(*held, *rule) if held else b""
        self._parts = 4 + len(held) + len(rule)

    def acquire(
        self, name: str, owner: Owner, max_lifetime: Optional[float] = None
    ) -> AcquireOutcome:
        request = self.request
        if max_lifetime is not None or not self._plain:  # nothing to check otherwise
            check_call(request, owner, max_lifetime)
        issuer = self._issuer
        keys = LockKeys.build(issuer.prefix, name)
        token = new_token()
        sent_at = self._renewer.clock()
        # The value with an empty fence; the script fills the fence in when fencing.
        value = f"{token}||{int(issuer.wall_clock() * 1000)}|{owner.fields}"
        lock = keys.lock
        if self._plain:
            # EVALSHA sha numkeys lock [held rule] ttl value: all but lock and value packed once
            encoding, errors = self._encoding
            key_bytes = lock.encode(encoding, errors)
            value_bytes = value.encode(encoding, errors)
            body = b"%b$%d\r\n%b\r\n%b%b$%d\r\n%b\r\n" % (
                self._numkeys,
                len(key_bytes),
                key_bytes,
                self._extra,
                self._ttl,
                len(value_bytes),
                value_bytes,
            )
            script = self._mutex._acquire_script
            if script.sha != self._sha:  # first call, or the script was loaded again
                self._sha = script.sha
                start = self._connections.start("EVALSHA", script.sha)
                self._head = b"*%d\r\n%b" % (start[0] + self._parts, start[1])
            try:
                reply = self._connections.call_packed(self._head + body)
            except NoScriptError:  # the server lost it: loaded and sent again
                reply = self._server.evalsha_packed(script, lock, self._parts, body)
            except server_errors.REDIS_ERRORS as exc:
                server_errors.raise_translated(exc, lock)
        else:
            mutex = self._mutex
            script_keys, args = mutex._acquire_call(request, keys, value, owner)
            reply = self._server.run(mutex._acquire_script, lock, script_keys, args, pinned=True)
        if type(reply) is int and reply >= 0:  # taken (the reply is its fence, 0: none)
            fence = reply or None
            # renewed from now if the request asks (the lease registers itself)
            lease = issuer.lease(request, keys, token, owner, fence, sent_at, max_lifetime)
            if log_acquire.isEnabledFor(logging.DEBUG):  # one call, not two, when it is not
                log_acquire.debug("acquired %s (fence=%s)", lock, fence)
            return lease
        return self._mutex.outcome(keys, token, owner, reply, sent_at, request, max_lifetime)
