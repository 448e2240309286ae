"""A cooldown after each run (``lock_cooldown``): the release leaves the key taken for a while.

The release compares the owner's token, as a release does, then writes the key again with a
token and a pid no owner has, for the cooldown's length (lua/release_into_cooldown.lua): an
acquire finds it held (by the run that just ended, its remaining TTL the cooldown left), no
one can release or renew it, and it frees itself when the cooldown ends. The release is
published, as any release is: a waiter then reads the key again and sleeps for the cooldown
left (its end publishes nothing). A slot of a slot table (:mod:`..slots`) stays taken the
same way (lua/release_slot.lua).
"""

from __future__ import annotations

from typing import Any, Optional

from redis.commands.core import Script

from celery_singleton_lock.engine.lease import Lease
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer
from celery_singleton_lock.engine.server_leases import Releases


class Cooldown:
    """The cooldown release on ``server``."""

    def __init__(self, server: RedisServer, releases: Releases) -> None:
        self.releases = releases
        self._release_cooling: Script = server.register(source("release_into_cooldown"))

    def release_cooling(
        self, lease: Lease, cooldown: float, *, remember_for: Optional[float] = None
    ) -> bool:
        """Release ``lease`` (as ``release`` does, ``remember_for`` too), leaving its key taken
        for ``cooldown`` seconds: True if it was still ours (its cooldown then began), False
        if not (nothing changed)."""
        if lease.slot:  # a slot stays taken in its slot table (lua/release_slot.lua)
            return self.releases.release_slot(lease, max(1, int(cooldown * 1000)), remember_for)
        args: list[Any] = [lease.token, max(1, int(cooldown * 1000)), lease.keys.channel]
        script_keys = [lease.key, *self.releases.issuer.held_keys]
        return bool(
            self.releases.release_with(
                lease, self._release_cooling, script_keys, args, remember_for
            )
        )
