"""Up to N holders of one lock name, a rate of starts and a live cap on PostgreSQL
(``lock_limit``, ``lock_rate``, ``celery locks limit``): one of N slots taken in one round
trip, by the schema's ``take_slot`` function (:mod:`.schema`).

Each slot is a row of the leases table, laid out as the Redis keys are (:mod:`...slots`):
slot 1 is the lock's own row (``name``), slot k > 1 the row ``{name}:slot:k``, a name no lock
can have (lock names have no braces). So a slot's lease is renewed, released, freed after a
crash (``lease_until``) and read as the lock's row is, by its row name (:mod:`.rows`).

The function serializes the admissions of one lock name with a transaction advisory lock
(not a session one, which PgBouncer's transaction pooling breaks): the count of live slots,
the rate's window and the live cap are read after it, so no two calls both find the last slot
free. Each read is one index range of the lock's own rows: O(log n) in the table's size, and
O(N) in its slots.
"""

from __future__ import annotations

from typing import Any, Callable

from celery_singleton_lock.engine import slots as slot_keys
from celery_singleton_lock.engine.acquire_request import AcquireOutcome, AcquireRequest
from celery_singleton_lock.engine.keys import LockKeys
from celery_singleton_lock.engine.lease import LockHolder, Owner, already_finished, new_token
from celery_singleton_lock.engine.postgres.connections import Connections
from celery_singleton_lock.engine.postgres.parking import LeaseOf
from celery_singleton_lock.engine.postgres.reading import holder_of
from celery_singleton_lock.engine.postgres.schema import Schema


class PostgresSlots:
    """One of N slots, within a rate and a live cap, in the tables of ``schema``; the lease of
    a slot taken made by ``lease_of`` (the backend's, as for a mutex), timed by ``clock``."""

    def __init__(
        self,
        connections: Connections,
        schema: Schema,
        prefix: str,
        lease_of: LeaseOf,
        clock: Callable[[], float],
    ) -> None:
        self._connections = connections
        self._prefix = prefix
        self._lease_of = lease_of
        self._clock = clock
        self._sql = (
            f"SELECT * FROM {schema.take_slot}(%(prefix)s, %(name)s, %(token)s, %(pid)s, "
            "%(host)s, %(task_id)s, %(ttl_ms)s, %(fencing)s, %(limit)s, %(rate)s, "
            "%(window_ms)s, %(unless_finished)s, %(cap_key)s)"
        )

    def acquire(self, request: AcquireRequest, owner: Owner, keys: LockKeys) -> AcquireOutcome:
        """Take one of ``request.limit`` slots of ``keys``, within ``request.rate`` and the
        live cap ``request.cap_key``, in one round trip."""
        token = request.token or new_token()
        rate = request.rate
        params: dict[str, Any] = {
            "prefix": self._prefix,
            "name": request.name,
            "token": token,
            "pid": owner.pid,
            "host": owner.host,
            "task_id": owner.task_id,
            "ttl_ms": max(1, int(request.ttl * 1000)),
            "fencing": request.fencing,
            "limit": request.limit,
            "rate": None if rate is None else rate[0],
            "window_ms": None if rate is None else max(1, int(rate[1] * 1000)),
            "unless_finished": request.unless_finished,
            "cap_key": request.cap_key,
        }
        sent_at = self._clock()
        rows = self._connections.run(self._sql, params, keys.lock)
        if not rows:  # every slot went between two reads (a mutex on a slot's row)
            return LockHolder.unknown(keys.lock)
        state, slot, fence, *holder = rows[0]
        if state == "acquired":
            taken = slot_keys.slot_keys(keys, slot)
            return self._lease_of(request, taken, token, owner, fence, sent_at)
        if state == "rate":  # a slot is free, the rate (or the live cap) allows no start
            return LockHolder(keys.lock, "", "", None, None, None, holder[-1], False, True)
        if state == "finished":
            raise already_finished(keys, owner)
        return holder_of(slot_keys.slot_key(keys, slot), (fence, *holder))
