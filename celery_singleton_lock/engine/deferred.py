"""The release whose reply is read later, as a part of :class:`~.locker.RedisLocker`.

The release script is sent on a kept connection (:mod:`.pinned`) without waiting: its reply is
read with the next command on that connection (normally the next task's acquire), by the
renewer within a second when none follows, or when the locker is closed, and the caller's
``then`` reports it then. Saves the release's wait (~100 us per task, see
docs/explanation/benchmarks.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

from redis.commands.core import Script

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import script_calls, server_errors
from celery_singleton_lock.engine.fork_safety import current_pid
from celery_singleton_lock.engine.lease import Lease
from celery_singleton_lock.engine.pinned import PinnedConnections
from celery_singleton_lock.errors import LockError

if TYPE_CHECKING:
    from celery_singleton_lock.engine.renewer import Renewer


class DeferredRelease:
    """``release_later`` and ``settle`` of one server (a part of ``RedisLocker``, ahead of
    ``BackendBase`` in its bases: the base's versions defer nothing)."""

    if TYPE_CHECKING:  # provided by RedisLocker
        connections: Optional[PinnedConnections]
        _release: Script

        @property
        def renewer(self) -> Renewer: ...

        def _release_call(
            self, lease: Lease, remember_for: Optional[float]
        ) -> tuple[list[str], list[Any]]: ...

    def release_later(
        self,
        lease: Lease,
        then: Callable[[Optional[bool], Optional[LockError]], None],
        *,
        remember_for: Optional[float] = None,
    ) -> bool:
        """Send the release of ``lease`` (as :meth:`release`) without waiting for its reply;
        ``then(released, None)``, or ``then(None, error)``, once the reply is read: before the
        next command on that kept connection, at the renewer's next tick (within a second),
        or when the locker is closed. Saves the release's wait (~100 us per task).

        Returns False, having sent nothing, when this locker cannot defer (a cluster, a
        ``BlockingConnectionPool``, or the send failed): call :meth:`release` then.
        """
        connections = self.connections
        if connections is None or not connections.keeps_connections:
            return False
        if lease.pid != current_pid():  # inherited from the parent: never touched here
            then(False, None)
            return True
        with _lease._state_lock:
            if lease.released:
                then(False, None)
                return True
            lease.released = True  # from here a failed renewal is not reported as a loss
        script_keys, args = self._release_call(lease, remember_for)
        script = self._release

        def settle(reply: Any, error: Optional[BaseException]) -> None:
            if error is None:
                then(bool(reply), None)
                return
            translated = server_errors.translate(error, lease.key)  # type: ignore[arg-type]
            then(None, translated if isinstance(translated, LockError) else LockError(str(error)))

        self.renewer.discard(lease)
        # EVAL, not EVALSHA: a server that lost its scripts (restart, failover) must still
        # release now; a NOSCRIPT read later would leave the lock held until then.
        start = connections.start("EVAL", script_calls.compact(script.script))
        command = connections.pack(len(script_keys), *script_keys, *args, start=start)
        if not connections.send_later(command, settle):
            lease.released = False
            return False
        self.renewer.settle_soon(self)
        return True

    def settle(self) -> None:
        """Read the replies of releases sent with :meth:`release_later` and still owed by an
        idle kept connection (their ``then`` is called here)."""
        if self.connections is not None:
            self.connections.settle_idle()
