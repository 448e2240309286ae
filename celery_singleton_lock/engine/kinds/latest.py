""" "Latest wins" on one Redis server or a Redis Cluster (policy ``replace``, and
``lock_debounce``): at most one call waits behind a lock, the newest; a debounced call is held
until its due time. Scripts in ``lua/`` (acquire_or_replace, release_latest, clear_superseded;
the keys in lua/includes/displace.lua); the parked set, the hand-off index and the sweeper are
those of policy ``queue`` (:mod:`.slot_queue`, with one slot).

On a Redis Cluster, a call that waits and a release that hands the lock on or leaves its
waiting call to its debounce mark their slot in the summary of due slots
(:class:`~..slot_sweep.DueSlots`, one more round trip on those paths only), as the queue's do:
a sweeper finds the lock at its next tick when its debounce, a pause or its holder's TTL ends,
not up to a whole rotation of the windows of slots later. An uncontended acquire or release
marks nothing.
"""

from __future__ import annotations

import functools
from typing import Any, Optional, Sequence

from redis.commands.core import Script

from celery_singleton_lock.engine import redis_server, server_errors
from celery_singleton_lock.engine.acquire_request import AcquireRequest
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.latest import SUPERSEDED_GRACE, debounce_key, superseded_keys
from celery_singleton_lock.engine.lease import (
    Lease,
    LockHolder,
    Owner,
    Parked,
    as_bytes,
    as_text,
)
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer
from celery_singleton_lock.engine.server_leases import Issuer, Releases
from celery_singleton_lock.engine.slot_sweep import DueSlots, SlotSweep


def _ms(seconds: Optional[float]) -> int:
    return 0 if not seconds else max(1, int(seconds * 1000))


