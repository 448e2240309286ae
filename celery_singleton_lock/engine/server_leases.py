"""The leases of one server, handed out and taken back: :class:`Issuer` (what every kind of lock on
the server shares: the names of its keys, and the leases it hands out, each referring to the
backend that releases and renews it) and :class:`Releases`, the releases of leases of every kind
(each releases through :meth:`Releases.release_with`): waited (:meth:`Releases.release`), or sent
now with the reply read later (:meth:`Releases.release_later`), and a dead owner's lock released by
its owner's name.

A deferred release script is sent on a kept connection (:class:`.redis_server.PinnedConnections`)
without waiting: its reply is read with the next command on that connection (normally the next
task's acquire), by the renewer when none followed within :data:`.renewer.SETTLE_WITHIN` (an idle
worker), or when the locker is closed, and the caller's ``then`` reports it then. Saves the
release's wait (~100 us per task, see docs/explanation/benchmarks.md).
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Optional

from redis.commands.core import Script

from celery_singleton_lock.engine import fork_safety, redis_server, server_errors
from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine.acquire_request import AcquireRequest
from celery_singleton_lock.engine.keys import LockKeys, SharedKeys
from celery_singleton_lock.engine.lease import Lease, LeaseKeeper, Owner
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer, _ms
from celery_singleton_lock.engine.renewer import Renewer
from celery_singleton_lock.errors import LockError


class Issuer:
    """Key names under ``prefix`` and the leases of ``keeper``: what every kind of lock on one
    server shares (see the module docstring)."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        prefix: str,
        shared: SharedKeys,
        renewer: Renewer,
        wall_clock: Callable[[], float],
        held: Optional[str] = None,
        markers: Optional[str] = None,
    ) -> None:
        self.keeper = keeper
        #: the held index key (keys.held_index) every script that takes, renews or releases a
        #: lock writes; None on a Redis Cluster, where no lock's script may write it
        self.held = held
        #: ``[held]``, or ``[]`` without it: the KEYS scripts append (see their contracts)
        self.held_keys: list[str] = [] if held is None else [held]
        #: ``[marker index]`` (keys.marker_index), or ``[]`` on a Redis Cluster
        self.marker_keys: list[str] = [] if markers is None else [markers]
        self.prefix = prefix
        self.shared = shared
        self.renewer = renewer
        self.wall_clock = wall_clock

    def keys(self, name: str) -> LockKeys:
        """Key names of the lock called ``name`` under this prefix."""
        return LockKeys.build(self.prefix, name)

    def lease(
        self,
        request: AcquireRequest,
        keys: LockKeys,
        token: str,
        owner: Owner,
        fence: Optional[int],
        sent_at: float,
        max_lifetime: Optional[float] = None,
        slot: int = 0,
    ) -> Lease:
        """The lease an acquire took, renewed from now if ``request`` asks; ``max_lifetime``:
        the call's, else the request's; ``slot``: the slot of the lock's slot table it holds
        (0: the lock key)."""
        if max_lifetime is None:
            max_lifetime = request.max_lifetime
        return Lease(
            locker=self.keeper,
            keys=keys,
            token=token,
            ttl=request.ttl,
            owner=owner,
            fence=fence,
            confirmed_at=sent_at,
            deadline=None if max_lifetime is None else sent_at + max_lifetime,
            on_lost=request.on_lost,
            renewer=self.renewer if request.renew else None,
            slot=slot,
        )


log_release = logging.getLogger("celery_singleton_lock.release")


