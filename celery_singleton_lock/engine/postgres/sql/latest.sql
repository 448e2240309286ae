-- singleton_lock_latest_v1: the acquire of a task whose newest duplicate wins (policy replace,
-- restart, lock_debounce), as lua/acquire_or_replace.lua is on Redis: take the lock, or
-- become the one call that waits behind it, displacing the call that waited there, in one
-- statement. With a debounce a call waits even on a free lock, until its due time (the
-- sweeper hands it the lock then: sql/hand_on.sql). Calls are ordered by when they were SENT (their stamps, compared bytewise): one
-- sent before the newest that waits, holds or held the lock never waits or runs.
-- Args     prefix, name; token, pid, host, task_id of the owner; ttl_ms; fencing;
--          unless_finished; message (stored if it waits); keep_ms (how long superseded ids
--          and the newest stamp are kept); grace_ms (after a displacement, when a sweeper
--          marks the calls still left to mark); sent (this call's stamp, '' for none);
--          debounce_ms (0: none), debounce_max_ms (from the burst's first call; 0: none)
-- Returns  one row (state, fence, holder fields, position, displaced):
--          'acquired': taken (the lock was free with nothing waiting, or reserved for this
--                      id; or taken already by this token), with its fence.
--          'finished': the finish record exists; nothing changed.
--          'superseded': this task id was superseded (a stale copy), or was sent before the
--                      newest: now recorded as superseded and left to mark.
--          'copy': an execution of this very task id holds the lock (its fields).
--          'waiting': this call waits (or already waited: kept): the holder's fields (NULL
--                      when the lock is free: a holder ended without handing on, and a
--                      sweeper hands this call the lock at its next look), its 1-based
--                      position (2 behind a call whose reservation is on its way), and the
--                      messages of the calls it displaced, oldest first (they never run).
CREATE FUNCTION __schema__.singleton_lock_latest_v1(
    p_prefix text, p_name text, p_token text, p_pid integer, p_host text, p_task_id text,
    p_ttl_ms bigint, p_fencing boolean, p_unless_finished boolean, p_message bytea,
    p_keep_ms bigint, p_grace_ms bigint, p_sent text, p_debounce_ms bigint,
    p_debounce_max_ms bigint)
RETURNS TABLE (state text, fence bigint, h_pid integer, h_host text, h_task_id text,
    h_acquired float8, h_left float8, place bigint, displaced bytea[])
LANGUAGE plpgsql AS $$
DECLARE
    handoff CONSTANT text := 'handoff-reserved-for-next-parked';
    l __schema__.singleton_lock_leases;
    live boolean;
    take boolean := false;
    held boolean := false;
    v_ended text;
    v_reserved text;
    v_newest text;
    v_fence bigint;
    v_gone bytea[];
    v_place bigint;
    v_first timestamptz;
    v_due timestamptz;
    v_keep interval := p_keep_ms * interval '1 millisecond';
BEGIN
    v_ended := CASE
        WHEN p_unless_finished AND EXISTS (SELECT 1 FROM __schema__.singleton_lock_finished f
            WHERE f.prefix = p_prefix AND f.name = p_name AND f.task_id = p_task_id
                AND f.until > now()) THEN 'finished'
        WHEN EXISTS (SELECT 1 FROM __schema__.singleton_lock_superseded s
            WHERE s.prefix = p_prefix AND s.name = p_name AND s.task_id = p_task_id
                AND s.until > now()) THEN 'superseded' END;
    IF v_ended IS NOT NULL THEN
        RETURN QUERY SELECT v_ended, NULL::bigint, NULL::integer, NULL::text, NULL::text,
            NULL::float8, NULL::float8, NULL::bigint, NULL::bytea[];
        RETURN;
    END IF;
    l := __schema__.singleton_lock_row_v1(p_prefix, p_name);
    live := l.lease_until > now();
    IF live THEN
        IF l.token = p_token THEN
            RETURN QUERY SELECT 'acquired', l.fence, NULL::integer, NULL::text, NULL::text,
                NULL::float8, NULL::float8, NULL::bigint, NULL::bytea[];
            RETURN;
        ELSIF l.token = handoff AND l.task_id = p_task_id THEN
            take := true;  -- it was the newest sent when it was handed the lock
            v_reserved := p_task_id;
        ELSIF l.token = handoff THEN
            held := true;
            v_reserved := l.task_id;
        ELSIF l.task_id = p_task_id THEN
            RETURN QUERY SELECT 'copy', l.fence, l.pid, l.host, l.task_id,
                extract(epoch FROM l.acquired_at)::float8,
                extract(epoch FROM l.lease_until - now())::float8, NULL::bigint,
                NULL::bytea[];
            RETURN;
        ELSE
            held := true;
        END IF;
    ELSIF p_debounce_ms = 0 AND NOT EXISTS (SELECT 1 FROM __schema__.singleton_lock_parked p
                      WHERE p.prefix = p_prefix AND p.name = p_name) THEN
        take := true;
    END IF;
    SELECT x.sent INTO v_newest FROM __schema__.singleton_lock_latest x
    WHERE x.prefix = p_prefix AND x.name = p_name AND x.until > now();
    IF p_sent <> '' AND v_newest IS NOT NULL AND p_sent COLLATE "C" < v_newest COLLATE "C" THEN
        IF v_reserved IS DISTINCT FROM p_task_id THEN
            -- left to mark as a displaced call is: never PENDING for ever
            INSERT INTO __schema__.singleton_lock_superseded AS s
                (prefix, name, task_id, until, message, mark_after)
            VALUES (p_prefix, p_name, p_task_id, now() + p_keep_ms * interval '1 millisecond',
                p_message, now() + p_grace_ms * interval '1 millisecond')
            ON CONFLICT (prefix, name, task_id) DO UPDATE SET until = excluded.until,
                message = excluded.message, mark_after = excluded.mark_after;
            RETURN QUERY SELECT 'superseded', NULL::bigint, NULL::integer, NULL::text,
                NULL::text, NULL::float8, NULL::float8, NULL::bigint, NULL::bytea[];
            RETURN;
        END IF;
    ELSIF p_sent <> '' THEN
        INSERT INTO __schema__.singleton_lock_latest AS x (prefix, name, sent, until)
        VALUES (p_prefix, p_name, p_sent, now() + v_keep)
        ON CONFLICT (prefix, name) DO UPDATE SET sent = excluded.sent,
            until = greatest(x.until, excluded.until);
    END IF;
    IF take THEN
        v_fence := __schema__.singleton_lock_take_v1(p_prefix, p_name, p_token, p_pid, p_host,
            p_task_id, p_ttl_ms, p_fencing);
        IF NOT EXISTS (SELECT 1 FROM __schema__.singleton_lock_parked p
                       WHERE p.prefix = p_prefix AND p.name = p_name) THEN
            UPDATE __schema__.singleton_lock_latest x SET newest = NULL, first = NULL, due = NULL
            WHERE x.prefix = p_prefix AND x.name = p_name;  -- the burst is over
        END IF;
        RETURN QUERY SELECT 'acquired', v_fence, NULL::integer, NULL::text, NULL::text,
            NULL::float8, NULL::float8, NULL::bigint, NULL::bytea[];
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM __schema__.singleton_lock_parked p
                   WHERE p.prefix = p_prefix AND p.name = p_name AND p.task_id = p_task_id) THEN
        DELETE FROM __schema__.singleton_lock_superseded s
        WHERE s.prefix = p_prefix AND s.name = p_name AND s.until <= now();
        WITH gone AS (
            DELETE FROM __schema__.singleton_lock_parked p
            WHERE p.prefix = p_prefix AND p.name = p_name AND p.task_id <> p_task_id
                AND p.task_id IS DISTINCT FROM v_reserved
            RETURNING p.task_id, p.message, p.arrival
        ), recorded AS (
            INSERT INTO __schema__.singleton_lock_superseded AS s
                (prefix, name, task_id, until, message, mark_after)
            SELECT p_prefix, p_name, gone.task_id,
                now() + p_keep_ms * interval '1 millisecond', gone.message,
                now() + p_grace_ms * interval '1 millisecond'
            FROM gone
            ON CONFLICT (prefix, name, task_id) DO UPDATE SET until = excluded.until,
                message = excluded.message, mark_after = excluded.mark_after
        )
        SELECT coalesce(array_agg(gone.message ORDER BY gone.arrival), '{}') INTO v_gone
        FROM gone;
        INSERT INTO __schema__.singleton_lock_parked (prefix, name, task_id, arrival, message)
        VALUES (p_prefix, p_name, p_task_id, nextval('__schema__.singleton_lock_arrival'),
            p_message);
        IF p_debounce_ms > 0 THEN
            -- due a debounce from now, or at most debounce_max after the burst's first call
            v_first := now();
            IF cardinality(v_gone) > 0 THEN
                SELECT coalesce(x.first, now()) INTO v_first
                FROM __schema__.singleton_lock_latest x
                WHERE x.prefix = p_prefix AND x.name = p_name;
                v_first := coalesce(v_first, now());
            END IF;
            v_due := now() + p_debounce_ms * interval '1 millisecond';
            IF p_debounce_max_ms > 0 THEN
                v_due := least(v_due, v_first + p_debounce_max_ms * interval '1 millisecond');
            END IF;
        END IF;
        INSERT INTO __schema__.singleton_lock_latest AS x
            (prefix, name, until, newest, first, due)
        VALUES (p_prefix, p_name, greatest(now() + v_keep, v_due + interval '1 hour'),
            p_task_id, v_first, v_due)
        ON CONFLICT (prefix, name) DO UPDATE SET newest = excluded.newest,
            first = excluded.first, due = excluded.due,
            until = greatest(x.until, excluded.until);
    ELSE
        v_gone := '{}';
    END IF;
    SELECT count(*) INTO v_place FROM __schema__.singleton_lock_parked p,
        __schema__.singleton_lock_parked me
    WHERE me.prefix = p_prefix AND me.name = p_name AND me.task_id = p_task_id
        AND p.prefix = p_prefix AND p.name = p_name AND p.arrival <= me.arrival;
    IF held THEN
        RETURN QUERY SELECT 'waiting', l.fence, l.pid, l.host, l.task_id,
            extract(epoch FROM l.acquired_at)::float8,
            extract(epoch FROM l.lease_until - now())::float8, v_place, v_gone;
    ELSE
        RETURN QUERY SELECT 'waiting', NULL::bigint, NULL::integer, NULL::text, NULL::text,
            NULL::float8, NULL::float8, v_place, v_gone;
    END IF;
END
$$;