class LatestWins:
    """The newest waiting call wins, on ``server``; on a Cluster it marks its slots in
    ``due_slots``, the summary the queue's sweeper reads (see the module docstring)."""

    def __init__(
        self,
        server: RedisServer,
        issuer: Issuer,
        releases: Releases,
        due_slots: Optional[DueSlots] = None,
    ) -> None:
        self.server = server
        self.issuer = issuer
        self.releases = releases
        self.due_slots = due_slots
        self.acquire_script: Script = server.register(source("acquire_or_replace"))
        self._release_latest: Script = server.register(source("release_latest"))
        self._clear_superseded: Script = server.register(source("clear_superseded"))
        self._handoff_due: Script = server.register(source("handoff_due"))
        shared = issuer.shared
        #: the windows of slots a sweeper reads on a Cluster (see :mod:`..slot_sweep`)
        self._window = SlotSweep(server, shared.superseded) if server.cluster else None

    def acquire_call(
        self, request: AcquireRequest, keys: LockKeys, value: str, owner: Owner
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of ACQUIRE_OR_REPLACE (its contract in lua/acquire_or_replace.lua)."""
        latest = request.latest
        assert latest is not None  # the backend sends only such a request here
        shared = self.issuer.shared
        counter, finished = shared.of(keys.lock, owner.task_id)
        script_keys = [
            keys.lock,
            counter,
            keys.parked,
            keys.parked_messages,
            shared.handoff_index(keys.lock),
            debounce_key(keys),
            *superseded_keys(keys, shared.superseded_index(keys.lock)),
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
            latest.sent,
        ]
        # each optional key has its flag in ARGV: on a cluster there is no held index, so a
        # key found by its place would be another's (the contract in acquire_or_replace.lua)
        held = self.issuer.held_keys
        if request.cap_key:  # a cluster's: the rule's copy in the lock's slot
            script_keys.append(shared.rule_of(request.cap_key, keys.lock))
        if request.unless_finished:
            script_keys.append(finished)
        script_keys += held
        args += (
            "1" if request.cap_key else "",
            "1" if request.unless_finished else "",
            "1" if held else "",
        )
        return script_keys, args

    def parked(self, keys: LockKeys, reply: list[Any]) -> Parked:
        """The reply of ACQUIRE_OR_REPLACE when the call waits, as :class:`Parked`; on a
        Cluster its slot is marked due (the script may have put its lock due earlier in its
        slot's index: a debounce's due time, a pause's end, its holder's end)."""
        fields, position, displaced, paused = reply
        if self.due_slots is not None:
            self.due_slots.mark(keys.lock)
        holder = None
        if fields:
            pttl, _, rest = as_text(fields).partition("|")
            holder = LockHolder.parse(keys.lock, rest, pttl)
        return Parked(
            key=keys.lock,
            holder=holder,
            position=int(position),
            handed=None,
            displaced=tuple(as_bytes(message) for message in displaced),
            paused=bool(paused),
        )

    def release_latest(
        self, lease: Lease, *, reservation_ttl: float, remember_for: Optional[float] = None
    ) -> tuple[bool, Optional[bytes]]:
        """Release ``lease`` and, in the same round trip, reserve the lock for the call that
        waits behind it, unless its debounce runs on (a sweeper then hands it the lock when it
        is due). Returns whether the lock was still ours, and the message the caller must now
        publish (None when nothing was handed on)."""
        keys = lease.keys
        held = self.issuer.held_keys
        script_keys = [
            lease.key,
            keys.parked,
            keys.parked_messages,
            self.issuer.shared.handoff_index(keys.lock),
            debounce_key(keys),
            *held,  # none on a cluster: ARGV[5] says (the finish-record set, if any, is last)
        ]
        args: list[Any] = [
            lease.token,
            keys.channel,
            keys.name,
            _ms(reservation_ttl),
            "1" if held else "",
        ]
        reply = self.releases.release_with(
            lease, self._release_latest, script_keys, args, remember_for
        )
        # 0 not ours, 1 released with nothing waiting, 2 released with the waiting call's
        # debounce running on, or the message handed the lock (its reservation due in the
        # index): a Cluster marks the slot of the last two, due earlier than it may say
        handed = isinstance(reply, (bytes, str))
        if self.due_slots is not None and (handed or reply == 2):
            self.due_slots.mark(keys.lock)
        if handed:
            return True, as_bytes(reply)
        return bool(reply), None

    def superseded_left(self, limit: int = 100) -> list[tuple[str, list[bytes]]]:
        """The calls displaced by a newer one that their worker has not marked superseded
        within :data:`SUPERSEDED_GRACE` (it died in between): (lock name, their messages) of
        at most ``limit`` locks. Mark each, then :meth:`clear_superseded` it."""
        if self._window is not None:  # a Cluster: one index per slot, a window per tick
            names = self._window.due(limit)
        else:
            index = self.issuer.shared.superseded
            due = redis_server.run(self._handoff_due, index, [index], [limit], self.server.client)
            names = [as_text(name) for name in due[1:]]  # due[0]: when the next falls due
        left = []
        for name in names:
            key = f"{self.issuer.keys(name).lock}:superseded-left"
            messages = server_errors.call(functools.partial(self.server.client.hvals, key), key)
            left.append((name, [as_bytes(message) for message in messages]))
        return left

    def clear_superseded(
        self, name: str, task_ids: Sequence[str], *, look_again_in: float = 0.0
    ) -> int:
        """The displaced calls ``task_ids`` of the lock ``name`` were marked superseded: no
        longer left to mark (their ids stay recorded, so a stale copy is refused). With
        ``look_again_in``, a sweeper looks at the calls still left that many seconds from now.
        Returns how many are still left."""
        keys = self.issuer.keys(name)
        _, left, index = superseded_keys(keys, self.issuer.shared.superseded_index(keys.lock))
        args = [name, _ms(look_again_in), *task_ids]
        reply = redis_server.run(
            self._clear_superseded, left, [left, index], args, self.server.client
        )
        return int(reply)
