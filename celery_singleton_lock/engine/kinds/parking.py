"""Policy ``queue`` behind the mutex on one server (``on_duplicate='queue'``): a call that
finds the lock held is parked behind it in arrival order, in the same round trip, and a
release hands the lock to the oldest parked call. Scripts in ``lua/`` (acquire_or_park,
release_and_hand_off, handoff_due, drop_parked); the
queue over slots, a rate or a cooldown is :mod:`.slot_queue`'s.
"""

from __future__ import annotations

from typing import Any, Optional, Union

from redis.commands.core import Script

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.acquire_request import AcquireRequest
from celery_singleton_lock.engine.keys import LockKeys, handoff_index
from celery_singleton_lock.engine.kinds.issuer import Issuer
from celery_singleton_lock.engine.lease import Lease, LockHolder, Owner, Parked
from celery_singleton_lock.engine.lua_scripts import source
from celery_singleton_lock.engine.redis_server import RedisServer
from celery_singleton_lock.engine.releases import Releases
from celery_singleton_lock.engine.script_calls import _ms

#: Token of a lock value that reserves the lock for the parked task id it names (not hex: no
#: owner has it; lua/includes/handoff.lua).
HANDOFF_TOKEN = "handoff-reserved-for-next-parked"


def as_bytes(reply: Union[bytes, str]) -> bytes:
    # a client made with decode_responses=True hands back str
    return reply.encode("utf-8", "surrogateescape") if isinstance(reply, str) else reply


def handed_on(reply: Any) -> tuple[bool, Optional[bytes]]:
    """The reply of a release that hands the lock on, as ``(released, message to publish)``:
    0 not ours, 1 released with nothing handed on, or the message of the call it is now
    reserved for."""
    if isinstance(reply, (bytes, str)):
        return True, as_bytes(reply)
    return bool(reply), None


class Parking:
    """Calls parked behind the mutex on ``server``, and the hand-off of the lock to them."""

    def __init__(self, server: RedisServer, issuer: Issuer, releases: Releases) -> None:
        self.server = server
        self.issuer = issuer
        self.releases = releases
        self.acquire_script: Script = server.register(source("acquire_or_park"))
        self._release_and_hand_off: Script = server.register(source("release_and_hand_off"))
        self._handoff_due: Script = server.register(source("handoff_due"))
        self._drop_parked: Script = server.register(source("drop_parked"))

    def acquire_call(
        self,
        request: AcquireRequest,
        keys: LockKeys,
        value: str,
        owner: Owner,
    ) -> tuple[list[str], list[Any]]:
        """KEYS and ARGV of ACQUIRE_OR_PARK (its contract in lua/acquire_or_park.lua) for the
        lock ``value`` (its fence empty)."""
        counter, finished = self.issuer.shared.of(keys.lock, owner.task_id)
        script_keys = [keys.lock, counter, keys.parked, keys.parked_messages, keys.handoff_due]
        args: list[Any] = [
            _ms(request.ttl),
            value,
            "1" if request.fencing else "0",
            owner.task_id,
            request.park,
            keys.name,
            _ms(request.reservation_ttl),
        ]
        if request.unless_finished:
            script_keys.append(finished)
        return script_keys, args

    @staticmethod
    def parked(keys: LockKeys, reply: list[Any]) -> Parked:
        fields, position, handed = reply
        holder = None
        if fields:
            pttl, _, rest = _lease.as_text(fields).partition("|")
            holder = LockHolder.parse(keys.lock, rest, pttl)
        return Parked(
            key=keys.lock,
            holder=holder,
            position=int(position),
            handed=None if handed is None else as_bytes(handed),
        )

    def release_handing_off(
        self, lease: Lease, *, reservation_ttl: float, remember_for: Optional[float] = None
    ) -> tuple[bool, Optional[bytes]]:
        """Release ``lease`` as :meth:`release` does, and in the same round trip reserve the
        lock for ``reservation_ttl`` seconds for the oldest task id parked behind it (see
        ``park`` in :meth:`try_acquire`).

        Returns whether the lock was still ours, and the parked message the caller must now
        publish (None when nothing is parked, or the lock was not ours). A message that is
        never published is not lost: when the reservation runs out, a sweeper
        (:meth:`hand_off_if_free`) reserves the lock for the same task id again.
        """
        keys = lease.keys
        script_keys = [lease.key, keys.parked, keys.parked_messages, keys.handoff_due]
        args: list[Any] = [lease.token, keys.channel, keys.name, _ms(reservation_ttl)]
        return handed_on(
            self.releases.release_with(
                lease, self._release_and_hand_off, script_keys, args, remember_for
            )
        )

    # -- hand-off sweeping -------------------------------------------------------------------

    def hand_off_due(self, limit: int = 100) -> list[str]:
        """Names of the locks with parked task ids whose holder's TTL or reservation has run
        out by the server's clock (at most ``limit``): a sweeper looks at each with
        :meth:`hand_off_if_free`."""
        key = handoff_index(self.issuer.prefix)
        return [
            _lease.as_text(name) for name in self.server.run(self._handoff_due, key, [key], [limit])
        ]

    def hand_off_if_free(self, name: str, *, reservation_ttl: float) -> Optional[bytes]:
        """If the lock ``name`` is free and task ids are parked behind it, reserve it for the
        oldest for ``reservation_ttl`` seconds and return its message, to publish; else None
        (a held lock is looked at again when its TTL runs out)."""
        keys = self.issuer.keys(name)
        reply = self.server.run(
            self._release_and_hand_off,
            keys.lock,
            [keys.lock, keys.parked, keys.parked_messages, keys.handoff_due],
            ["", keys.channel, keys.name, _ms(reservation_ttl)],
        )
        return as_bytes(reply) if isinstance(reply, (bytes, str)) else None

    def drop_parked(self, name: str, task_id: str, *, reservation_ttl: float) -> Union[bool, bytes]:
        """Take ``task_id`` out of the calls parked behind the lock ``name`` for good (its
        message was revoked, expired, or cannot be read), and, if the lock was reserved for
        it, reserve it for the next parked id for ``reservation_ttl`` seconds at once.

        Returns that next id's message, to publish; else True if ``task_id`` was parked or
        reserved for (now dropped), False if it was neither. A lock held by ``task_id``
        itself is never touched.
        """
        keys = self.issuer.keys(name)
        reply = self.server.run(
            self._drop_parked,
            keys.lock,
            [keys.lock, keys.parked, keys.parked_messages, keys.handoff_due],
            [task_id, keys.name, _ms(reservation_ttl)],
        )
        return as_bytes(reply) if isinstance(reply, (bytes, str)) else bool(reply)

    def hand_off_soon(self, name: str) -> int:
        """After the lock ``name`` was released without a hand-off (by hand, or by a plain
        release): how many task ids are parked behind it; if any, the name is made due in
        the hand-off index now, so a sweeper hands the lock on at its next tick instead of
        at the old holder's TTL."""
        keys = self.issuer.keys(name)
        parked = int(server_errors.call(lambda: self.server.client.llen(keys.parked), keys.parked))
        if parked:
            index = keys.handoff_due
            server_errors.call(lambda: self.server.client.zadd(index, {keys.name: 0}), index)
        return parked
