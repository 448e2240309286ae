""" "Latest wins" on one server (policy ``replace``, and ``lock_debounce``), as a part of
:class:`~.locker.RedisLocker`: at most one call waits behind a lock, the newest; a debounced
call is held until its due time. Scripts in :mod:`.latest_scripts`; the parked list, the
hand-off index and the sweeper are those of policy ``queue`` (:mod:`.queueing`).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, NamedTuple, Optional

from redis.commands.core import Script

from celery_singleton_lock.engine import latest_scripts
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.lease import Lease, Owner, Parked
from celery_singleton_lock.engine.locker_parts import LockerPart
from celery_singleton_lock.engine.queueing import QueueOperations, as_bytes, handed_on, park_call

if TYPE_CHECKING:
    from celery_singleton_lock.engine.acquire_request import AcquireRequest
    from celery_singleton_lock.engine.reading import Client


class Latest(NamedTuple):
    """How an acquire with ``park`` waits when the newest call wins (``AcquireRequest.latest``).

    ``debounce``: seconds a call is held before it may run, even on a free lock; a newer call
    within them takes its place and starts them again (0: none, the lock is taken when free).
    ``debounce_max``: seconds from a burst's first call after which the waiting call is due
    however many newer ones came (None: no bound).
    """

    debounce: float = 0.0
    debounce_max: Optional[float] = None


def _ms(seconds: Optional[float]) -> int:
    return 0 if not seconds else max(1, int(seconds * 1000))


def debounce_key(keys: LockKeys) -> str:
    """Key of the lock's debounce hash (see :mod:`.latest_scripts`)."""
    return f"{keys.lock}:latest"


class LatestOperations(LockerPart):
    """The newest waiting call wins, on one server (a part of ``RedisLocker``)."""

    def _register_latest_scripts(self, client: Client) -> None:
        self._acquire_or_replace: Script = client.register_script(latest_scripts.ACQUIRE_OR_REPLACE)
        self._release_latest: Script = client.register_script(latest_scripts.RELEASE_LATEST)

    def _replace_call(
        self, request: AcquireRequest, latest: Latest, keys: LockKeys, value: str, owner: Owner
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of ACQUIRE_OR_REPLACE (its contract in :mod:`.latest_scripts`): those
        of ACQUIRE_OR_PARK with the debounce's."""
        return park_call(
            self,
            request,
            keys,
            value,
            owner,
            latest_keys=[debounce_key(keys)],
            latest_args=[_ms(latest.debounce), _ms(latest.debounce_max)],
        )

    @staticmethod
    def _waiting(keys: LockKeys, reply: list[Any]) -> Parked:
        """The reply of ACQUIRE_OR_REPLACE when the call waits, as :class:`Parked`."""
        fields, position, displaced = reply
        parked = QueueOperations._parked(keys, [fields, position, None])
        return dataclasses.replace(
            parked, displaced=tuple(as_bytes(message) for message in displaced)
        )

    def release_latest(
        self, lease: Lease, *, reservation_ttl: float, remember_for: Optional[float] = None
    ) -> tuple[bool, Optional[bytes]]:
        """Release ``lease`` and, in the same round trip, reserve the lock for the call that
        waits behind it, unless its debounce runs on (a sweeper then hands it the lock when it
        is due). Returns whether the lock was still ours, and the message the caller must now
        publish (None when nothing was handed on)."""
        keys = lease.keys
        script_keys = [
            lease.key,
            keys.parked,
            keys.parked_messages,
            keys.handoff_due,
            debounce_key(keys),
        ]
        args: list[Any] = [lease.token, keys.channel, keys.name, _ms(reservation_ttl)]
        return handed_on(
            self._release_with(lease, self._release_latest, script_keys, args, remember_for)
        )
