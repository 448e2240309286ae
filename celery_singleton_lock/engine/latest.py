""" "Latest wins" on one server (policy ``replace``, and ``lock_debounce``), as a part of
:class:`~.locker.RedisLocker`: at most one call waits behind a lock, the newest; a debounced
call is held until its due time. Scripts in ``lua/`` (acquire_or_replace, release_latest,
clear_superseded; the keys in lua/includes/displace.lua); the parked list, the
hand-off index and the sweeper are those of policy ``queue`` (:mod:`.queueing`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Any, NamedTuple, Optional, Sequence

from redis.commands.core import Script

from celery_singleton_lock.engine import script_calls, server_errors
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.lease import Lease, Owner, Parked, as_text
from celery_singleton_lock.engine.locker_parts import LockerPart
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.queueing import QueueOperations, as_bytes, handed_on

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


#: Seconds a worker has to mark the calls it displaced before a sweeper does it for them.
SUPERSEDED_GRACE = 5.0
#: Task ids remembered as superseded per lock, at most (the oldest are forgotten first; the
#: scripts' own constant, lua/includes/displace.lua).
MAX_SUPERSEDED = 1000


def debounce_key(keys: LockKeys) -> str:
    """Key of the lock's debounce hash (see lua/includes/displace.lua)."""
    return f"{keys.lock}:latest"


def superseded_index(prefix: str) -> str:
    """Key of the prefix's index of displaced calls left to mark (see lua/includes/displace.lua)."""
    return f"{prefix}:superseded-due"


def superseded_keys(keys: LockKeys) -> list[str]:
    """Keys of the lock's superseded ids, of its calls left to mark, and of the prefix's index
    of those (see lua/includes/displace.lua)."""
    prefix = keys.lock[: keys.lock.index(":{")]
    return [f"{keys.lock}:superseded", f"{keys.lock}:superseded-left", superseded_index(prefix)]


class LatestOperations(LockerPart):
    """The newest waiting call wins, on one server (a part of ``RedisLocker``)."""

    if TYPE_CHECKING:  # provided by RedisLocker
        _handoff_due: Script

    def _register_latest_scripts(self, client: Client) -> None:
        self._acquire_or_replace: Script = client.register_script(source("acquire_or_replace"))
        self._release_latest: Script = client.register_script(source("release_latest"))
        self._clear_superseded: Script = client.register_script(source("clear_superseded"))

    def _replace_call(
        self, request: AcquireRequest, latest: Latest, keys: LockKeys, value: str, owner: Owner
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of ACQUIRE_OR_REPLACE (its contract in lua/acquire_or_replace.lua)."""
        counter, finished = self.shared.of(keys.lock)
        script_keys = [
            keys.lock,
            counter,
            keys.parked,
            keys.parked_messages,
            keys.handoff_due,
            debounce_key(keys),
            *superseded_keys(keys),
        ]
        args = [
            _ms(request.ttl),
            value,
            "1" if request.fencing else "0",
            owner.task_id,
            request.park,
            keys.name,
            _ms(request.reservation_ttl),
            _ms(latest.debounce),
            _ms(latest.debounce_max),
            _ms(request.finished_ttl),
            _ms(SUPERSEDED_GRACE),
        ]
        if request.unless_finished:
            script_keys.append(finished)
        return script_keys, args

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

    def superseded_left(self, limit: int = 100) -> list[tuple[str, list[bytes]]]:
        """The calls displaced by a newer one that their worker has not marked superseded
        within :data:`SUPERSEDED_GRACE` (it died in between): (lock name, their messages) of
        at most ``limit`` locks. Mark each, then :meth:`clear_superseded` it."""
        index = superseded_index(self.prefix)
        due = script_calls.run(self._handoff_due, index, [index], [limit], self.client)
        names = [as_text(name) for name in due]
        left = []
        for name in names:
            key = superseded_keys(self.keys(name))[1]
            messages = server_errors.call(functools.partial(self.client.hvals, key), key)
            left.append((name, [as_bytes(message) for message in messages]))
        return left

    def clear_superseded(
        self, name: str, task_ids: Sequence[str], *, look_again_in: float = 0.0
    ) -> int:
        """The displaced calls ``task_ids`` of the lock ``name`` were marked superseded: no
        longer left to mark (their ids stay recorded, so a stale copy is refused). With
        ``look_again_in``, a sweeper looks at the calls still left that many seconds from now.
        Returns how many are still left."""
        _, left, index = superseded_keys(self.keys(name))
        args = [name, _ms(look_again_in), *task_ids]
        reply = script_calls.run(self._clear_superseded, left, [left, index], args, self.client)
        return int(reply)
