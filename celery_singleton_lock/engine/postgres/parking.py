"""Policy ``queue`` on PostgreSQL (``on_duplicate='queue'``), for the mutex: a call that finds
the lock held is parked behind it as a row of ``singleton_lock_parked`` (its task id, the
message a hand-off sends again, its arrival, its fairness value, its rank: the message's
priority the broker's way), in the same statement as its acquire, and each release hands the
lock on in the same transaction, as :class:`~..kinds.slot_queue.SlotQueue` does on Redis: to
the parked call of the highest rank, the oldest first within one; with a fairness value, round
robin across values, each value's turn to its call of the highest rank. The lease row is
RESERVED for that task id for a short send window and its message returned for the Celery
layer to publish. The functions, and why they are so: ``sql/park.sql``, ``sql/hand_on.sql``
and ``sql/turn.sql`` (whose turn is next).

No index of due locks is kept: :meth:`PostgresParking.hand_off_due` reads them from the state
(calls parked behind a lease that is not live), so a holder killed mid-run, a reservation never
taken up and a release without a hand-off are all found by the sweeper the same way.

A lock of several slots (``lock_limit`` > 1), a rate or a cooldown with a queue are not here
(the capabilities refuse them at registration).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from celery_singleton_lock.engine.acquire_request import AcquireOutcome, AcquireRequest
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.kinds.slot_queue import Due
from celery_singleton_lock.engine.lease import Lease, LockHolder, Owner, Parked, already_finished
from celery_singleton_lock.engine.postgres.connections import Connections, Row
from celery_singleton_lock.engine.postgres.queue_statements import QueueStatements
from celery_singleton_lock.engine.postgres.reading import holder_of
from celery_singleton_lock.errors import LockConfigurationError, LockError

#: Makes the lease of an acquire: (request, keys, token, owner, fence, sent at) -> Lease.
LeaseOf = Callable[[AcquireRequest, LockKeys, str, Owner, Optional[int], float], Lease]


def ms(seconds: Optional[float]) -> int:
    return 0 if not seconds else max(1, int(seconds * 1000))


def held_by(key: str, row: Row) -> Optional[LockHolder]:
    """The holder in the fields ``row`` (``fence, pid, host, task_id, acquired_at, left``) of
    a function's reply; None when they are empty (no one holds the lock)."""
    return None if row[3] is None else holder_of(key, row)


def owner_params(prefix: str, request: AcquireRequest, owner: Owner, token: str) -> dict[str, Any]:
    """The parameters an acquire function of ``sql/`` takes for ``request`` by ``owner``."""
    return {
        "prefix": prefix,
        "name": request.name,
        "token": token,
        "pid": owner.pid,
        "host": owner.host,
        "task_id": owner.task_id,
        "ttl_ms": ms(request.ttl),
        "fencing": request.fencing,
        "unless_finished": request.unless_finished,
        "message": request.park,
    }


def refuse_slots(
    limit: int, rate: Optional[tuple[int, float]], key: str, cooldown: object = None
) -> None:
    """Refuse a queue of more than one holder, a rate or a cooldown: not written here."""
    if limit != 1 or rate is not None or cooldown:
        raise LockConfigurationError(
            "on_duplicate='queue' on PostgreSQL hands on a lock with one holder: a "
            "lock_limit above 1, a lock_rate or a lock_cooldown with it is not written for "
            "PostgreSQL yet; use a Redis lock server for it",
            key,
        )


