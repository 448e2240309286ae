"""The SQL of the PostgreSQL backend, one statement per operation (one round trip, one
transaction), for the tables of a :class:`~.schema.Schema`.

Every statement takes its times from the server's clock (``now()``: the statement's own
transaction start), never from a worker's. A lease is live while ``lease_until > now()``.
"""

from __future__ import annotations

from celery_singleton_lock.engine.postgres.schema import Schema

#: the pid of a row in its cooldown (no process has it; see ``release_cooling``)
COOLDOWN_PID = -1

#: one row, the holder's fields, of the statements that read a lock
HOLDER = (
    "h.fence, h.pid, h.host, h.task_id, extract(epoch FROM h.acquired_at)::float8, "
    "extract(epoch FROM h.lease_until - now())::float8"
)


class Statements:
    """The statements of one schema (formatted once)."""

    def __init__(self, schema: Schema) -> None:
        leases, fence, finished = schema.leases, schema.fence, schema.finished
        #: Take a lock: insert its row, or take over a row whose lease ran out. ``fence`` is
        #: drawn from the sequence under the row lock when a row exists (the DO UPDATE), so
        #: fences of one name increase in the order the lock is taken; a fresh insert's fence
        #: (drawn before the insert) is only kept by the name's first holder ever, since a
        #: release keeps the row. The same statement answers who holds it otherwise, or that
        #: the task id's finish record exists (``unless_finished``). No row at all: another
        #: statement took the lock after this one's snapshot (the caller sends it again).
        self.acquire = f"""
WITH done AS (
    SELECT %(unless_finished)s AND EXISTS (
        SELECT 1 FROM {finished} f WHERE f.prefix = %(prefix)s AND f.name = %(name)s
        AND f.task_id = %(task_id)s AND f.until > now()) AS finished
), taken AS (
    INSERT INTO {leases} AS l
        (prefix, name, token, pid, host, task_id, acquired_at, lease_until, fence)
    SELECT %(prefix)s, %(name)s, %(token)s, %(pid)s, %(host)s, %(task_id)s, now(),
        now() + %(ttl_ms)s * interval '1 millisecond',
        CASE WHEN %(fencing)s THEN nextval('{fence}') END
    FROM done WHERE NOT done.finished
    ON CONFLICT (prefix, name) DO UPDATE SET
        token = excluded.token, pid = excluded.pid, host = excluded.host,
        task_id = excluded.task_id, acquired_at = excluded.acquired_at,
        lease_until = excluded.lease_until,
        fence = CASE WHEN %(fencing)s THEN nextval('{fence}') END
    WHERE l.lease_until <= now()
    RETURNING l.fence
)
SELECT 'acquired', taken.fence, NULL::integer, NULL::text, NULL::text, NULL::float8,
    NULL::float8 FROM taken
UNION ALL
SELECT 'finished', NULL, NULL, NULL, NULL, NULL, NULL FROM done WHERE done.finished
UNION ALL
SELECT 'held', {HOLDER} FROM {leases} h, done
WHERE h.prefix = %(prefix)s AND h.name = %(name)s AND NOT done.finished
    AND h.lease_until > now() AND NOT EXISTS (SELECT 1 FROM taken)"""
        #: Free the lock (or a slot's row: ``name``) if ``token`` still holds it (its row
        #: stays, see ``acquire``), write the finish record of the lock ``lock`` if asked,
        #: and NOTIFY the release, all in one transaction: a listener hears it only once the
        #: lock is free. Only a live lease: one run out is
        #: free already (as a Redis key gone at its TTL). Answers whether it was released.
        self.release = _release(
            leases,
            finished,
            "token = '', lease_until = '-infinity', pid = NULL, host = '', task_id = ''",
        )
        #: As ``release``, but the row left taken for ``lock_cooldown`` instead of freed: the
        #: token ``cooldown`` (no owner has it: tokens are 32 hex digits) and the pid -1 (no
        #: process has it), the holder fields of the run that ended, its lease the cooldown.
        #: An acquire finds it held (its time left the cooldown's), no one renews or releases
        #: it, and it is free when its lease runs out, as a crashed holder's is. NOTIFYed as
        #: any release: a waiter reads the row again and sleeps for the cooldown left.
        self.release_cooling = _release(
            leases,
            finished,
            f"token = 'cooldown', pid = {COOLDOWN_PID}, "
            "lease_until = now() + %(cooldown_ms)s * interval '1 millisecond'",
        )
        #: As ``release``, for the lock a dead execution left: matched by its owner fields
        #: (a supervisor knows no child's token); only a live lease.
        self.release_abandoned = f"""
WITH freed AS (
    UPDATE {leases} SET token = '', lease_until = '-infinity', pid = NULL, host = '',
        task_id = ''
    WHERE prefix = %(prefix)s AND name = %(name)s AND pid = %(pid)s AND host = %(host)s
        AND task_id = %(task_id)s AND lease_until > now()
    RETURNING 1
)
SELECT count(*), CASE WHEN count(*) > 0 THEN pg_notify(%(channel)s, %(key)s)::text END
FROM freed"""
        #: Renew every lease of a batch (names, tokens and TTLs as arrays) in one statement;
        #: the 1-based places of those NOT renewed (gone, run out, or taken over).
        self.renew_batch = f"""
WITH batch AS (
    SELECT * FROM unnest(%(names)s::text[], %(tokens)s::text[], %(ttls)s::bigint[])
        WITH ORDINALITY AS b(name, token, ttl_ms, i)
), renewed AS (
    UPDATE {leases} l SET lease_until = now() + b.ttl_ms * interval '1 millisecond'
    FROM batch b
    WHERE l.prefix = %(prefix)s AND l.name = b.name AND l.token = b.token
        AND l.lease_until > now()
    RETURNING b.i
)
SELECT b.i FROM batch b WHERE NOT EXISTS (SELECT 1 FROM renewed r WHERE r.i = b.i)"""
        #: As ``renew_batch``, each lock matched by its owner fields instead of a token.
        self.renew_by_owner = f"""
WITH batch AS (
    SELECT * FROM unnest(%(names)s::text[], %(pids)s::integer[], %(hosts)s::text[],
        %(task_ids)s::text[], %(ttls)s::bigint[])
        WITH ORDINALITY AS b(name, pid, host, task_id, ttl_ms, i)
), renewed AS (
    UPDATE {leases} l SET lease_until = now() + b.ttl_ms * interval '1 millisecond'
    FROM batch b
    WHERE l.prefix = %(prefix)s AND l.name = b.name AND l.pid = b.pid AND l.host = b.host
        AND l.task_id = b.task_id AND l.lease_until > now()
    RETURNING b.i
)
SELECT b.i FROM batch b WHERE NOT EXISTS (SELECT 1 FROM renewed r WHERE r.i = b.i)"""
        #: The live holder of one lock.
        self.read = f"""
SELECT h.name, {HOLDER} FROM {leases} h
WHERE h.prefix = %(prefix)s AND h.name = %(name)s AND h.lease_until > now()"""
        #: Every live lease under a prefix, by name, a page after ``after``.
        self.scan = f"""
SELECT h.name, {HOLDER} FROM {leases} h
WHERE h.prefix = %(prefix)s AND h.lease_until > now() AND h.name > %(after)s
ORDER BY h.name LIMIT %(count)s"""
        #: The sequence's last fence (0 before the first).
        self.fence = f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {fence}"
        # -- admission reads (lock_limit, dedupe_on_enqueue) ---------------------------------
        #: The live holders of some rows (a lock's slots, see rows.py).
        self.holders = f"""
SELECT h.name, {HOLDER} FROM {leases} h
WHERE h.prefix = %(prefix)s AND h.name = ANY(%(names)s) AND h.lease_until > now()"""
        #: For each lock name (in order): the starts its rate's window holds, and the seconds
        #: until the last of them leaves it (None without any).
        self.rate_use = f"""
SELECT count(s.until), extract(epoch FROM max(s.until) - now())::float8
FROM unnest(%(names)s::text[]) WITH ORDINALITY AS n(name, i)
LEFT JOIN {schema.starts} s ON s.prefix = %(prefix)s AND s.name = n.name AND s.until > now()
GROUP BY n.i ORDER BY n.i"""
        #: The names with a live queued marker under a prefix, a page after ``after``.
        self.queued_names = f"""
SELECT q.name FROM {schema.queued} q
WHERE q.prefix = %(prefix)s AND q.until > now() AND q.name > %(after)s
ORDER BY q.name LIMIT %(count)s"""


def _release(leases: str, finished: str, change: str) -> str:
    """A release that makes the ``change`` (an UPDATE's SET) to the row ``token`` holds live,
    writes the finish record if asked and NOTIFYs, in one statement: see ``release``."""
    return f"""
WITH released AS (
    UPDATE {leases} SET {change}
    WHERE prefix = %(prefix)s AND name = %(name)s AND token = %(token)s
        AND lease_until > now()
    RETURNING 1
), remembered AS (
    INSERT INTO {finished} (prefix, name, task_id, until)
    SELECT %(prefix)s, %(lock)s, %(task_id)s, now() + %(remember_ms)s * interval '1 millisecond'
    FROM released WHERE %(remember_ms)s > 0
    ON CONFLICT (prefix, name, task_id) DO UPDATE SET until = excluded.until
)
SELECT count(*), CASE WHEN count(*) > 0 THEN pg_notify(%(channel)s, %(key)s)::text END
FROM released"""
