"""The SQL of the queue parts on PostgreSQL (policies ``queue``, ``replace``, ``restart``) for
the tables of a :class:`~.schema.Schema`: the calls of the functions of ``sql/*.sql``
and the plain statements beside them, one per operation (one round trip).

What a sweeper should look at is not kept in an index, as on Redis: it is read from the state
itself (a lock with parked calls whose lease is not live), so no write keeps it up to date.
"""

from __future__ import annotations

from celery_singleton_lock.engine.postgres.schema import Schema

_OWNER = "%(prefix)s, %(name)s, %(token)s, %(pid)s, %(host)s, %(task_id)s, %(ttl_ms)s, "
_OWNER += "%(fencing)s, %(unless_finished)s, %(message)s"


class QueueStatements:
    """The statements of the queue parts in one schema (formatted once)."""

    def __init__(self, schema: Schema) -> None:
        s = schema.name
        leases = schema.leases
        parked, superseded = f"{s}.singleton_lock_parked", f"{s}.singleton_lock_superseded"
        cancels = f"{s}.singleton_lock_cancels"
        function = schema.functions
        #: sql/park.sql
        self.park = (
            f"SELECT * FROM {function['park']}({_OWNER}, %(reserve_ms)s, %(fair)s, %(rank)s)"
        )
        #: sql/latest.sql
        self.latest = (
            f"SELECT * FROM {function['latest']}({_OWNER}, %(keep_ms)s, %(grace_ms)s, "
            "%(sent)s, %(debounce_ms)s, %(debounce_max_ms)s)"
        )
        #: sql/hand_on.sql
        self.hand_on = (
            f"SELECT * FROM {function['hand_on']}(%(prefix)s, %(name)s, %(mode)s, "
            "%(subject)s, %(reserve_ms)s, %(remember_ms)s, %(task_id)s, %(channel)s, %(key)s)"
        )
        #: The names (at most ``limit``) of the locks with calls parked behind a lease that is
        #: not live (its holder ended without handing on, died, or a reservation ran out) and
        #: no debounce holding them back, then one row (NULL name) with the seconds until the
        #: next live lease with parked calls runs out or debounce ends (NULL: none).
        self.due = f"""
WITH waiting AS (
    SELECT w.name, l.lease_until, x.due FROM (
        SELECT DISTINCT p.name FROM {parked} p WHERE p.prefix = %(prefix)s) w
    LEFT JOIN {leases} l ON l.prefix = %(prefix)s AND l.name = w.name
    LEFT JOIN {s}.singleton_lock_latest x ON x.prefix = %(prefix)s AND x.name = w.name
), due AS (
    SELECT w.name FROM waiting w
    WHERE (w.lease_until IS NULL OR w.lease_until <= now())
        AND (w.due IS NULL OR w.due <= now())
    ORDER BY w.name LIMIT %(limit)s
)
SELECT due.name, NULL::float8 FROM due
UNION ALL
SELECT NULL, extract(epoch FROM min(greatest(w.lease_until, w.due)) - now())::float8
FROM waiting w
WHERE w.lease_until > now() OR w.due > now()"""
        #: How many calls are parked behind the lock.
        self.parked_count = f"""
SELECT count(*) FROM {parked} p WHERE p.prefix = %(prefix)s AND p.name = %(name)s"""
        #: The task ids parked behind the lock, in the order they are handed it.
        self.parked_ids = f"""
SELECT p.task_id FROM {parked} p WHERE p.prefix = %(prefix)s AND p.name = %(name)s
ORDER BY p.round, p.arrival"""
        #: The locks with parked calls (at most ``limit``, by name): each one's count and
        #: whether its lease is live (held or reserved for a handed call).
        self.parked_locks = f"""
SELECT p.name, count(*), EXISTS (SELECT 1 FROM {leases} l WHERE l.prefix = %(prefix)s
    AND l.name = p.name AND l.lease_until > now())
FROM {parked} p WHERE p.prefix = %(prefix)s
GROUP BY p.name ORDER BY p.name LIMIT %(limit)s"""
        #: The call waiting behind a lock whose newest call wins, and its due time (epoch
        #: seconds; NULL without a debounce).
        self.waiting_newest = f"""
SELECT x.newest, extract(epoch FROM x.due)::float8 FROM {s}.singleton_lock_latest x
WHERE x.prefix = %(prefix)s AND x.name = %(name)s AND EXISTS (
    SELECT 1 FROM {parked} p WHERE p.prefix = x.prefix AND p.name = x.name
        AND p.task_id = x.newest)"""
        #: How many calls are parked behind each lock of a batch (names as an array).
        self.parked_counts = f"""
SELECT (SELECT count(*) FROM {parked} p WHERE p.prefix = %(prefix)s AND p.name = b.name)
FROM unnest(%(names)s::text[]) WITH ORDINALITY AS b(name, i) ORDER BY b.i"""
        #: Displaced calls left to mark whose grace ran out: (lock name, their messages) of
        #: at most ``limit`` locks.
        self.superseded_left = f"""
WITH due AS (
    SELECT DISTINCT s.name FROM {superseded} s
    WHERE s.prefix = %(prefix)s AND s.message IS NOT NULL AND s.mark_after <= now()
    LIMIT %(limit)s
)
SELECT s.name, array_agg(s.message) FROM {superseded} s JOIN due ON due.name = s.name
WHERE s.prefix = %(prefix)s AND s.message IS NOT NULL GROUP BY s.name"""
        #: The displaced calls ``task_ids`` were marked: no longer left to mark; a sweeper
        #: looks at the others ``look_ms`` from now (0: unchanged). How many are still left.
        self.clear_superseded = f"""
WITH cleared AS (
    UPDATE {superseded} s SET message = NULL
    WHERE s.prefix = %(prefix)s AND s.name = %(name)s AND s.task_id = ANY(%(task_ids)s)
    RETURNING 1
), later AS (
    UPDATE {superseded} s SET mark_after = now() + %(look_ms)s * interval '1 millisecond'
    WHERE %(look_ms)s > 0 AND s.prefix = %(prefix)s AND s.name = %(name)s
        AND s.message IS NOT NULL AND NOT (s.task_id = ANY(%(task_ids)s))
    RETURNING 1
)
SELECT count(*) FROM {superseded} s
WHERE s.prefix = %(prefix)s AND s.name = %(name)s AND s.message IS NOT NULL
    AND NOT (s.task_id = ANY(%(task_ids)s))"""
        #: Flag the running holder of the lock (a hex token: not a reservation) unless it is
        #: ``by``; its task id, or no row.
        self.cancel_holder = f"""
WITH holder AS (
    SELECT l.task_id FROM {leases} l
    WHERE l.prefix = %(prefix)s AND l.name = %(name)s AND l.lease_until > now()
        AND l.token ~ '^[0-9a-f]+$' AND l.task_id <> '' AND l.task_id <> %(by)s
)
INSERT INTO {cancels} AS c (prefix, name, task_id, until)
SELECT %(prefix)s, %(name)s, holder.task_id, now() + %(ttl_ms)s * interval '1 millisecond'
FROM holder
ON CONFLICT (prefix, name) DO UPDATE SET task_id = excluded.task_id, until = excluded.until
RETURNING c.task_id"""
        #: For each (name, task id) of a batch: whether that call was asked to stop.
        self.cancel_requested = f"""
SELECT EXISTS (SELECT 1 FROM {cancels} c WHERE c.prefix = %(prefix)s AND c.name = b.name
    AND c.task_id = b.task_id AND c.until > now())
FROM unnest(%(names)s::text[], %(task_ids)s::text[]) WITH ORDINALITY AS b(name, task_id, i)
ORDER BY b.i"""