class Releases:
    """The releases of leases on ``server``."""

    def __init__(self, server: RedisServer, issuer: Issuer) -> None:
        self.server = server
        self.issuer = issuer
        self._release: Script = server.register(source("release"))
        self._release_abandoned: Script = server.register(source("release_abandoned"))
        self._release_slot: Script = server.register(source("release_slot"))

    def _with_finish_record(
        self,
        lease: Lease,
        remember_for: Optional[float],
        script_keys: list[str],
        args: list[Any],
    ) -> tuple[list[str], list[Any]]:
        """``script_keys`` and ``args`` of a release script, with the KEYS and ARGV that record
        that ``lease``'s owner ran to the end, for ``remember_for`` seconds, appended when
        asked and the owner has a task id (see lua/release.lua)."""
        task_id = lease.owner.task_id
        if remember_for is None or not task_id:
            return script_keys, args
        return (
            [*script_keys, self.issuer.shared.of(lease.key, task_id)[1]],
            [*args, _ms(remember_for), task_id],
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
            LockBackendUnavailable: the server could not be reached; the lease is no longer
                ``held`` (nothing renews it, its key expires within its TTL) but keeps its
                token, so ``release`` may simply be called again.
        """
        script, script_keys, args = self._release_call(lease, remember_for)
        return bool(self.release_with(lease, script, script_keys, args))

    def _release_call(
        self, lease: Lease, remember_for: Optional[float]
    ) -> tuple[Script, list[str], list[Any]]:
        """The release script of ``lease`` with its KEYS and ARGV: lua/release.lua for a lock
        key, lua/release_slot.lua for a slot of a slot table (see their contracts)."""
        if lease.slot:
            script_keys, args = self.slot_release_call(lease, "")
            script_keys, args = self._with_finish_record(lease, remember_for, script_keys, args)
            return self._release_slot, script_keys, args
        script_keys, args = self._with_finish_record(
            lease,
            remember_for,
            [lease.key, *self.issuer.held_keys],
            [lease.token, lease.keys.channel],
        )
        return self._release, script_keys, args

    def slot_release_call(self, lease: Lease, cooldown_ms: Any) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of lua/release_slot.lua for the slot ``lease`` holds, into a cooldown
        of ``cooldown_ms`` ("" none), without the finish record."""
        script_keys = [*lease.keys.slot_table, *self.issuer.held_keys]
        return script_keys, [lease.token, lease.keys.channel, cooldown_ms]

    def release_slot(
        self, lease: Lease, cooldown_ms: Any, remember_for: Optional[float] = None
    ) -> bool:
        """Release the slot ``lease`` holds (into a cooldown of ``cooldown_ms``, "" none)."""
        script_keys, args = self.slot_release_call(lease, cooldown_ms)
        return bool(self.release_with(lease, self._release_slot, script_keys, args, remember_for))

    def release_with(
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
        # Lease.releasing, written out: the waited release adds no call to the mutex path.
        if lease.pid != fork_safety.pid:  # inherited from the parent: never touched here
            return 0
        with _lease._state_lock.lock:
            if lease.released:
                return 0
            lease.released = True  # from here a failed renewal is not reported as a loss
        renewer = lease.renewer
        if renewer is not None:
            renewer.discard(lease)
        try:
            released = self.server.run(script, lease.key, script_keys, args, pinned=True)
        except LockError:
            lease.not_released()
            raise
        if not released:  # the caller reports it (the Celery layer, naming the task)
            log_release.debug("released %s but it was no longer ours", lease.key)
        return released

    def release_abandoned(
        self, name: str, *, task_id: str, host: str, pid: int, slot: Optional[int] = None
    ) -> bool:
        """Release the lock ``name`` if it is held by that (dead) execution, as its lock key
        or as a slot of its slot table (``slot``: that slot only; None: the one it holds,
        found by its owner, :mod:`.slots`); True if released.

        For a supervisor whose child died holding a lock: it cannot know the child's token,
        so the owner metadata stands in for it. Callers must first make sure that ``pid`` on
        ``host`` is really gone.
        """
        keys = self.issuer.keys(name)
        owner = Owner(task_id=task_id, host=host, pid=pid)
        args = [owner.fields, keys.channel, "" if slot is None else slot]
        script_keys = [keys.lock, *keys.slot_table, *self.issuer.held_keys]
        return bool(self.server.run(self._release_abandoned, keys.lock, script_keys, args))

    # -- deferred ---------------------------------------------------------------------------

    def release_later(
        self,
        lease: Lease,
        then: Callable[[Optional[bool], Optional[LockError]], None],
        *,
        remember_for: Optional[float] = None,
    ) -> bool:
        """Send the release of ``lease`` (as :meth:`release`) without waiting for its reply;
        ``then(released, None)``, or ``then(None, error)``, once the reply is read: before the
        next command on that kept connection, by the renewer when no command followed within
        :data:`.renewer.SETTLE_WITHIN`, or when the locker is closed. Saves the release's
        wait (~100 us per task).

        Returns False, having sent nothing, when this locker cannot defer (a cluster, a
        ``BlockingConnectionPool``, or the send failed): call :meth:`release` then.
        """
        connections = self.server.connections
        if connections is None or not connections.keeps_connections:
            return False
        if lease.pid != fork_safety.pid:  # inherited from the parent: never touched here
            then(False, None)
            return True
        with _lease._state_lock.lock:
            released = lease.released
            lease.released = True  # from here a failed renewal is not reported as a loss
        if released:
            then(False, None)
            return True

        def settle(reply: Any, error: Optional[BaseException]) -> None:
            if error is None:
                then(bool(reply), None)
                return
            translated = server_errors.translate(error, lease.key)  # type: ignore[arg-type]
            then(None, translated if isinstance(translated, LockError) else LockError(str(error)))

        renewer = lease.renewer
        if renewer is not None:
            renewer.discard(lease)
        # EVAL, not EVALSHA: a server that lost its scripts (restart, failover) must still
        # release now; a NOSCRIPT read later would leave the lock held until then.
        held = self.issuer.held
        if lease.slot:
            script, script_keys, args = self._release_call(lease, remember_for)
            start = connections.start("EVAL", redis_server.compact(script.script))
            command = connections.pack(len(script_keys), *script_keys, *args, start=start)
        elif (remember_for is None or not lease.owner.task_id) and held is not None:
            start = connections.start("EVAL", redis_server.compact(self._release.script))
            # EVAL script 2 key held token channel: the script's start is packed once
            encoding, errors = connections.encoding
            key = lease.key.encode(encoding, errors)
            index = held.encode(encoding, errors)
            token = lease.token.encode(encoding, errors)
            channel = lease.keys.channel.encode(encoding, errors)
            command = b"*7\r\n%b$1\r\n2\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n$%d\r\n%b\r\n" % (
                start[1],
                len(key),
                key,
                len(index),
                index,
                len(token),
                token,
                len(channel),
                channel,
            )
        else:
            _, script_keys, args = self._release_call(lease, remember_for)
            start = connections.start("EVAL", redis_server.compact(self._release.script))
            command = connections.pack(len(script_keys), *script_keys, *args, start=start)
        if not connections.send_later(command, settle):
            lease.released = False
            return False
        self.issuer.renewer.settle_soon(connections)
        return True

    def settle(self) -> None:
        """Read the replies of releases sent with :meth:`release_later` and still owed by an
        idle kept connection (their ``then`` is called here)."""
        if self.server.connections is not None:
            self.server.connections.settle_idle()
