"""Live caps (``celery locks limit``): the integer at a family's cap key (:func:`..keys.cap_key`),
read by lua/acquire_slot.lua and the slot queue's scripts. One server or Sentinel: the key has no
hash tag, so a Cluster has none."""

from __future__ import annotations

from typing import Optional

from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.lease import as_int
from celery_singleton_lock.engine.redis_server import RedisServer


class Caps:
    """The live caps on ``server``."""

    def __init__(self, server: RedisServer) -> None:
        self.server = server

    def cap(self, key: str) -> Optional[int]:
        """The live cap at ``key``, or None when none is set."""
        return as_int(server_errors.call(lambda: self.server.client.get(key), key))

    def set_cap(self, key: str, cap: Optional[int]) -> None:
        """Set the live cap at ``key`` to ``cap`` (None: remove it, the declared limit holds)."""
        client = self.server.client
        if cap is None:
            server_errors.call(lambda: client.delete(key), key)
        else:
            server_errors.call(lambda: client.set(key, cap), key)
