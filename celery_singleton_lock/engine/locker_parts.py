"""What :class:`~.locker.RedisLocker` lends the parts it is made of, declared once.

One server's backend is assembled from parts, one job each (:mod:`.releases`, :mod:`.queueing`,
:mod:`.latest`, :mod:`.cooldown`, :mod:`.server_renewal`), which call back into the locker: its
keys, its script runner, its release. :class:`LockerPart` declares those for the type checker
only (nothing exists at run time), so each part does not redeclare them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional

if TYPE_CHECKING:
    from redis.commands.core import Script

    from celery_singleton_lock.engine.keys import LockKeys
    from celery_singleton_lock.engine.lease import Lease
    from celery_singleton_lock.engine.reading import Client
    from celery_singleton_lock.engine.shared_keys import SharedKeys


class LockerPart:
    """A part of ``RedisLocker``: what the locker provides to it (see the module docstring)."""

    if TYPE_CHECKING:  # provided by RedisLocker
        client: Client
        prefix: str
        cluster: bool
        shared: SharedKeys
        wall_clock: Callable[[], float]

        def keys(self, name: str) -> LockKeys: ...

        def _release_with(
            self,
            lease: Lease,
            script: Script,
            script_keys: list[str],
            args: list[Any],
            remember_for: Optional[float] = None,
        ) -> Any: ...

        def _run(
            self,
            script: Script,
            key: str,
            keys: list[str],
            args: list[Any],
            *,
            pinned: bool = False,
        ) -> Any: ...

        def _run_each(
            self, script: Script, calls: list[tuple[list[str], list[Any]]]
        ) -> list[int]: ...
