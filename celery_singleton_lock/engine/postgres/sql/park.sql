-- singleton_lock_park_v2: the acquire of a task whose duplicates queue (a mutex: one holder), as
-- lua/acquire_slot_or_park.lua is on Redis: take the lock, or park this task id's message
-- behind it, in one statement: by its rank, then in arrival order (with a fairness value, in
-- its value's next round: tables.sql). A free lock goes to the parked call whose turn is next
-- (turn.sql: it is reserved for that id here, and its message returned for the caller to
-- publish), not to a newer caller; a lock reserved for this id is taken over (a reservation:
-- reserve.sql).
-- Args     prefix, name; token, pid, host, task_id of the owner; ttl_ms; fencing (draw a
--          fence); unless_finished (look for the task id's finish record first); message
--          (stored if parked); reserve_ms (a reservation's life); fair (the fairness value,
--          '' for arrival order); rank (the message's priority the broker's way, higher:
--          handed the lock sooner; with fair, within its value; clamped to -255..255 as on
--          Redis; 0: arrival order)
-- Returns  one row (state, fence, holder fields, position, handed):
--          'acquired': taken (or taken already by this token), with its fence.
--          'finished': the finish record exists; nothing changed.
--          'copy': an execution of this very task id holds the lock: the holder's fields;
--                  nothing changed.
--          'parked': parked (or already parked: kept where it was): the holder's fields
--                  (NULL when the lock was free and just reserved for an older parked id),
--                  this id's 1-based position, and the message of the id just handed the
--                  lock (NULL if none).
CREATE FUNCTION __schema__.singleton_lock_park_v2(
    p_prefix text, p_name text, p_token text, p_pid integer, p_host text, p_task_id text,
    p_ttl_ms bigint, p_fencing boolean, p_unless_finished boolean, p_message bytea,
    p_reserve_ms bigint, p_fair text, p_rank integer)
RETURNS TABLE (state text, fence bigint, h_pid integer, h_host text, h_task_id text,
    h_acquired float8, h_left float8, place bigint, handed bytea)
LANGUAGE plpgsql AS $$
DECLARE
    handoff CONSTANT text := 'handoff-reserved-for-next-parked';
    l __schema__.singleton_lock_leases;
    live boolean;
    take boolean := false;
    held boolean := false;
    head record;
    v_handed bytea;
    v_fence bigint;
    v_rank integer := greatest(-255, least(255, p_rank));
    v_round bigint := -v_rank;
    v_arrival bigint;
    v_current bigint;
    v_last bigint;
    v_place bigint;
BEGIN
    IF p_unless_finished AND EXISTS (
        SELECT 1 FROM __schema__.singleton_lock_finished f
        WHERE f.prefix = p_prefix AND f.name = p_name AND f.task_id = p_task_id
            AND f.until > now()) THEN
        RETURN QUERY SELECT 'finished', NULL::bigint, NULL::integer, NULL::text, NULL::text,
            NULL::float8, NULL::float8, NULL::bigint, NULL::bytea;
        RETURN;
    END IF;
    l := __schema__.singleton_lock_row_v1(p_prefix, p_name);
    live := l.lease_until > now();
    IF live AND l.token = p_token THEN
        RETURN QUERY SELECT 'acquired', l.fence, NULL::integer, NULL::text, NULL::text,
            NULL::float8, NULL::float8, NULL::bigint, NULL::bytea;
        RETURN;
    ELSIF live AND l.token = handoff AND l.task_id = p_task_id THEN
        take := true;
    ELSIF live AND l.task_id = p_task_id THEN
        RETURN QUERY SELECT 'copy', l.fence, l.pid, l.host, l.task_id,
            extract(epoch FROM l.acquired_at)::float8,
            extract(epoch FROM l.lease_until - now())::float8, NULL::bigint, NULL::bytea;
        RETURN;
    ELSIF live THEN
        held := true;
    ELSE
        SELECT t.t_task_id, t.t_message INTO head
        FROM __schema__.singleton_lock_turn_v1(p_prefix, p_name) t;
        IF NOT FOUND OR head.t_task_id = p_task_id THEN
            take := true;
        ELSE
            PERFORM __schema__.singleton_lock_reserve_v1(p_prefix, p_name, head.t_task_id,
                p_reserve_ms);
            v_handed := head.t_message;
        END IF;
    END IF;
    IF take THEN
        v_fence := __schema__.singleton_lock_take_v1(p_prefix, p_name, p_token, p_pid, p_host,
            p_task_id, p_ttl_ms, p_fencing);
        RETURN QUERY SELECT 'acquired', v_fence, NULL::integer, NULL::text, NULL::text,
            NULL::float8, NULL::float8, NULL::bigint, NULL::bytea;
        RETURN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM __schema__.singleton_lock_parked p
                   WHERE p.prefix = p_prefix AND p.name = p_name AND p.task_id = p_task_id) THEN
        IF p_fair <> '' THEN
            -- a round after its value's newest parked call, never before the oldest's round
            -- (a value that was idle joins the current round, not the first)
            SELECT p.round INTO v_current FROM __schema__.singleton_lock_parked p
            WHERE p.prefix = p_prefix AND p.name = p_name
            ORDER BY p.round, p.arrival LIMIT 1;
            SELECT max(p.round) INTO v_last FROM __schema__.singleton_lock_parked p
            WHERE p.prefix = p_prefix AND p.name = p_name AND p.fair = p_fair;
            v_round := greatest(coalesce(v_last, 0) + 1, coalesce(v_current, 0));
        END IF;
        v_arrival := nextval('__schema__.singleton_lock_arrival');
        INSERT INTO __schema__.singleton_lock_parked
            (prefix, name, task_id, round, arrival, fair, message, rank, fair_arrival)
        VALUES (p_prefix, p_name, p_task_id, v_round, v_arrival, p_fair, p_message, v_rank,
            CASE WHEN p_fair <> '' THEN v_arrival END);
    END IF;
    SELECT count(*) INTO v_place FROM __schema__.singleton_lock_parked p,
        __schema__.singleton_lock_parked me
    WHERE me.prefix = p_prefix AND me.name = p_name AND me.task_id = p_task_id
        AND p.prefix = p_prefix AND p.name = p_name
        AND (p.round, p.arrival) <= (me.round, me.arrival);
    IF held THEN
        RETURN QUERY SELECT 'parked', l.fence, l.pid, l.host, l.task_id,
            extract(epoch FROM l.acquired_at)::float8,
            extract(epoch FROM l.lease_until - now())::float8, v_place, v_handed;
    ELSE
        RETURN QUERY SELECT 'parked', NULL::bigint, NULL::integer, NULL::text, NULL::text,
            NULL::float8, NULL::float8, v_place, v_handed;
    END IF;
END
$$;
