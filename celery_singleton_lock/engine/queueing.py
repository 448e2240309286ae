"""The queue features of one server: queued markers (``dedupe_on_enqueue``) and parking
(``on_duplicate='queue'``), as a part of :class:`~.locker.RedisLocker`.

Kept apart from the plain leases of :mod:`.locker` because they are a job of their own (their
scripts are in ``lua/``: enqueue, clear_queued, acquire_or_park, release_and_hand_off,
handoff_due, drop_parked); a backend without them says so in its capabilities
(:mod:`.backend`), and the Celery layer refuses the options that need them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Union

from redis.commands.core import Script

from celery_singleton_lock.engine import lease as _lease
from celery_singleton_lock.engine import server_errors
from celery_singleton_lock.engine.keys import LockKeys, handoff_index
from celery_singleton_lock.engine.lease import Lease, LockHolder, Owner, Parked
from celery_singleton_lock.engine.locker_parts import LockerPart
from celery_singleton_lock.engine.lua_scripts import source

if TYPE_CHECKING:
    from celery_singleton_lock.engine.acquire_request import AcquireRequest
    from celery_singleton_lock.engine.reading import Client


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


#: Token of a lock value that reserves the lock for the parked task id it names (not hex: no
#: owner has it; lua/includes/handoff.lua).
HANDOFF_TOKEN = "handoff-reserved-for-next-parked"


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def park_call(
    locker: LockerPart,
    request: AcquireRequest,
    keys: LockKeys,
    value: str,
    owner: Owner,
) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of ACQUIRE_OR_PARK on ``locker``'s server (its contract in
    lua/acquire_or_park.lua) for the lock ``value`` (its fence empty)."""
    counter, finished = locker.shared.of(keys.lock)
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
        args.append(_ms(request.finished_ttl))
    return script_keys, args


class QueueOperations(LockerPart):
    """Queued markers and parking on one server (a part of ``RedisLocker``)."""

    def _register_queue_scripts(self, client: Client) -> None:
        self._enqueue: Script = client.register_script(source("enqueue"))
        self._clear_queued: Script = client.register_script(source("clear_queued"))
        self._acquire_or_park: Script = client.register_script(source("acquire_or_park"))
        self._release_and_hand_off: Script = client.register_script(source("release_and_hand_off"))
        self._handoff_due: Script = client.register_script(source("handoff_due"))
        self._drop_parked: Script = client.register_script(source("drop_parked"))

    if TYPE_CHECKING:  # provided by RedisLocker (SlotQueueOperations)

        def parked_rule(self, name: str) -> Optional[tuple[int, Any]]: ...

        def drop_from_slots(
            self, name: str, rule: Any, task_id: str, *, reservation_ttl: float
        ) -> tuple[bool, list[bytes]]: ...

    @staticmethod
    def _parked(keys: LockKeys, reply: list[Any]) -> Parked:
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

    # -- queued markers (enqueue deduplication) -------------------------------------------------

    def enqueue(
        self, name: str, task_id: str, ttl: float, *, resend: bool = False, running: bool = True
    ) -> Optional[str]:
        """Mark ``task_id`` as queued under the lock ``name``, unless another message is
        queued or an execution is running there; in one round trip.

        Returns None when the caller should publish ``task_id`` (the marker now holds it, for
        ``ttl`` seconds), or the task id already queued or running under ``name`` (nothing
        was written: publish nothing). ``resend``: the message is sent again under its own
        id (a retry): never reported as a duplicate; the marker is written only if absent.
        ``running=False``: only a queued message is a duplicate, not a running execution.
        The acquire of ``task_id`` with ``take_queued`` deletes the marker.

        Raises:
            LockBackendUnavailable: the server could not be reached or refused the write.
        """
        if not task_id:
            raise ValueError("enqueue needs a task id")
        keys = self.keys(name)
        reply = self._run(
            self._enqueue,
            keys.lock,
            [keys.lock, keys.queued],
            [task_id, _ms(ttl), "1" if resend else ("0" if running else "2")],
        )
        return None if reply is None else _lease.as_text(reply)

    def clear_queued(self, name: str, task_id: Optional[str] = None) -> bool:
        """Delete the queued marker of the lock ``name``; with ``task_id``, only if it holds
        exactly that id (compare-and-delete). True if a marker was deleted.

        For a publish that failed, a revoked message, or a purged queue (otherwise the
        marker expires after its TTL).
        """
        keys = self.keys(name)
        args = [task_id] if task_id else []
        return bool(self._run(self._clear_queued, keys.queued, [keys.queued], args))

    def queued_for(self, name: str) -> Optional[float]:
        """Seconds the queued marker of the lock ``name`` still lives; None without one."""
        key = self.keys(name).queued
        pttl = server_errors.call(lambda: self.client.pttl(key), key)
        return None if pttl < 0 else pttl / 1000.0

    def queued(self, name: str) -> Optional[str]:
        """The task id queued under the lock ``name`` (its marker), or None."""
        keys = self.keys(name)
        value = server_errors.call(lambda: self.client.get(keys.queued), keys.queued)
        return None if value is None else _lease.as_text(value)

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
            self._release_with(lease, self._release_and_hand_off, script_keys, args, remember_for)
        )

    # -- hand-off sweeping -------------------------------------------------------------------

    def hand_off_due(self, limit: int = 100) -> list[str]:
        """Names of the locks with parked task ids whose holder's TTL or reservation has run
        out by the server's clock (at most ``limit``): a sweeper looks at each with
        :meth:`hand_off_if_free`."""
        key = handoff_index(self.prefix)
        return [_lease.as_text(name) for name in self._run(self._handoff_due, key, [key], [limit])]

    def hand_off_if_free(self, name: str, *, reservation_ttl: float) -> Optional[bytes]:
        """If the lock ``name`` is free and task ids are parked behind it, reserve it for the
        oldest for ``reservation_ttl`` seconds and return its message, to publish; else None
        (a held lock is looked at again when its TTL runs out)."""
        keys = self.keys(name)
        reply = self._run(
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
        rule = self.parked_rule(name)
        if rule is not None:  # parked over slots, a rate or a cooldown (slot_queue.py)
            dropped, handed = self.drop_from_slots(
                name, rule, task_id, reservation_ttl=reservation_ttl
            )
            return handed[0] if handed else dropped
        keys = self.keys(name)
        reply = self._run(
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
        keys = self.keys(name)
        parked = int(server_errors.call(lambda: self.client.llen(keys.parked), keys.parked))
        if parked:
            index = keys.handoff_due
            server_errors.call(lambda: self.client.zadd(index, {keys.name: 0}), index)
        return parked