class PostgresParking:
    """Calls parked behind the locks under ``prefix`` (a :class:`~..backend.ParkingQueue`).

    Args:
        connections: the backend's connections.
        statements: the queue parts' statements of its schema.
        prefix: the lock names' namespace.
        channel: the NOTIFY channel of releases.
        lease_of: makes the lease of an acquire (the backend's).
    """

    def __init__(
        self,
        connections: Connections,
        statements: QueueStatements,
        prefix: str,
        channel: str,
        lease_of: LeaseOf,
        clock: Callable[[], float],
    ) -> None:
        self.connections = connections
        self.statements = statements
        self.prefix = prefix
        self.channel = channel
        self.lease_of = lease_of
        self.clock = clock

    def keys(self, name: str) -> LockKeys:
        """The keys of lock ``name`` (``prefix:{name}``, as its holders name it)."""
        return LockKeys.build(self.prefix, name)

    def acquire(self, request: AcquireRequest, owner: Owner, token: str) -> AcquireOutcome:
        """One statement (``singleton_lock_park_v2``): the lock taken, or the call parked."""
        keys = self.keys(request.name)
        refuse_slots(request.limit, request.rate, keys.lock)
        params = owner_params(self.prefix, request, owner, token)
        params.update(
            reserve_ms=ms(request.reservation_ttl), fair=request.fair, rank=request.priority
        )
        sent_at = self.clock()
        (row,) = self.connections.run(self.statements.park, params, keys.lock)
        state, place, handed = row[0], row[7], row[8]
        if state == "acquired":
            return self.lease_of(request, keys, token, owner, row[1], sent_at)
        if state == "finished":
            raise already_finished(keys, owner)
        if state == "copy":
            return holder_of(keys.lock, row[1:7])
        return Parked(
            key=keys.lock,
            holder=held_by(keys.lock, row[1:7]),
            position=int(place),
            handed=None if handed is None else bytes(handed),
        )

    def _hand_on(
        self,
        name: str,
        mode: str,
        subject: str,
        reservation_ttl: float,
        *,
        remember_for: Optional[float] = None,
        task_id: str = "",
    ) -> tuple[int, Optional[bytes]]:
        """``singleton_lock_hand_on_v2`` in ``mode`` (see sql/hand_on.sql): (done, handed)."""
        keys = self.keys(name)
        params = {
            "prefix": self.prefix,
            "name": name,
            "mode": mode,
            "subject": subject,
            "reserve_ms": ms(reservation_ttl),
            "remember_ms": ms(remember_for),
            "task_id": task_id,
            "channel": self.channel,
            "key": keys.lock,
        }
        (row,) = self.connections.run(self.statements.hand_on, params, keys.lock)
        return int(row[0]), None if row[1] is None else bytes(row[1])

    def release_to_next(
        self, lease: Lease, *, reservation_ttl: float, remember_for: Optional[float] = None
    ) -> tuple[bool, Optional[bytes]]:
        """Release ``lease`` and, in the same transaction, reserve the lock for the parked call
        whose turn is next (sql/turn.sql): whether the lock was still ours, and that call's
        message to publish (None when none is parked). One never published is not lost: its
        reservation runs out and a sweeper reserves the lock for the same id again."""
        if not lease.releasing():
            return False, None
        try:
            done, handed = self._hand_on(
                lease.keys.name,
                "release",
                lease.token,
                reservation_ttl,
                remember_for=remember_for,
                task_id=lease.owner.task_id,
            )
        except LockError:
            lease.not_released()
            raise
        return bool(done), handed

    # -- ParkingQueue -------------------------------------------------------------------------

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
        """As :meth:`release_to_next`, for the mutex (``limit`` 1, no rate nor cooldown: the
        capabilities refuse them with a queue on PostgreSQL). ``cap_key`` is not read: every
        task names its family's live-rule key, and a cap bounds slots a one-holder queue
        does not have."""
        refuse_slots(limit, rate, lease.key, cooldown)
        owned, handed = self.release_to_next(
            lease, reservation_ttl=reservation_ttl, remember_for=remember_for
        )
        return owned, [] if handed is None else [handed]

    def hand_off_due(self, limit: int = 100) -> Due:
        """Names of the locks with parked calls behind a lease that is not live (at most
        ``limit``), and the seconds until the next live one runs out."""
        rows = self.connections.run(
            self.statements.due, {"prefix": self.prefix, "limit": limit}, self.prefix
        )
        names = [name for name, _ in rows if name is not None]
        left = next((seconds for name, seconds in rows if name is None), None)
        next_in = 0.0 if len(names) >= limit else (None if left is None else max(0.0, left))
        return Due(names, next_in)

    def hand_on(self, name: str, *, reservation_ttl: float) -> list[bytes]:
        """A sweeper's step on lock ``name``: if it is free, reserve it for the parked call
        whose turn is next; that call's message, to publish."""
        _, handed = self._hand_on(name, "sweep", "", reservation_ttl)
        return [] if handed is None else [handed]

    def handed(self, name: str, task_id: str, *, reservation_ttl: float) -> bool:
        """The message of ``task_id``, handed lock ``name``, was published: its reservation
        lives ``reservation_ttl`` seconds from now. False if the lock is not reserved for it
        (it took the lock already, or the window ran out and a sweeper sends it again)."""
        done, _ = self._hand_on(name, "sent", task_id, reservation_ttl)
        return bool(done)

    def drop_parked(self, name: str, task_id: str, *, reservation_ttl: float) -> Union[bool, bytes]:
        """Take ``task_id`` out of the calls parked behind lock ``name`` for good and, if the
        lock was reserved for it, reserve it for the next parked call at once: that call's
        message, to publish; else whether ``task_id`` was parked or reserved for."""
        done, handed = self._hand_on(name, "drop", task_id, reservation_ttl)
        return handed if handed is not None else bool(done)

    def hand_off_soon(self, name: str) -> int:
        """How many calls are parked behind lock ``name``, released without a hand-off: a
        lock free with calls parked is due to the sweeper by itself (nothing to write)."""
        rows = self.connections.run(
            self.statements.parked_count,
            {"prefix": self.prefix, "name": name},
            self.keys(name).lock,
        )
        return int(rows[0][0]) if rows else 0
