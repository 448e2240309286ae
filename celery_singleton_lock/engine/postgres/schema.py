"""The tables, sequence and channel of the PostgreSQL backend in one schema, and the SQL that
creates them on first use.

In schema ``S`` (``public`` unless the URL says ``?schema=S``)::

    S.singleton_lock_leases    one row per lock name ever taken under a prefix:
                               (prefix, name) the key; token, pid, host, task_id its holder;
                               acquired_at and lease_until by the server's clock (now());
                               fence the holder's fencing token. A free lock keeps its row
                               (token '', lease_until '-infinity'): see locker.py for why
    S.singleton_lock_fence     the sequence the fences come from: strictly increasing,
                               never reused (a sequence survives a restart)
    S.singleton_lock_finished  finish records (prefix, name, task_id) until a time: the
                               release of an acks_late task remembers it ran to the end
    S.singleton_lock_starts    the body starts of locks with a lock_rate: (prefix, name, at,
                               token) and until when it counts (at + the window), trimmed
                               to the window at each admission (slots.py)
    S.singleton_lock_queued    queued markers of dedupe_on_enqueue: one row per lock name,
                               the task id queued and until when (markers.py)
    S.singleton_lock_caps      live caps (celery locks limit): an integer per cap key
    S.singleton_lock_take_slot_v1(...)
                               the admission of one of N slots (lock_limit, lock_rate, a live
                               cap), a PL/pgSQL function: one round trip, one transaction,
                               serialized per lock name (see slots.py)
    singleton_lock_released_S  the NOTIFY channel a release is announced on (payload: the lock
                               key), in the releasing statement's own transaction

The tables and functions of the parked calls (policies ``queue``, ``replace``, ``restart``)
are :mod:`.parking_ddl`'s.

Created with ``CREATE ... IF NOT EXISTS`` under a transaction-scoped advisory lock (which,
unlike a session one, works through PgBouncer's transaction pooling), so processes starting
together do not race on the catalog.
"""

from __future__ import annotations

import re
import zlib

from celery_singleton_lock.engine.postgres import parking_ddl
from celery_singleton_lock.errors import LockConfigurationError

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,39}$")


