-- singleton_lock_take_slot_v1: take one of p_limit slots of a lock, within its rate and live
-- cap (lock_limit, lock_rate, a live cap), as lua/acquire_slot.lua is on Redis. Serialized per
-- lock name by a transaction advisory lock (never a session one: PgBouncer's transaction
-- pooling), so two calls never both count a slot free; the statements after it read the rows
-- anew (PL/pgSQL takes a snapshot per statement), and the time is read after it
-- (clock_timestamp()), so a call that waited counts what the one before it wrote.
-- Slot 1 is the lock's own row (name), slot k > 1 the row '{name}:slot:k' (a name no lock can
-- have: lock names have no braces), as the Redis keys are laid out.
-- Args     prefix, name; token, pid, host, task_id of the owner; ttl_ms; fencing (draw a
--          fence); limit (N slots); rate (starts per window, NULL for none); window_ms;
--          unless_finished (look for the task id's finish record first); cap_key (the live
--          cap's key, '' for none)
-- Returns  one row (state, slot, fence, pid, host, task_id, acquired_at, left_s):
--          'acquired': the slot, its fence (also when this token holds a slot already: a
--                      resend).
--          'finished': the task id's finish record lives.
--          'rate':     left_s, the seconds until a start is allowed (also when the live cap
--                      allows none and no slot is held).
--          'held':     the holder whose lease ends first.
CREATE FUNCTION __schema__.singleton_lock_take_slot_v1(
    p_prefix text, p_name text, p_token text, p_pid integer, p_host text, p_task_id text,
    p_ttl_ms bigint, p_fencing boolean, p_limit integer, p_rate integer, p_window_ms bigint,
    p_unless_finished boolean, p_cap_key text)
RETURNS TABLE (state text, slot integer, fence bigint, pid integer, host text,
    task_id text, acquired_at float8, left_s float8)
LANGUAGE plpgsql AS $$
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
    IF p_unless_finished AND EXISTS (SELECT 1 FROM __schema__.singleton_lock_finished f
            WHERE f.prefix = p_prefix AND f.name = p_name AND f.task_id = p_task_id
            AND f.until > now()) THEN
        RETURN QUERY SELECT 'finished'::text, NULL::integer, NULL::bigint, NULL::integer,
            NULL::text, NULL::text, NULL::float8, NULL::float8;
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtextextended(p_prefix || ':{' || p_name || '}', 34));
    v_now := clock_timestamp();
    v_names := ARRAY[p_name] || ARRAY(
        SELECT '{' || p_name || '}:slot:' || k FROM generate_series(2, p_limit) AS k);
    -- a resend after a lost reply: the slot this token took already
    RETURN QUERY SELECT 'acquired'::text, array_position(v_names, l.name), l.fence,
            NULL::integer, NULL::text, NULL::text, NULL::float8, NULL::float8
        FROM __schema__.singleton_lock_leases l WHERE l.prefix = p_prefix AND l.name = ANY(v_names)
            AND l.token = p_token AND l.lease_until > v_now;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) INTO v_taken FROM __schema__.singleton_lock_leases l
        WHERE l.prefix = p_prefix AND l.name = ANY(v_names) AND l.lease_until > v_now;
    IF v_taken < p_limit AND p_cap_key <> '' THEN
        SELECT c.cap INTO v_cap FROM __schema__.singleton_lock_caps c WHERE c.key = p_cap_key;
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
        DELETE FROM __schema__.singleton_lock_starts s
            WHERE s.prefix = p_prefix AND s.name = p_name AND s.at <= v_now - v_window;
        SELECT count(*), min(s.at) INTO v_count, v_oldest FROM __schema__.singleton_lock_starts s
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
            WHERE NOT EXISTS (SELECT 1 FROM __schema__.singleton_lock_leases l WHERE l.prefix = p_prefix
                AND l.name = v_names[k] AND l.lease_until > v_now);
    END IF;
    IF v_free IS NOT NULL THEN
        -- the fence is drawn under the advisory lock: increasing in the order slots are taken
        INSERT INTO __schema__.singleton_lock_leases AS l
            (prefix, name, token, pid, host, task_id, acquired_at, lease_until, fence)
        VALUES (p_prefix, v_names[v_free], p_token, p_pid, p_host, p_task_id, v_now,
            v_now + p_ttl_ms * interval '1 millisecond',
            CASE WHEN p_fencing THEN nextval('__schema__.singleton_lock_fence') END)
        ON CONFLICT (prefix, name) DO UPDATE SET
            token = excluded.token, pid = excluded.pid, host = excluded.host,
            task_id = excluded.task_id, acquired_at = excluded.acquired_at,
            lease_until = excluded.lease_until, fence = excluded.fence
        WHERE l.lease_until <= v_now
        RETURNING l.fence INTO v_fence;
        IF FOUND THEN
            IF p_rate IS NOT NULL THEN
                INSERT INTO __schema__.singleton_lock_starts (prefix, name, at, token, until)
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
        FROM __schema__.singleton_lock_leases l WHERE l.prefix = p_prefix AND l.name = ANY(v_names)
            AND l.lease_until > v_now
        ORDER BY l.lease_until LIMIT 1;
END
$$;
