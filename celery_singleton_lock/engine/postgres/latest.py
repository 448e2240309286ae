""" "Latest wins" on PostgreSQL (policy ``replace``, and ``restart`` beside it): at most one
call waits behind a lock, the newest, as a row of ``singleton_lock_parked``; a newer call takes
its place in the same statement as its acquire, and the calls it displaced are recorded in
``singleton_lock_superseded`` (refused if a copy comes back; left to mark REVOKED until the
worker, or a sweeper after :data:`~..latest.SUPERSEDED_GRACE`, marked them). As
:class:`~..kinds.latest.LatestWins` does on Redis; the function: ``sql/latest.sql``.

With ``lock_debounce`` a call waits even on a free lock until its due time (kept in
``singleton_lock_latest``); the release and the sweeper's hand-off are policy ``queue``'s
(:mod:`.parking`), which hand the lock to the one waiting call once no debounce holds it back.
"""

from __future__ import annotations

from typing import Optional, Sequence

from celery_singleton_lock.engine.acquire_request import AcquireOutcome, AcquireRequest
from celery_singleton_lock.engine.latest import SUPERSEDED_GRACE
from celery_singleton_lock.engine.lease import Lease, Owner, Parked, already_finished
from celery_singleton_lock.engine.postgres.parking import (
    PostgresParking,
    held_by,
    ms,
    owner_params,
)
from celery_singleton_lock.engine.postgres.reading import holder_of
from celery_singleton_lock.errors import AlreadySuperseded


class PostgresLatest:
    """The newest call wins, behind the locks of ``parking`` (a
    :class:`~..backend.LatestQueue`)."""

    def __init__(self, parking: PostgresParking) -> None:
        self.parking = parking

    def acquire(self, request: AcquireRequest, owner: Owner, token: str) -> AcquireOutcome:
        """One statement (``singleton_lock_latest_v1``): the lock taken, or the call waiting as
        the newest (:attr:`Parked.displaced`: the calls it took the place of)."""
        latest = request.latest
        assert latest is not None  # the backend sends only such a request here
        parking = self.parking
        keys = parking.keys(request.name)
        params = owner_params(parking.prefix, request, owner, token)
        params.update(
            keep_ms=ms(request.finished_ttl),
            grace_ms=ms(SUPERSEDED_GRACE),
            sent=latest.sent,
            debounce_ms=ms(latest.debounce),
            debounce_max_ms=ms(latest.debounce_max),
        )
        sent_at = parking.clock()
        (row,) = parking.connections.run(parking.statements.latest, params, keys.lock)
        state = row[0]
        if state == "acquired":
            return parking.lease_of(request, keys, token, owner, row[1], sent_at)
        if state == "finished":
            raise already_finished(keys, owner)
        if state == "superseded":
            raise AlreadySuperseded(
                f"task id {owner.task_id} was superseded by a newer call of lock "
                f"{keys.lock}: nothing was taken",
                keys.lock,
                {"task_id": owner.task_id},
            )
        if state == "copy":
            return holder_of(keys.lock, row[1:7])
        return Parked(
            key=keys.lock,
            holder=held_by(keys.lock, row[1:7]),
            position=int(row[7]),
            handed=None,
            displaced=tuple(bytes(message) for message in row[8] or ()),
        )

    def release_latest(
        self, lease: Lease, *, reservation_ttl: float, remember_for: Optional[float] = None
    ) -> tuple[bool, Optional[bytes]]:
        """Release ``lease`` and, in the same transaction, reserve the lock for the call that
        waits behind it: whether the lock was still ours, and the message to publish."""
        return self.parking.release_to_next(
            lease, reservation_ttl=reservation_ttl, remember_for=remember_for
        )

    def superseded_left(self, limit: int = 100) -> list[tuple[str, list[bytes]]]:
        """The displaced calls their worker has not marked within the grace (it died in
        between): (lock name, their messages) of at most ``limit`` locks."""
        parking = self.parking
        rows = parking.connections.run(
            parking.statements.superseded_left,
            {"prefix": parking.prefix, "limit": limit},
            parking.prefix,
        )
        return [(name, [bytes(message) for message in messages]) for name, messages in rows]

    def clear_superseded(
        self, name: str, task_ids: Sequence[str], *, look_again_in: float = 0.0
    ) -> int:
        """The displaced calls ``task_ids`` of lock ``name`` were marked: no longer left to
        mark (their ids stay recorded). How many are still left."""
        parking = self.parking
        params = {
            "prefix": parking.prefix,
            "name": name,
            "task_ids": list(task_ids),
            "look_ms": ms(look_again_in),
        }
        rows = parking.connections.run(
            parking.statements.clear_superseded, params, parking.keys(name).lock
        )
        return int(rows[0][0]) if rows else 0
