"""A cooldown after each run (``lock_cooldown``): the release that leaves the key taken for a
while (its script, and why it is so, in :mod:`..cooldown`)."""

from __future__ import annotations

from typing import Any, Optional

from redis.commands.core import Script

from celery_singleton_lock.engine.cooldown import RELEASE_INTO_COOLDOWN
from celery_singleton_lock.engine.lease import Lease
from celery_singleton_lock.engine.redis_server import RedisServer
from celery_singleton_lock.engine.releases import Releases


class Cooldown:
    """The cooldown release on ``server``."""

    def __init__(self, server: RedisServer, releases: Releases) -> None:
        self.releases = releases
        self._release_cooling: Script = server.register(RELEASE_INTO_COOLDOWN)

    def release_cooling(
        self, lease: Lease, cooldown: float, *, remember_for: Optional[float] = None
    ) -> bool:
        """Release ``lease`` (as ``release`` does, ``remember_for`` too), leaving its key taken
        for ``cooldown`` seconds: True if it was still ours (its cooldown then began), False
        if not (nothing changed)."""
        args: list[Any] = [lease.token, max(1, int(cooldown * 1000))]
        return bool(
            self.releases.release_with(
                lease, self._release_cooling, [lease.key], args, remember_for
            )
        )
