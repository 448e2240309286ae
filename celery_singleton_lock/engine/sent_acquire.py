"""The mutex acquire in two steps, as a part of :class:`~.locker.RedisLocker`: sent now, its
reply read later, so that the round trip overlaps whatever the caller does meanwhile.

A worker that has a message in hand and will run it at once (Celery's solo pool) sends the
acquire as it takes the message, and reads the reply when the task is about to start: the
round trip then passes while the worker decodes the message and prepares the run, instead of
being waited for. :meth:`SentAcquireOperations.send_acquire` keeps the kept connection it
sent on checked out until :meth:`~SentAcquireOperations.acquired` reads the reply (or
:meth:`~SentAcquireOperations.abandon` does, releasing what it took); nothing else can be
sent on it meanwhile. Only the plain mutex acquire (no slots, rate, parking, latest wins or
replica acknowledgement) is sent this way; :meth:`~.backend_base.BackendBase.acquire` is
the same request in one step.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from redis.exceptions import NoScriptError

from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.acquire_request import AcquireOutcome, AcquireRequest
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.lease import Lease, LockHolder, Owner, already_finished
from celery_singleton_lock.engine.locker_parts import LockerPart
from celery_singleton_lock.errors import AlreadySuperseded, LockError

if TYPE_CHECKING:
    from redis.commands.core import Script

    from celery_singleton_lock.engine.pinned import PinnedConnections
    from celery_singleton_lock.engine.renewer import Renewer

log = logging.getLogger("celery_singleton_lock.acquire")


class SentAcquire(NamedTuple):
    """An acquire sent and not read yet (see the module docstring)."""

    request: AcquireRequest
    owner: Owner
    keys: LockKeys
    token: str
    #: renewer-clock time just before it was sent
    sent_at: float
    #: the kept connection it was sent on (checked out until the reply is read)
    connection: Any
    script_keys: list[str]
    args: list[Any]


class SentAcquireOperations(LockerPart):
    """``send_acquire``, ``acquired`` and ``abandon`` of one server, and the reading of a mutex
    acquire's reply that the one-step acquire shares."""

    if TYPE_CHECKING:  # provided by RedisLocker
        connections: Optional[PinnedConnections]
        _acquire_script: Script

        @property
        def renewer(self) -> Renewer: ...

        def _prepare(
            self, request: AcquireRequest, owner: Owner
        ) -> tuple[LockKeys, str, float, str]: ...

        def _acquire_call(
            self, request: AcquireRequest, keys: LockKeys, value: str, owner: Owner
        ) -> tuple[list[str], list[Any]]: ...

        def _lease(
            self,
            request: AcquireRequest,
            keys: LockKeys,
            token: str,
            owner: Owner,
            fence: Optional[int],
            sent_at: float,
        ) -> Lease: ...

        @staticmethod
        def _hold(request: AcquireRequest, lease: Lease, renewer: Renewer) -> Lease: ...

        def release(self, lease: Lease, *, remember_for: Optional[float] = None) -> bool: ...

    def send_acquire(self, request: AcquireRequest) -> Optional[SentAcquire]:
        """Send the acquire of ``request`` without reading its reply (:meth:`acquired` reads
        it); None, having sent nothing, when this locker cannot (a cluster, no kept
        connections) or ``request`` is not a plain mutex acquire: acquire it in one step then.
        The request is taken as checked (the caller built it as it builds its one-step ones).
        """
        connections = self.connections
        if (
            connections is None
            or not connections.keeps_connections
            or request.limit != 1
            or request.rate is not None
            or request.park is not None
            or request.min_replicas
            or request.owner is None
        ):
            return None
        owner = request.owner
        keys, token, sent_at, value = self._prepare(request, owner)
        script_keys, args = self._acquire_call(request, keys, value, owner)
        script = self._acquire_script
        packed = connections.pack("EVALSHA", script.sha, len(script_keys), *script_keys, *args)
        connection = connections.send_holding(packed)
        if connection is None:
            return None
        return SentAcquire(request, owner, keys, token, sent_at, connection, script_keys, args)

    def acquired(self, sent: SentAcquire) -> AcquireOutcome:
        """The outcome of an acquire sent with :meth:`send_acquire`, as
        :meth:`~.backend_base.BackendBase.acquire` returns it (or raises)."""
        connections = self.connections
        assert connections is not None  # send_acquire sent it on one
        try:
            reply = connections.read_held(sent.connection)
        except NoScriptError:
            reply = self._run_again(sent)
        except server_errors.REDIS_ERRORS:
            # the connection was dropped: whether it was taken is unknown; the one-step
            # acquire, with its retries, answers (the same token: a lock it took is ours)
            reply = self._run_again(sent)
        return self._mutex_outcome(
            reply, sent.request, sent.keys, sent.token, sent.owner, sent.sent_at
        )

    def abandon(self, sent: SentAcquire) -> None:
        """Read the reply of an acquire whose caller will not run, and release what it took.
        Never raises: a lock it could not release frees itself within its TTL."""
        try:
            outcome = self.acquired(sent)
            if isinstance(outcome, Lease):
                self.release(outcome)
        except (LockError, OSError) as exc:
            log.warning("an acquire sent early for %s was abandoned: %s", sent.keys.lock, exc)

    def _run_again(self, sent: SentAcquire) -> Any:
        run: Any = self._run
        return run(self._acquire_script, sent.keys.lock, sent.script_keys, sent.args, pinned=True)

    def _mutex_outcome(
        self,
        reply: Any,
        request: AcquireRequest,
        keys: LockKeys,
        token: str,
        owner: Owner,
        sent_at: float,
    ) -> AcquireOutcome:
        """What the ACQUIRE script's ``reply`` means: a lease (renewed as ``request`` asks),
        the holder, or the error of a finished or superseded call."""
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
        return self._hold(request, lease, self.renewer)
