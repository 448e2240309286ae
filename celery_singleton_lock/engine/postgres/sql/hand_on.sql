-- singleton_lock_hand_on_v2: the release of a lock whose duplicates queue or wait as the newest
-- ('release'), a sweeper's step ('sweep') or the drop of a parked id that will never run
-- ('drop'), each followed by the hand-off of the lock, if it is free and no debounce holds
-- the waiting call back (lock_debounce: not before its due time), to the parked id whose
-- turn is next (turn.sql: by rank, then arrival; with lock_fair_by, round robin across values,
-- a value's turn to its call of the highest rank), reserved for it for reserve_ms, its
-- message returned; or ('sent') the word that a handed
-- id's message was published: its reservation, made short so that a death before the
-- publish stalls nobody for long, now lives reserve_ms from now. As lua/hand_on_slots.lua
-- and lua/release_latest.lua are on Redis, for a mutex.
-- Args     prefix, name; mode; subject ('release': the owner's token; 'drop', 'sent': the
--          task id); reserve_ms; remember_ms ('release': write the finish record of
--          finish_task_id for that long, 0 none); channel, key (NOTIFY of the release)
-- Returns  one row (done, handed): done 1 when released ('release': 0 if the token did not
--          hold the lock: nothing released), dropped ('drop': 0 if the id was neither parked
--          nor reserved for), swept, or 'sent' (0 if the lock is not reserved for the id);
--          handed the message of the id just handed the lock (NULL if none; never on 'sent').
CREATE FUNCTION __schema__.singleton_lock_hand_on_v2(
    p_prefix text, p_name text, p_mode text, p_subject text, p_reserve_ms bigint,
    p_remember_ms bigint, p_finish_task_id text, p_channel text, p_key text)
RETURNS TABLE (done integer, handed bytea)
LANGUAGE plpgsql AS $$
DECLARE
    handoff CONSTANT text := 'handoff-reserved-for-next-parked';
    l __schema__.singleton_lock_leases;
    live boolean;
    v_done integer := 1;
    head record;
BEGIN
    l := __schema__.singleton_lock_row_v1(p_prefix, p_name);
    live := l.lease_until > now();
    IF p_mode = 'release' THEN
        IF NOT live OR l.token <> p_subject THEN
            RETURN QUERY SELECT 0, NULL::bytea;
            RETURN;
        END IF;
        IF p_remember_ms > 0 THEN
            INSERT INTO __schema__.singleton_lock_finished AS f (prefix, name, task_id, until)
            VALUES (p_prefix, p_name, p_finish_task_id,
                now() + p_remember_ms * interval '1 millisecond')
            ON CONFLICT (prefix, name, task_id) DO UPDATE SET until = excluded.until;
        END IF;
        UPDATE __schema__.singleton_lock_leases x SET token = '', pid = NULL, host = '',
            task_id = '', lease_until = '-infinity'
        WHERE x.prefix = p_prefix AND x.name = p_name;
        PERFORM pg_notify(p_channel, p_key);
        live := false;
    ELSIF p_mode = 'drop' THEN
        DELETE FROM __schema__.singleton_lock_parked p
        WHERE p.prefix = p_prefix AND p.name = p_name AND p.task_id = p_subject;
        v_done := CASE WHEN FOUND THEN 1 ELSE 0 END;
        IF live AND l.token = handoff AND l.task_id = p_subject THEN
            UPDATE __schema__.singleton_lock_leases x SET token = '', pid = NULL, host = '',
                task_id = '', lease_until = '-infinity'
            WHERE x.prefix = p_prefix AND x.name = p_name;
            live := false;
            v_done := 1;
        END IF;
    ELSIF p_mode = 'sent' THEN
        IF live AND l.token = handoff AND l.task_id = p_subject THEN
            UPDATE __schema__.singleton_lock_leases x
            SET lease_until = now() + p_reserve_ms * interval '1 millisecond'
            WHERE x.prefix = p_prefix AND x.name = p_name;
            RETURN QUERY SELECT 1, NULL::bytea;
        ELSE
            RETURN QUERY SELECT 0, NULL::bytea;
        END IF;
        RETURN;
    END IF;
    IF live OR EXISTS (SELECT 1 FROM __schema__.singleton_lock_latest x
                       WHERE x.prefix = p_prefix AND x.name = p_name AND x.due > now()) THEN
        -- held, or a debounced call waits for its due time (the sweeper hands it on then)
        RETURN QUERY SELECT v_done, NULL::bytea;
        RETURN;
    END IF;
    SELECT t.t_task_id, t.t_message INTO head
    FROM __schema__.singleton_lock_turn_v1(p_prefix, p_name) t;
    IF FOUND THEN
        PERFORM __schema__.singleton_lock_reserve_v1(p_prefix, p_name, head.t_task_id,
            p_reserve_ms);
        RETURN QUERY SELECT v_done, head.t_message;
    ELSE
        RETURN QUERY SELECT v_done, NULL::bytea;
    END IF;
END
$$;