class Schema:
    """The names of the backend's objects in one PostgreSQL schema, and their DDL."""

    def __init__(self, name: str = "public") -> None:
        if not _SCHEMA_NAME.match(name):
            raise LockConfigurationError(
                f"PostgreSQL schema {name!r} for the locks is invalid: use 1-40 lower-case "
                "letters, digits and _ (not starting with a digit)"
            )
        self.name = name
        self.leases = f"{name}.singleton_lock_leases"
        self.fence = f"{name}.singleton_lock_fence"
        self.finished = f"{name}.singleton_lock_finished"
        # -- admission (lock_limit, lock_rate, lock_cooldown, dedupe_on_enqueue): slots.py,
        # markers.py
        self.starts = f"{name}.singleton_lock_starts"
        self.queued = f"{name}.singleton_lock_queued"
        self.caps = f"{name}.singleton_lock_caps"
        #: versioned: a new text gets a new name, so an existing function is never replaced
        #: (which only its owner may do) and processes of two versions each call their own
        self.take_slot = f"{name}.singleton_lock_take_slot_v1"
        # -- end of admission
        #: the NOTIFY channel of releases (one per schema; the payload names the lock)
        self.channel = f"singleton_lock_released_{name}"

    @property
    def advisory_key(self) -> int:
        """The transaction advisory lock the DDL runs under (a stable 32-bit number)."""
        return zlib.crc32(f"celery-singleton-lock:{self.name}".encode())

    def ddl(self) -> list[str]:
        """The statements that create what is missing (each ``IF NOT EXISTS``)."""
        schema = f"CREATE SCHEMA IF NOT EXISTS {self.name}"
        return [
            *([] if self.name == "public" else [schema]),
            f"""CREATE TABLE IF NOT EXISTS {self.leases} (
                prefix text NOT NULL,
                name text NOT NULL,
                token text NOT NULL,
                pid integer,
                host text NOT NULL DEFAULT '',
                task_id text NOT NULL DEFAULT '',
                acquired_at timestamptz,
                lease_until timestamptz NOT NULL,
                fence bigint,
                PRIMARY KEY (prefix, name)
            )""",
            f"CREATE SEQUENCE IF NOT EXISTS {self.fence}",
            f"""CREATE TABLE IF NOT EXISTS {self.finished} (
                prefix text NOT NULL,
                name text NOT NULL,
                task_id text NOT NULL,
                until timestamptz NOT NULL,
                PRIMARY KEY (prefix, name, task_id)
            )""",
            *self.admission_ddl(),
            # -- the queue parts (parked calls, latest wins, cancel flags): parking_ddl.py
            *parking_ddl.ddl(self.name),
        ]

    # -- admission (lock_limit, lock_rate, lock_cooldown, dedupe_on_enqueue) --------------------

    def admission_ddl(self) -> list[str]:
        """The tables and function of admission (see the module), each ``IF NOT EXISTS`` (the
        function created only if no function of its name and arguments exists)."""
        return [
            f"""CREATE TABLE IF NOT EXISTS {self.starts} (
                prefix text NOT NULL,
                name text NOT NULL,
                at timestamptz NOT NULL,
                token text NOT NULL,
                until timestamptz NOT NULL,
                PRIMARY KEY (prefix, name, at, token)
            )""",
            f"""CREATE TABLE IF NOT EXISTS {self.queued} (
                prefix text NOT NULL,
                name text NOT NULL,
                task_id text NOT NULL,
                until timestamptz NOT NULL,
                PRIMARY KEY (prefix, name)
            )""",
            f"""CREATE TABLE IF NOT EXISTS {self.caps} (
                key text PRIMARY KEY,
                cap integer NOT NULL
            )""",
            self._take_slot_function(),
        ]

    def _take_slot_function(self) -> str:
        """``take_slot``: take one of ``p_limit`` slots of a lock, within its rate and live
        cap. Serialized per lock name by a transaction advisory lock (never a session one:
        PgBouncer's transaction pooling), so two calls never both count a slot free; the
        statements after it read the rows anew (PL/pgSQL takes a snapshot per statement),
        and the time is read after it (``clock_timestamp()``), so a call that waited counts
        what the one before it wrote.

        Slot 1 is the lock's own row (``name``), slot k > 1 the row ``{name}:slot:k`` (a name
        no lock can have: lock names have no braces), as the Redis keys are laid out.

        Returns one row ``(state, slot, fence, pid, host, task_id, acquired_at, left)``:
        ``acquired`` (the slot, its fence; also when this token holds a slot already: a
        resend), ``finished`` (the task id's finish record lives), ``rate`` (``left``: the
        seconds until a start is allowed; also when the live cap allows none and no slot is
        held), ``held`` (the holder whose lease ends first).
        """
        leases, starts = self.leases, self.starts
        arguments = (
            "text, text, text, integer, text, text, bigint, boolean, integer, integer, bigint, "
            "boolean, text"
        )
        return f"""DO $do$ BEGIN
IF to_regprocedure('{self.take_slot}({arguments})') IS NULL THEN
EXECUTE $create$CREATE FUNCTION {self.take_slot}(
    p_prefix text, p_name text, p_token text, p_pid integer, p_host text, p_task_id text,
    p_ttl_ms bigint, p_fencing boolean, p_limit integer, p_rate integer, p_window_ms bigint,
    p_unless_finished boolean, p_cap_key text)
RETURNS TABLE (state text, slot integer, fence bigint, pid integer, host text,
    task_id text, acquired_at float8, left_s float8)
LANGUAGE plpgsql AS $fn$
#variable_conflict use_column
DECLARE
    v_now timestamptz;
    v_names text[];
    v_free integer;
    v_taken integer;
    v_cap integer;
    v_count integer;
    v_oldest timestamptz;
    v_fence bigint;
    v_window interval := p_window_ms * interval '1 millisecond';
BEGIN
    IF p_unless_finished AND EXISTS (SELECT 1 FROM {self.finished} f
            WHERE f.prefix = p_prefix AND f.name = p_name AND f.task_id = p_task_id
            AND f.until > now()) THEN
        RETURN QUERY SELECT 'finished'::text, NULL::integer, NULL::bigint, NULL::integer,
            NULL::text, NULL::text, NULL::float8, NULL::float8;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(p_prefix || ':{{' || p_name || '}}', 34));
    v_now := clock_timestamp();
    v_names := ARRAY[p_name] || ARRAY(
        SELECT '{{' || p_name || '}}:slot:' || k FROM generate_series(2, p_limit) AS k);
    -- a resend after a lost reply: the slot this token took already
    RETURN QUERY SELECT 'acquired'::text, array_position(v_names, l.name), l.fence,
            NULL::integer, NULL::text, NULL::text, NULL::float8, NULL::float8
        FROM {leases} l WHERE l.prefix = p_prefix AND l.name = ANY(v_names)
            AND l.token = p_token AND l.lease_until > v_now;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_taken FROM {leases} l
        WHERE l.prefix = p_prefix AND l.name = ANY(v_names) AND l.lease_until > v_now;
    IF v_taken < p_limit AND p_cap_key <> '' THEN
        SELECT c.cap INTO v_cap FROM {self.caps} c WHERE c.key = p_cap_key;
        IF v_cap IS NOT NULL AND v_taken >= v_cap THEN
            IF v_taken = 0 THEN  -- capped with no slot held: nothing to name
                RETURN QUERY SELECT 'rate'::text, NULL::integer, NULL::bigint, NULL::integer,
                    NULL::text, NULL::text, NULL::float8, 1.0::float8;
                RETURN;
            END IF;
            v_taken := p_limit;
        END IF;
    END IF;
    IF v_taken < p_limit AND p_rate IS NOT NULL THEN
        DELETE FROM {starts} s
            WHERE s.prefix = p_prefix AND s.name = p_name AND s.at <= v_now - v_window;
        SELECT count(*), min(s.at) INTO v_count, v_oldest FROM {starts} s
            WHERE s.prefix = p_prefix AND s.name = p_name;
        IF v_count >= p_rate THEN
            RETURN QUERY SELECT 'rate'::text, NULL::integer, NULL::bigint, NULL::integer,
                NULL::text, NULL::text, NULL::float8,
                greatest(0.001, extract(epoch FROM v_oldest + v_window - v_now))::float8;
            RETURN;
        END IF;
    END IF;
    IF v_taken < p_limit THEN
        SELECT min(k) INTO v_free FROM generate_series(1, p_limit) AS k
            WHERE NOT EXISTS (SELECT 1 FROM {leases} l WHERE l.prefix = p_prefix
                AND l.name = v_names[k] AND l.lease_until > v_now);
    END IF;
    IF v_free IS NOT NULL THEN
        -- the fence is drawn under the advisory lock: increasing in the order slots are taken
        INSERT INTO {leases} AS l
            (prefix, name, token, pid, host, task_id, acquired_at, lease_until, fence)
        VALUES (p_prefix, v_names[v_free], p_token, p_pid, p_host, p_task_id, v_now,
            v_now + p_ttl_ms * interval '1 millisecond',
            CASE WHEN p_fencing THEN nextval('{self.fence}') END)
        ON CONFLICT (prefix, name) DO UPDATE SET
            token = excluded.token, pid = excluded.pid, host = excluded.host,
            task_id = excluded.task_id, acquired_at = excluded.acquired_at,
            lease_until = excluded.lease_until, fence = excluded.fence
        WHERE l.lease_until <= v_now
        RETURNING l.fence INTO v_fence;
        IF FOUND THEN
            IF p_rate IS NOT NULL THEN
                INSERT INTO {starts} (prefix, name, at, token, until)
                VALUES (p_prefix, p_name, v_now, p_token, v_now + v_window)
                ON CONFLICT DO NOTHING;
            END IF;
            RETURN QUERY SELECT 'acquired'::text, v_free, v_fence, NULL::integer,
                NULL::text, NULL::text, NULL::float8, NULL::float8;
            RETURN;
        END IF;
    END IF;
    -- every slot held (or as many as the live cap allows): the holder that frees first
    RETURN QUERY SELECT 'held'::text, array_position(v_names, l.name), l.fence, l.pid,
            l.host, l.task_id, extract(epoch FROM l.acquired_at)::float8,
            extract(epoch FROM l.lease_until - v_now)::float8
        FROM {leases} l WHERE l.prefix = p_prefix AND l.name = ANY(v_names)
            AND l.lease_until > v_now
        ORDER BY l.lease_until LIMIT 1;
END
$fn$$create$;
END IF;
END $do$"""
