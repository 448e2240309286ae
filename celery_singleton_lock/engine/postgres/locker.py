"""Leases in PostgreSQL rows: the :class:`PostgresLocker` backend, for stacks with a database
and no Redis (issue 34).

One row per lock name in the schema's leases table (:mod:`.schema`), each operation one
statement (:mod:`.statements`), so one round trip and one transaction:

* **acquire**: ``INSERT ... ON CONFLICT DO UPDATE ... WHERE lease_until <= now()``: the row
  is taken when it is new or its lease ran out; the same statement answers who holds it
  otherwise. Times are the server's (``now()``), never a worker's.
* **release**: owner-checked (the token), a NOTIFY in the same transaction. The row is freed,
  not deleted: a deleted row would let an insert whose fence was drawn before a later holder's
  take the lock after it, and fences would not increase in the order the lock is taken.
* **renewal**: the renewer's tick is ONE statement for all of a process's leases here
  (``UPDATE ... FROM unnest(...)``), answering which were lost.
* **fences**: ``nextval`` of one sequence, strictly increasing, never reused (a sequence
  survives a restart; a crash may skip numbers, never repeat them).
* **finish records** (``unless_finished``, a release's ``remember_for``): a table.

Not session advisory locks: they are tied to a connection, which PgBouncer's transaction
pooling hands to someone else between transactions. Nothing here keeps state in a session,
but the LISTEN of a waiter (:mod:`.releases`).

Admission beside the mutex: one of N slots within a rate and a live cap (:mod:`.slots`, whose
rows :mod:`.rows` names), the queued markers (:mod:`.markers`), and the cooldown release, a
release that leaves the row taken (``release_cooling`` here). Policies ``queue``, ``replace``
and ``restart`` park calls in rows beside the leases (:mod:`.parking`, :mod:`.latest`,
:mod:`.cancels`), for the mutex: a queue behind several slots, a rate or a cooldown is not
written here, and the capabilities say so (:data:`POSTGRES`, ``parking_slots``).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional, Sequence

from celery_singleton_lock.engine import acquire_request, checks
from celery_singleton_lock.engine.acquire_request import (
    AcquireOutcome,
    AcquireRequest,
    GeneralAcquire,
    PreparedAcquire,
    check_call,
)
from celery_singleton_lock.engine.keys import LockKeys, validate_prefix
from celery_singleton_lock.engine.lease import (
    Lease,
    LockHolder,
    Owner,
    already_finished,
    new_token,
)
from celery_singleton_lock.engine.postgres.cancels import PostgresCancels
from celery_singleton_lock.engine.postgres.capabilities import POSTGRES
from celery_singleton_lock.engine.postgres.connections import Connections, split_url
from celery_singleton_lock.engine.postgres.latest import PostgresLatest
from celery_singleton_lock.engine.postgres.live_rules import PostgresLiveRules
from celery_singleton_lock.engine.postgres.markers import PostgresMarkers
from celery_singleton_lock.engine.postgres.parked_reading import ParkedReads
from celery_singleton_lock.engine.postgres.parking import PostgresParking
from celery_singleton_lock.engine.postgres.queue_statements import QueueStatements
from celery_singleton_lock.engine.postgres.reading import PostgresInspector, holder_of
from celery_singleton_lock.engine.postgres.releases import PostgresSubscription
from celery_singleton_lock.engine.postgres.rows import announced, row_name, slot_row
from celery_singleton_lock.engine.postgres.schema import Schema
from celery_singleton_lock.engine.postgres.slots import PostgresSlots
from celery_singleton_lock.engine.postgres.statements import Statements
from celery_singleton_lock.engine.renewer import Renewer, process_renewer
from celery_singleton_lock.errors import LockError

log = logging.getLogger("celery_singleton_lock.acquire")

#: Times an acquire is sent again when its statement saw the row neither taken nor held (a
#: concurrent insert not yet in its snapshot).
ATTEMPTS = 3


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


class PostgresLocker:
    """Leases in the PostgreSQL database ``url`` names (see the module).

    Args:
        url: ``postgresql://user:password@host:port/db``, libpq parameters in its query, and
            ``schema=S`` for the schema of the tables (``public`` by default).
        prefix: the lock names' namespace (a column: many prefixes share the tables).
        renewer: the renewer of this process's leases (the process's by default).
        create_schema: create the tables on first use (otherwise they must exist).
    """

    capabilities = POSTGRES
    try_acquire = checks.try_acquire

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "singleton-lock",
        renewer: Optional[Renewer] = None,
        create_schema: bool = True,
    ) -> None:
        self.prefix = validate_prefix(prefix)
        self.renewer = renewer if renewer is not None else process_renewer()
        conninfo, schema_name = split_url(url)
        self.schema = Schema(schema_name)
        self.statements = Statements(self.schema)
        self.connections = Connections(conninfo)
        # -- the queue parts (policies queue, replace, restart): parking.py, latest.py
        queue_statements = QueueStatements(self.schema)
        parked_reads = ParkedReads(self.connections, queue_statements, self.prefix)
        self.inspect = PostgresInspector(
            self.connections, self.statements, self.prefix, parked_reads, ready=self.ready
        )
        self._ready = not create_schema
        self.queue = PostgresParking(
            self.connections,
            queue_statements,
            self.prefix,
            self.schema.channel,
            self._lease,
            self.renewer.clock,
        )
        self.latest = PostgresLatest(self.queue)
        self.cancels = PostgresCancels(self.connections, queue_statements, self.prefix)
        # -- admission: slots (lock_limit, lock_rate, a live cap), cooldown, queued markers
        self.slots = PostgresSlots(
            self.connections, self.schema, self.prefix, self._lease, self.renewer.clock
        )
        #: the cooldown release (lock_cooldown): a release, the row left taken (statements.py)
        self.cooldown = self
        self.markers = PostgresMarkers(
            self.connections, self.schema, self.statements, self.prefix, self.ready
        )
        #: live caps only (not PausingRules: the CLI and pause_for refuse a pause, naming this
        #: backend)
        self.live_rules = PostgresLiveRules(self.connections, self.schema, self.prefix, self.ready)
        # -- end of admission

    def keys(self, name: str) -> LockKeys:
        """The lock key (``prefix:{name}``, as lock holders name it) of ``name``."""
        return LockKeys.build(self.prefix, name)

    def ensure_schema(self) -> None:
        """Create the tables and sequence if they are missing (see :mod:`.schema`)."""
        statements: list[tuple[str, Any]] = [
            ("SELECT pg_advisory_xact_lock(%s)", (self.schema.advisory_key,))
        ]
        statements += [(sql, None) for sql in self.schema.ddl()]
        self.connections.transaction(statements, self.schema.leases)
        self._ready = True

    def ready(self) -> None:
        """Create the tables now if they are not known to exist (an enqueue's marker may be
        the first statement a process sends)."""
        if not self._ready:
            self.ensure_schema()

    # -- acquire ------------------------------------------------------------------------------

    def prepare(self, request: AcquireRequest) -> PreparedAcquire:
        """``request``, checked once, for many calls (see :mod:`..acquire_request`)."""
        acquire_request.check(request, POSTGRES, self.prefix)
        return GeneralAcquire(self, request)

    def acquire(self, request: AcquireRequest) -> AcquireOutcome:
        """Take the lock ``request.name`` in one statement (see the module).

        Raises:
            AlreadyFinished: with ``unless_finished``, the task id's finish record exists.
            LockBackendUnavailable: the database could not be reached.
            LockConfigurationError: an option :data:`POSTGRES` excludes.
        """
        acquire_request.check(request, POSTGRES, self.prefix)
        owner = request.owner or Owner()
        check_call(request, owner, request.max_lifetime)
        if not self._ready:
            self.ensure_schema()
        name = request.name
        keys = self.keys(name)
        token = request.token or new_token()
        if request.park is not None:  # policies queue, replace, restart: parking.py, latest.py
            if request.latest is not None:
                return self.latest.acquire(request, owner, token)
            return self.queue.acquire(request, owner, token)
        if request.limit != 1 or request.rate is not None:  # admission: one of N slots
            return self.slots.acquire(request, owner, keys)
        params = {
            "prefix": self.prefix,
            "name": name,
            "token": token,
            "pid": owner.pid,
            "host": owner.host,
            "task_id": owner.task_id,
            "ttl_ms": _ms(request.ttl),
            "fencing": request.fencing,
            "unless_finished": request.unless_finished,
        }
        sql = self.statements.acquire
        if request.take_queued:  # admission: the marker deleted in the same statement
            sql = self.markers.acquire_sql
            params["queued_while_held"] = request.queued_while_held
        clock = self.renewer.clock
        for _ in range(ATTEMPTS):
            sent_at = clock()
            rows = self.connections.run(sql, params, keys.lock)
            if rows:
                break
        else:
            return LockHolder.unknown(keys.lock)
        state, *fields = rows[0]
        if state == "finished":
            raise already_finished(keys, owner)
        if state == "held":
            return holder_of(keys.lock, tuple(fields))
        return self._lease(request, keys, token, owner, fields[0], sent_at)

    def _lease(
        self,
        request: AcquireRequest,
        keys: LockKeys,
        token: str,
        owner: Owner,
        fence: Optional[int],
        sent_at: float,
    ) -> Lease:
        """The lease ``owner`` took with ``token`` (its statement sent at ``sent_at``)."""
        max_lifetime = request.max_lifetime
        log.debug("acquired %s (fence=%s)", keys.lock, fence)
        return Lease(
            locker=self,
            keys=keys,
            token=token,
            ttl=request.ttl,
            owner=owner,
            fence=fence,
            confirmed_at=sent_at,
            deadline=None if max_lifetime is None else sent_at + max_lifetime,
            on_lost=request.on_lost,
            renewer=self.renewer if request.renew else None,
        )

    # -- release ------------------------------------------------------------------------------

    def release(self, lease: Lease, *, remember_for: Optional[float] = None) -> bool:
        """Free ``lease``'s lock if its token still holds it, NOTIFY the release, and with
        ``remember_for`` write the task id's finish record for that long; True if it was
        still ours.

        Raises:
            LockBackendUnavailable: the database could not be reached; the lease is no longer
                ``held`` but keeps its token, so ``release`` may be called again.
        """
        return self._release(lease, self.statements.release, remember_for, {})

    def release_cooling(
        self, lease: Lease, cooldown: float, *, remember_for: Optional[float] = None
    ) -> bool:
        """Release ``lease`` (as :meth:`release` does, ``remember_for`` too), leaving its row
        taken for ``cooldown`` seconds: True if it was still ours (its cooldown then began),
        False if not (nothing changed).

        Raises:
            LockBackendUnavailable: the database could not be reached; the lease keeps its
                token, so the release may be sent again.
        """
        cooling = {"cooldown_ms": _ms(cooldown)}
        return self._release(lease, self.statements.release_cooling, remember_for, cooling)

    def _release(
        self, lease: Lease, sql: str, remember_for: Optional[float], more: dict[str, Any]
    ) -> bool:
        if not lease.releasing():
            return False
        keys = lease.keys
        params = {
            "prefix": self.prefix,
            "name": row_name(keys),  # a slot's row (admission)
            "lock": keys.name,
            "token": lease.token,
            "task_id": lease.owner.task_id,
            "remember_ms": 0 if not remember_for else _ms(remember_for),
            "channel": self.schema.channel,
            "key": announced(keys),  # the lock's key, whichever slot (admission)
            **more,
        }
        try:
            rows = self.connections.run(sql, params, lease.key)
        except LockError:
            lease.not_released()
            raise
        return bool(rows and rows[0][0])

    def release_later(
        self,
        lease: Lease,
        then: Callable[[Optional[bool], Optional[LockError]], None],
        *,
        remember_for: Optional[float] = None,
    ) -> bool:
        """False: every release here waits for its reply; the caller calls :meth:`release`."""
        return False

    def settle(self) -> None:
        """Nothing to read: no release is sent without waiting here."""

    def release_all(self) -> int:
        """See :func:`..checks.release_all`."""
        return checks.release_all(self)

    def release_abandoned(
        self, name: str, *, task_id: str, host: str, pid: int, slot: Optional[int] = None
    ) -> bool:
        """Free the lock ``name`` (its ``slot``) of a dead execution, matched by its owner
        fields; True if it was held by that owner."""
        key = self.keys(name).lock
        params = {
            "prefix": self.prefix,
            "name": slot_row(name, 1 if slot is None else slot),  # admission: the slot's row
            "task_id": task_id,
            "host": host,
            "pid": pid,
            "channel": self.schema.channel,
            "key": key,
        }
        rows = self.connections.run(self.statements.release_abandoned, params, key)
        return bool(rows and rows[0][0])

    # -- renew --------------------------------------------------------------------------------

    def renew_batch(self, leases: Sequence[Lease], *, now: float) -> list[int]:
        """Renew ``leases`` in ONE statement; the indices of those NOT renewed (lost). Each
        lease runs ``ttl`` from the server's now, capped at its deadline."""
        if not leases:
            return []
        params = {
            "prefix": self.prefix,
            "names": [row_name(lease.keys) for lease in leases],  # a slot's row (admission)
            "tokens": [lease.token for lease in leases],
            "ttls": [
                lease.ttl_ms
                if lease.deadline is None
                else _ms(min(lease.ttl, lease.deadline - now))
                for lease in leases
            ],
        }
        rows = self.connections.run(self.statements.renew_batch, params, leases[0].key)
        return [int(index) - 1 for (index,) in rows]

    def renew_by_owner(
        self, held: Sequence[tuple[str, Owner, float]], *, limits: Optional[Sequence[int]] = None
    ) -> list[int]:
        """Renew, in ONE statement, each lock ``name`` held by exactly ``owner``, for ``ttl``
        seconds; the indices (into ``held``) of those NOT renewed. For a supervisor keeping
        its children's locks alive; ``limits``: each lock's ``lock_limit``, whose slot the
        owner holds is not known here, so each of its slots' rows is matched."""
        if not held:
            return []
        if limits is not None and any(limit != 1 for limit in limits):  # admission
            return self._renew_slots_by_owner(held, limits)
        params = {
            "prefix": self.prefix,
            "names": [name for name, _, _ in held],
            "pids": [owner.pid for _, owner, _ in held],
            "hosts": [owner.host for _, owner, _ in held],
            "task_ids": [owner.task_id for _, owner, _ in held],
            "ttls": [_ms(ttl) for _, _, ttl in held],
        }
        key = self.keys(held[0][0]).lock
        rows = self.connections.run(self.statements.renew_by_owner, params, key)
        return [int(index) - 1 for (index,) in rows]

    def _renew_slots_by_owner(
        self, held: Sequence[tuple[str, Owner, float]], limits: Sequence[int]
    ) -> list[int]:
        """:meth:`renew_by_owner` of locks with slots: every slot's row of each, one
        statement; a lock is lost when none of its rows was renewed."""
        rows: list[tuple[str, Owner, float]] = []
        of: list[int] = []
        for index, ((name, owner, ttl), limit) in enumerate(zip(held, limits)):
            for slot in range(1, limit + 1):
                rows.append((slot_row(name, slot), owner, ttl))
                of.append(index)
        lost_rows = set(self.renew_by_owner(rows))
        renewed = {of[row] for row in range(len(rows)) if row not in lost_rows}
        return [index for index in range(len(held)) if index not in renewed]

    # -- waiting for a release ----------------------------------------------------------------

    def subscribe_releases(self, name: str) -> PostgresSubscription:
        """A subscription to the release of ``name`` (``LISTEN``, see :mod:`.releases`).

        Raises:
            LockBackendUnavailable: the database could not be reached.
        """
        return PostgresSubscription(self.connections, self.schema.channel, self.keys(name).lock)

    def probe(self) -> Optional[LockError]:
        """None if the database answers and the tables exist (made now if missing); else why
        not (``LockBackendUnavailable``: out of reach or refused the login)."""
        started = time.monotonic()
        try:
            self.ensure_schema()
        except LockError as exc:
            return exc
        log.debug("PostgreSQL lock server answered in %.3fs", time.monotonic() - started)
        return None

    def close(self) -> None:
        """Close this process's connections."""
        self.connections.close()
