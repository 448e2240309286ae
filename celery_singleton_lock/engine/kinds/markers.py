"""Queued markers (``dedupe_on_enqueue``): the task id of the one message queued under a lock
name, written before it is published and taken by its acquire (``take_queued``, in the
mutex's ACQUIRE). Scripts: lua/enqueue.lua, lua/clear_queued.lua."""

from __future__ import annotations

from typing import Optional

from redis.commands.core import Script

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer, _ms
from celery_singleton_lock.engine.server_leases import Issuer


class Markers:
    """The queued markers on ``server``."""

    def __init__(self, server: RedisServer, issuer: Issuer) -> None:
        self.server = server
        self.issuer = issuer
        self._enqueue: Script = server.register(source("enqueue"))
        self._clear_queued: Script = server.register(source("clear_queued"))

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
        keys = self.issuer.keys(name)
        reply = self.server.run(
            self._enqueue,
            keys.lock,
            [keys.lock, keys.queued, *self.issuer.marker_keys],
            [task_id, _ms(ttl), "1" if resend else ("0" if running else "2")],
        )
        return None if reply is None else _lease.as_text(reply)

    def clear_queued(self, name: str, task_id: Optional[str] = None) -> bool:
        """Delete the queued marker of the lock ``name``; with ``task_id``, only if it holds
        exactly that id (compare-and-delete). True if a marker was deleted.

        For a publish that failed, a revoked message, or a purged queue (otherwise the
        marker expires after its TTL).
        """
        keys = self.issuer.keys(name)
        args = [task_id] if task_id else []
        script_keys = [keys.queued, *self.issuer.marker_keys]
        return bool(self.server.run(self._clear_queued, keys.queued, script_keys, args))

    def queued_for(self, name: str) -> Optional[float]:
        """Seconds the queued marker of the lock ``name`` still lives; None without one."""
        key = self.issuer.keys(name).queued
        pttl = server_errors.call(lambda: self.server.client.pttl(key), key)
        return None if pttl < 0 else pttl / 1000.0

    def queued(self, name: str) -> Optional[str]:
        """The task id queued under the lock ``name`` (its marker), or None."""
        keys = self.issuer.keys(name)
        value = server_errors.call(lambda: self.server.client.get(keys.queued), keys.queued)
        return None if value is None else _lease.as_text(value)
