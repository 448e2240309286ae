"""Policy ``queue`` over N slots, a cooldown or a rate, on one server (the scripts, and why
they are so, in lua/includes/slot_queue.lua).

The mutex's queue (:mod:`.parking`) stays what it was for a lock with one holder, no rate
and no cooldown: these operations are used only when a task asks for one of those three, and
the sweeper and the drop of a parked call tell the two apart by the lock's rule, written when
a call is parked here.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from redis.commands.core import Script

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import server_errors, slots
from celery_singleton_lock.engine.acquire_request import AcquireOutcome, AcquireRequest
from celery_singleton_lock.engine.kinds.issuer import Issuer
from celery_singleton_lock.engine.kinds.parking import as_bytes
from celery_singleton_lock.engine.lease import (
    Lease,
    LockHolder,
    Owner,
    Parked,
    already_finished,
    new_token,
)
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer
from celery_singleton_lock.engine.releases import Releases
from celery_singleton_lock.engine.script_calls import _ms

log_acquire = logging.getLogger("celery_singleton_lock.acquire")

#: A lock's rule: its number of slots and its rate (``(count, seconds)`` or None).
Rule = tuple[int, Optional[tuple[int, float]]]


def _rate_args(rate: Optional[tuple[int, float]]) -> list[Any]:
    return ["", ""] if rate is None else [rate[0], _ms(rate[1])]


def parse_rule(raw: Any) -> Optional[Rule]:
    """The rule stored by ACQUIRE_SLOT_OR_PARK (``N|rate|window ms``), or None."""
    if raw is None:
        return None
    count, rate, window = _lease.as_text(raw).split("|")
    return int(count), (None if not rate else (int(rate), int(window) / 1000.0))


class SlotQueue:
    """Parking behind N slots on ``server``, and the hand-off of each freed slot."""

    def __init__(self, server: RedisServer, issuer: Issuer, releases: Releases) -> None:
        self.server = server
        self.issuer = issuer
        self.releases = releases
        self._slot_or_park: Script = server.register(source("acquire_slot_or_park"))
        self._hand_on_slots: Script = server.register(source("hand_on_slots"))

    def acquire(self, request: AcquireRequest, owner: Owner) -> AcquireOutcome:
        """One round trip of ACQUIRE_SLOT_OR_PARK: a slot taken, or the call parked."""
        issuer = self.issuer
        keys = issuer.keys(request.name)
        token = request.token or new_token()
        sent_at = issuer.renewer.clock()
        value = f"{token}||{int(issuer.wall_clock() * 1000)}|{owner.fields}"
        limit = request.limit
        counter, finished = issuer.shared.of(keys.lock, owner.task_id)
        script_keys = [slots.slot_key(keys, slot) for slot in range(1, limit + 1)]
        script_keys += (counter, keys.starts, keys.parked, keys.parked_messages)
        script_keys += (keys.handoff_due, keys.parked_rule)
        args: list[Any] = [_ms(request.ttl), value, "1" if request.fencing else "0", limit]
        args += _rate_args(request.rate)
        args += (owner.task_id, request.park, keys.name, _ms(request.reservation_ttl))
        if request.unless_finished:
            script_keys.append(finished)
        reply = self.server.run(self._slot_or_park, keys.lock, script_keys, args, pinned=True)
        if reply == -1:
            raise already_finished(keys, owner)
        if isinstance(reply, (bytes, str)):  # a copy of this task id holds a slot
            pttl, _, fields = _lease.as_text(reply).partition("|")
            holder = LockHolder.parse(keys.lock, fields, pttl)
            if holder is None:
                raise server_errors.not_a_lock(keys.lock)
            return holder
        if len(reply) == 2 and isinstance(reply[0], int):
            slot, fence = int(reply[0]), int(reply[1])
            lease = issuer.lease(
                request, slots.slot_keys(keys, slot), token, owner, fence or None, sent_at
            )
            log_acquire.debug("acquired %s (fence=%s)", lease.key, lease.fence)
            return lease
        fields, position, *handed = reply
        holder = None
        if fields:
            pttl, _, rest = _lease.as_text(fields).partition("|")
            holder = LockHolder.parse(keys.lock, rest, pttl)
        messages = tuple(as_bytes(message) for message in handed)
        return Parked(
            key=keys.lock,
            holder=holder,
            position=int(position),
            handed=messages[0] if messages else None,
            more_handed=messages[1:],
        )

    def release_handing_on(
        self,
        lease: Lease,
        *,
        limit: int,
        rate: Optional[tuple[int, float]] = None,
        cooldown: Optional[float] = None,
        reservation_ttl: float,
        remember_for: Optional[float] = None,
    ) -> tuple[bool, list[bytes]]:
        """Release ``lease`` (one of ``limit`` slots, taken with ``rate``), into a cooldown
        of ``cooldown`` seconds if given, and in the same round trip reserve each free slot
        for the oldest parked task id without one, as far as the rate allows.

        Returns whether the slot was still ours, and the parked messages the caller must now
        publish. One never published is not lost: its reservation runs out and a sweeper
        reserves a slot for the same id again.
        """
        keys = lease.keys
        cooldown_ms: Any = "" if not cooldown else _ms(cooldown)
        script_keys, args = self._hand_on_call(
            keys.name, limit, rate, "release", lease.token, reservation_ttl, cooldown_ms
        )
        done, *handed = self.releases.release_with(
            lease, self._hand_on_slots, script_keys, args, remember_for
        ) or [0]
        return bool(done), [as_bytes(message) for message in handed]

    def _hand_on_call(
        self,
        name: str,
        limit: int,
        rate: Optional[tuple[int, float]],
        mode: str,
        subject: str,
        reservation_ttl: float,
        cooldown_ms: Any = "",
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of HAND_ON_SLOTS (see its contract)."""
        keys = self.issuer.keys(name)
        script_keys = [slots.slot_key(keys, slot) for slot in range(1, limit + 1)]
        script_keys += (keys.starts, keys.parked, keys.parked_messages, keys.handoff_due)
        script_keys.append(keys.parked_rule)
        args: list[Any] = [limit, *_rate_args(rate), mode, subject, keys.channel, keys.name]
        args += (_ms(reservation_ttl), cooldown_ms)
        return script_keys, args

    def parked_rule(self, name: str) -> Optional[Rule]:
        """The rule of the calls parked behind lock ``name`` over slots, a rate or a
        cooldown; None when they are parked behind the mutex (or none are)."""
        key = self.issuer.keys(name).parked_rule
        return parse_rule(server_errors.call(lambda: self.server.client.get(key), key))

    def hand_on_slots(self, name: str, rule: Rule, *, reservation_ttl: float) -> list[bytes]:
        """A sweeper's step on a lock parked over slots: reserve its free slots for the
        oldest parked ids without one, as far as the rate allows; their messages, to
        publish."""
        script_keys, args = self._hand_on_call(name, rule[0], rule[1], "sweep", "", reservation_ttl)
        _, *handed = self.server.run(self._hand_on_slots, script_keys[0], script_keys, args)
        return [as_bytes(message) for message in handed]

    def drop_from_slots(
        self, name: str, rule: Rule, task_id: str, *, reservation_ttl: float
    ) -> tuple[bool, list[bytes]]:
        """Take ``task_id`` out of the calls parked over slots for good, freeing a slot
        reserved for it and handing that on: whether it was parked or reserved for, and the
        messages to publish."""
        script_keys, args = self._hand_on_call(
            name, rule[0], rule[1], "drop", task_id, reservation_ttl
        )
        done, *handed = self.server.run(self._hand_on_slots, script_keys[0], script_keys, args)
        return bool(done), [as_bytes(message) for message in handed]
