"""Cancel flags (policy ``restart``): the newest call of a lock asks its running holder to
stop by flagging the holder's task id beside the lock; the holder's body and its worker's main
process read the flag. Script: lua/cancel_holder.lua.

The flag is also pushed: the script publishes the holder's task id on the lock's cancel
channel (:func:`cancel_channel`; a shard channel on a Redis Cluster), which the process running
the call listens to (:meth:`Cancels.watch`, :mod:`..cancel_watch`); the flag stays for a reader
that missed the message. The worker's main process reads the flags of its children's
restartable locks in one round trip per tick (its grace counts from there).
"""

from __future__ import annotations

from typing import Optional, Sequence

from redis.commands.core import Script

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.cancel_watch import CancelSignal, CancelWatch
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer, _ms
from celery_singleton_lock.engine.server_leases import Issuer

#: Seconds a cancel flag lives: it names one task id, so it only has to outlive that call's
#: run; a body that has not looked by then is no longer told (its worker's grace ended it).
CANCEL_FLAG_TTL = 3600.0


def cancel_key(keys: LockKeys) -> str:
    """Key of the lock's cancel flag (beside the lock, same hash tag)."""
    return f"{keys.lock}:cancel"


def cancel_channel(keys: LockKeys) -> str:
    """The lock's cancel channel, where the task id asked to stop is published (same hash
    tag as the lock: on a Cluster a shard channel of the lock's slot)."""
    return f"{keys.lock}:cancel-asked"


class Cancels:
    """The cancel flags on ``server``, and this process's watch of them."""

    def __init__(self, server: RedisServer, issuer: Issuer) -> None:
        self.server = server
        self.issuer = issuer
        self._cancel_holder: Script = server.register(source("cancel_holder"))
        # sharded pub/sub on a Cluster: the message stays in the lock's shard (Redis >= 7)
        self._publish = "SPUBLISH" if server.cluster else "PUBLISH"
        # made now (no connection or thread until a call is watched): the bodies of a threads
        # pool share it
        self._watch = CancelWatch(self.server.client, self.cancel_requested, sharded=server.cluster)

    def cancel_holder(self, name: str, by: str) -> Optional[str]:
        """Ask the running holder of the lock ``name`` to stop, for the call ``by`` (a task
        id, never flagged itself); in one round trip. Returns the holder's task id now
        flagged, or None when no running call holds the lock.

        Raises:
            LockBackendUnavailable: the server could not be reached.
        """
        keys = self.issuer.keys(name)
        script_keys = [keys.lock, cancel_key(keys)]
        args = [by, _ms(CANCEL_FLAG_TTL), cancel_channel(keys), self._publish]
        reply = self.server.run(self._cancel_holder, keys.lock, script_keys, args)
        return None if reply is None else _lease.as_text(reply)

    def watch(self, name: str, task_id: str) -> CancelSignal:
        """Listen, in this process, for the call ``task_id`` holding the lock ``name`` being
        asked to stop: the signal's ``asked`` turns True when it is (see
        :mod:`..cancel_watch`). No round trip: the subscription is sent, not waited for.
        :meth:`unwatch` it when the lock is released."""
        return self._watch.watch(name, cancel_channel(self.issuer.keys(name)), task_id)

    def unwatch(self, signal: CancelSignal) -> None:
        """Stop listening for ``signal``'s call."""
        self._watch.unwatch(signal)

    def close(self) -> None:
        """Stop this process's watch (the locker is closed)."""
        self._watch.close()

    @property
    def watching(self) -> CancelWatch:
        """This process's watch of the cancel channels."""
        return self._watch

    def cancel_requested(self, held: Sequence[tuple[str, str]]) -> list[bool]:
        """For each ``(lock name, task id)``: whether that call was asked to stop; one round
        trip for all (a pipeline of reads, which a Cluster splits by node).

        Raises:
            LockBackendUnavailable: the server could not be reached.
        """
        if not held:
            return []
        flags = [cancel_key(self.issuer.keys(name)) for name, _ in held]

        def read() -> list[object]:
            pipe = self.server.client.pipeline(transaction=False)
            for flag in flags:
                pipe.get(flag)
            return list(pipe.execute())

        values = server_errors.call(read, flags[0])
        return [
            value is not None and _lease.as_text(value) == task_id
            for value, (_, task_id) in zip(values, held)
        ]
