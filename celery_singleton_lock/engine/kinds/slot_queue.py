"""Policy ``queue`` on one server (``on_duplicate='queue'``): a call that finds every slot of
its lock taken (a mutex is the lock with one slot) is parked behind them in arrival order, in
the same round trip, and each release hands its freed slot to the oldest parked call. With a
cooldown or a rate, a slot is handed on when they allow. The message's priority goes first,
and with a fairness value the slots go round robin across values, each value's turn to its
call of the highest priority. The scripts, and why they are so: lua/includes/slot_queue.lua,
lua/includes/handoff.lua, lua/includes/park_priority.lua and lua/includes/fair_queue.lua.

The parked calls of a lock are a sorted set by arrival (finding, re-parking or dropping one
costs O(log n)) and a hash of their messages. A sweeper (:meth:`SlotQueue.hand_off_due`, then
:meth:`SlotQueue.hand_on`) hands on a slot whose holder died or whose reservation ran out; it
reads the lock's rule (its slots and rate), written when a call is parked. On a Redis
Cluster, a call parked and a release that leaves calls parked mark their slot in the summary of
due slots (:class:`~..slot_sweep.DueSlots`, one more round trip on those paths only), so a
sweeper finds the lock at its next tick.
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple, Optional, Union

from redis.commands.core import Script

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.acquire_request import AcquireOutcome, AcquireRequest
from celery_singleton_lock.engine.keys import handoff_index
from celery_singleton_lock.engine.kinds.mutex import confirm_replicas, send
from celery_singleton_lock.engine.latest import debounce_key
from celery_singleton_lock.engine.lease import (
    Lease,
    LockHolder,
    Owner,
    Parked,
    already_finished,
    as_bytes,
    new_token,
)
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer, _ms
from celery_singleton_lock.engine.server_leases import Issuer, Releases
from celery_singleton_lock.engine.slot_sweep import DueSlots, SlotSweep

log_acquire = logging.getLogger("celery_singleton_lock.acquire")

#: Token of a lock value that reserves a slot for the parked task id it names (not hex: no
#: owner has it; lua/includes/handoff.lua).
HANDOFF_TOKEN = "handoff-reserved-for-next-parked"

#: A lock's rule: its number of slots, its rate (``(count, seconds)`` or None) and the key of
#: its task's live cap ("" none).
Rule = tuple[int, Optional[tuple[int, float]], str]


class Due(NamedTuple):
    """The locks a sweeper should look at now, and when it should look next."""

    names: list[str]
    #: seconds until the next lock falls due after these (0: more are due now than were
    #: asked for; None: none is left)
    next_in: Optional[float]


def _rate_args(rate: Optional[tuple[int, float]]) -> list[Any]:
    return ["", ""] if rate is None else [rate[0], _ms(rate[1])]


def parse_rule(raw: Any) -> Optional[Rule]:
    """The rule stored by ACQUIRE_SLOT_OR_PARK (``N|rate|window ms|cap key``), or None."""
    if raw is None:
        return None
    count, rate, window, cap_key = _lease.as_text(raw).split("|", 3)
    return int(count), (None if not rate else (int(rate), int(window) / 1000.0)), cap_key


def _holder(keys_lock: str, fields: Any) -> Optional[LockHolder]:
    if not fields:
        return None
    pttl, _, rest = _lease.as_text(fields).partition("|")
    return LockHolder.parse(keys_lock, rest, pttl)


class SlotQueue:
    """Parking behind the slots of a lock on ``server``, and the hand-off of each freed
    slot."""

    def __init__(self, server: RedisServer, issuer: Issuer, releases: Releases) -> None:
        self.server = server
        self.issuer = issuer
        self.releases = releases
        self._slot_or_park: Script = server.register(source("acquire_slot_or_park"))
        self._hand_on_slots: Script = server.register(source("hand_on_slots"))
        self._handoff_due: Script = server.register(source("handoff_due"))
        #: a Cluster's summary of its due slots, and the windows of slots a sweeper reads
        #: there (see :mod:`..slot_sweep`); None on one server (one index)
        self.due_slots: Optional[DueSlots] = None
        self._window: Optional[SlotSweep] = None
        if server.cluster:
            handoff = issuer.shared.handoff
            self.due_slots = DueSlots(server, issuer.prefix, handoff)
            self._window = SlotSweep(server, handoff, self.due_slots)
        self._hand_on_lock: Script = server.register(source("hand_on_lock"))

    def acquire(self, request: AcquireRequest, owner: Owner) -> AcquireOutcome:
        """One round trip of ACQUIRE_SLOT_OR_PARK: a slot taken, or the call parked."""
        issuer = self.issuer
        keys = issuer.keys(request.name)
        token = request.token or new_token()
        sent_at = issuer.renewer.clock()
        value = f"{token}||{int(issuer.wall_clock() * 1000)}|{owner.fields}"
        limit = request.limit
        counter, finished = issuer.shared.of(keys.lock, owner.task_id)
        script_keys = [*keys.slot_table, counter, keys.starts, keys.parked, keys.parked_messages]
        script_keys += (issuer.shared.handoff_index(keys.lock), keys.parked_rule)
        script_keys += (keys.parked_rounds, *keys.parked_fair)
        args: list[Any] = [_ms(request.ttl), value, "1" if request.fencing else "0", limit]
        args += _rate_args(request.rate)
        args += (owner.task_id, request.park, keys.name, _ms(request.reservation_ttl))
        args += (request.fair, "1" if request.cap_key else "", request.priority)
        args.append("1" if issuer.held_keys else "")
        if request.cap_key:  # stored in the lock's rule as it is: a cluster's copy
            script_keys.append(issuer.shared.rule_of(request.cap_key, keys.lock))
        if request.unless_finished:
            script_keys.append(finished)
        script_keys += issuer.held_keys  # the held index, last (ARGV[14])
        script = self._slot_or_park
        reply, acknowledged = send(self.server, script, keys, script_keys, args, request)
        if reply == -1:
            raise already_finished(keys, owner)
        if isinstance(reply, (bytes, str)):  # a copy of this task id holds a slot
            holder = _holder(keys.lock, reply)
            if holder is None:
                raise server_errors.not_a_lock(keys.lock)
            return holder
        if len(reply) == 2 and isinstance(reply[0], int):
            slot, fence = int(reply[0]), int(reply[1])
            lease = issuer.lease(request, keys, token, owner, fence or None, sent_at, slot=slot)
            confirm_replicas(lease, acknowledged, request)
            log_acquire.debug("acquired %s (fence=%s)", lease.key, lease.fence)
            return lease
        fields, position, paused, *handed = reply
        if self.due_slots is not None:  # its lock is due in its slot's index: say so
            self.due_slots.mark(keys.lock)
        messages = tuple(as_bytes(message) for message in handed)
        return Parked(
            key=keys.lock,
            holder=_holder(keys.lock, fields),
            position=int(position),
            handed=messages[0] if messages else None,
            more_handed=messages[1:],
            paused=bool(paused),
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
        cap_key: str = "",
    ) -> tuple[bool, list[bytes]]:
        """Release ``lease`` (one of ``limit`` slots, taken with ``rate`` and the live cap of
        ``cap_key``), into a cooldown
        of ``cooldown`` seconds if given, and in the same round trip reserve each free slot
        for the oldest parked task id without one, as far as the rate allows (and no more
        slots than the rule of the calls parked now: a limit lowered since ``lease`` was
        taken hands on only as many).

        Returns whether the slot was still ours, and the parked messages the caller must now
        publish. One never published is not lost: its reservation runs out and a sweeper
        reserves a slot for the same id again.
        """
        keys = lease.keys
        cooldown_ms: Any = "" if not cooldown else _ms(cooldown)
        rule: Rule = (limit, rate, cap_key)
        script_keys, args = self._hand_on_call(
            keys.name, rule, "release", lease.token, reservation_ttl, cooldown_ms
        )
        done, *handed = self.releases.release_with(
            lease, self._hand_on_slots, script_keys, args, remember_for
        ) or [0]
        if done == 2 and self.due_slots is not None:  # calls left parked, due in the index
            self.due_slots.mark(keys.lock)
        return bool(done), [as_bytes(message) for message in handed]

    def _hand_on_call(
        self,
        name: str,
        rule: Rule,
        mode: str,
        subject: str,
        reservation_ttl: float,
        cooldown_ms: Any = "",
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of HAND_ON_SLOTS (see its contract) for a lock of ``rule``."""
        limit, rate, cap_key = rule
        keys = self.issuer.keys(name)
        script_keys = [*keys.slot_table, keys.starts, keys.parked, keys.parked_messages]
        script_keys.append(self.issuer.shared.handoff_index(keys.lock))
        script_keys += (keys.parked_rule, keys.parked_rounds, *keys.parked_fair)
        args: list[Any] = [limit, *_rate_args(rate), mode, subject, keys.channel, keys.name]
        args += (_ms(reservation_ttl), cooldown_ms, "1" if cap_key else "")
        if cap_key:
            script_keys.append(self.issuer.shared.rule_of(cap_key, keys.lock))
        script_keys += self.issuer.held_keys  # before a release's finish record, if any
        return script_keys, args

    def _rule(self, name: str) -> Optional[Rule]:
        """The rule of the calls parked behind lock ``name``'s slots; None when none is
        written: a call waits behind its lock key (latest wins)."""
        key = self.issuer.keys(name).parked_rule
        raw = server_errors.call(lambda: self.server.client.get(key), key)
        return parse_rule(raw)

    def _hand_on(self, name: str, mode: str, subject: str, reservation_ttl: float) -> list[Any]:
        """The reply of a sweep, a drop or a 'sent' (see lua/hand_on_slots.lua) on lock
        ``name``: on its slots by its rule, or on its lock key when no rule is written
        (lua/hand_on_lock.lua)."""
        rule = self._rule(name)
        if rule is None:
            keys = self.issuer.keys(name)
            latest = debounce_key(keys)
            script_keys = [
                keys.lock,
                keys.parked,
                keys.parked_messages,
                self.issuer.shared.handoff_index(keys.lock),
            ]
            script_keys += (keys.parked_rounds, latest)
            # the live rule its waiting call read (its slot's copy on a Cluster): its pause
            # holds the hand-on too ('sent' hands nothing on: no round trip for it)
            live = ""
            if mode != "sent":
                raw = server_errors.call(lambda: self.server.client.hget(latest, "rule"), latest)
                live = _lease.as_text(raw) if raw else ""
            args = [mode, subject, keys.name, _ms(reservation_ttl), "1" if live else ""]
            if live:
                script_keys.append(self.issuer.shared.rule_of(live, keys.lock))
            return list(self.server.run(self._hand_on_lock, keys.lock, script_keys, args))
        script_keys, args = self._hand_on_call(name, rule, mode, subject, reservation_ttl)
        return list(self.server.run(self._hand_on_slots, script_keys[0], script_keys, args))

    # -- the sweeper's side ------------------------------------------------------------------

    def hand_off_due(self, limit: int = 100) -> Due:
        """Names of the locks with parked task ids whose holder's TTL or reservation has run
        out by the server's clock (at most ``limit``): a sweeper looks at each with
        :meth:`hand_on`, then sleeps until the next is due (or its interval ends)."""
        if self._window is not None:  # a Cluster: one index per slot, a window per tick
            return Due(self._window.due(limit), None)
        key = handoff_index(self.issuer.prefix)
        wait, *names = self.server.run(self._handoff_due, key, [key], [limit])
        wait = int(wait)
        return Due([_lease.as_text(name) for name in names], None if wait < 0 else wait / 1000)

    def hand_on(self, name: str, *, reservation_ttl: float) -> list[bytes]:
        """A sweeper's step on the lock ``name``: reserve its free slots for the oldest parked
        ids without one, as far as the rate allows; their messages, to publish (a held slot is
        looked at again when its TTL runs out)."""
        _, *handed = self._hand_on(name, "sweep", "", reservation_ttl)
        return [as_bytes(message) for message in handed]

    def handed(self, name: str, task_id: str, *, reservation_ttl: float) -> bool:
        """The message of ``task_id``, handed a slot of lock ``name``, was published: its
        reservation (made for a short send window, so that a holder that dies before it
        publishes stalls the lock only that long) lives ``reservation_ttl`` seconds from now.
        False if no slot is reserved for it (it took its slot already, or the window ran out
        and a sweeper sends its message again: a copy its finish record drops)."""
        done, *_ = self._hand_on(name, "sent", task_id, reservation_ttl)
        return bool(done)

    def drop_parked(self, name: str, task_id: str, *, reservation_ttl: float) -> Union[bool, bytes]:
        """Take ``task_id`` out of the calls parked behind the lock ``name`` for good (its
        message was revoked, expired, or cannot be read), and, if a slot was reserved for it,
        reserve that slot for the next parked id for ``reservation_ttl`` seconds at once.

        Returns that next id's message, to publish; else True if ``task_id`` was parked or
        reserved for (now dropped), False if it was neither. A slot held by ``task_id``
        itself is never touched.
        """
        done, *handed = self._hand_on(name, "drop", task_id, reservation_ttl)
        return as_bytes(handed[0]) if handed else bool(done)

    def hand_off_soon(self, name: str) -> int:
        """After the lock ``name`` was released without a hand-off (by hand, or at shutdown):
        how many task ids are parked behind it; if any, the name is made due in the hand-off
        index now, so a sweeper hands the lock on at its next tick (its slot marked in the
        summary of due slots on a Cluster, see slot_sweep.py) instead of at the old holder's
        TTL."""
        keys = self.issuer.keys(name)
        parked = int(server_errors.call(lambda: self.server.client.zcard(keys.parked), keys.parked))
        if parked:
            index = self.issuer.shared.handoff_index(keys.lock)
            server_errors.call(lambda: self.server.client.zadd(index, {keys.name: 0}), index)
            if self.due_slots is not None:
                self.due_slots.mark(keys.lock)
        return parked
