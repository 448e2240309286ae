"""Acquires prepared once for many calls: what every call asks is checked and packed once, and
a call adds only its lock name, owner and time limit.

A task's calls differ in those three fields only; the rest of their :class:`AcquireRequest`
(TTL, fencing, finish records, queued markers) is the task's. ``backend.prepare(request)``
checks that request once against the backend and returns a :class:`PreparedAcquire`, whose
``acquire(name, owner, max_lifetime)`` is the hot path of every call. Two implementations, side
by side, chosen by the backend:

* :class:`GeneralAcquire`: any backend, any request: ``backend.acquire`` of the request with
  the call's fields.
* :class:`PackedMutex`: one Redis server (or a Sentinel group's primary) with kept
  connections, a mutex (no slots, rate, parking, latest wins or replica acknowledgements):
  the ACQUIRE script's ``EVALSHA`` is packed from parts packed once (its TTL, flags, the
  script's SHA), sent on a kept connection, and its reply made into a lease. The same script,
  keys, arguments and round trip as ``backend.acquire``; measured with ``python -m bench
  fastpath``, see docs/explanation/benchmarks.md.
"""

from __future__ import annotations

import logging
from typing import Optional, Protocol

from redis.exceptions import NoScriptError

from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.acquire_request import AcquireOutcome, AcquireRequest
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.kinds.mutex import Mutex
from celery_singleton_lock.engine.lease import Owner, new_token
from celery_singleton_lock.engine.redis_server import _ms

log = logging.getLogger("celery_singleton_lock.acquire")


class PreparedAcquire(Protocol):
    """The acquire of one kind of call, checked once (``backend.prepare(request)``)."""

    #: the request every call starts from (its name, owner and time limit unset)
    request: AcquireRequest

    def acquire(
        self, name: str, owner: Owner, max_lifetime: Optional[float] = None
    ) -> AcquireOutcome:
        """Take the lock ``name`` for ``owner``, as ``backend.acquire(request)`` with those
        fields would (the same outcomes and errors)."""
        ...


def check_call(request: AcquireRequest, owner: Owner, max_lifetime: Optional[float]) -> None:
    """What ``backend.acquire`` checks of a call's own fields (the rest was checked once)."""
    if max_lifetime is not None and not max_lifetime > 0:
        raise ValueError(f"max_lifetime must be positive or None, got {max_lifetime!r}")
    if (request.unless_finished or request.take_queued or request.park is not None) and not (
        owner.task_id
    ):
        raise ValueError("unless_finished, take_queued and park need an owner with a task_id")


class Acquires(Protocol):
    """What :class:`GeneralAcquire` needs of a backend."""

    def acquire(self, request: AcquireRequest) -> AcquireOutcome: ...


class GeneralAcquire:
    """``backend.acquire`` of ``request`` with each call's name, owner and time limit."""

    def __init__(self, backend: Acquires, request: AcquireRequest) -> None:
        self.backend = backend
        self.request = request

    def acquire(
        self, name: str, owner: Owner, max_lifetime: Optional[float] = None
    ) -> AcquireOutcome:
        return self.backend.acquire(self.request.for_call(name, owner, max_lifetime))


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
            if log.isEnabledFor(logging.DEBUG):  # one call, not two, when it is not
                log.debug("acquired %s (fence=%s)", lock, fence)
            return lease
        return self._mutex.outcome(keys, token, owner, reply, sent_at, request, max_lifetime)
