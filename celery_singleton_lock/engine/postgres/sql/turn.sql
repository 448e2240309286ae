-- singleton_lock_turn_v1: the parked call a free lock goes to next, as park.sql and
-- hand_on.sql hand it on (the lease row locked by singleton_lock_row_v1 in the caller's
-- transaction), as lua/includes/fair_queue.lua's fair_turn and fair_take choose it on Redis.
-- The next turn is the first parked row by (round, arrival) (tables.sql: a higher rank first,
-- then arrival; with lock_fair_by, rounds across values). A turn of a fairness value goes to
-- that value's waiting call of the highest rank, the oldest first within one rank
-- (fair_arrival): when that call is not the turn's own, the two swap turns (round, arrival),
-- so the round robin across values is untouched and the passed-over call waits in the
-- taker's later turn. The taker leaves its value's waiting calls (fair_arrival NULL): a
-- reservation of it that runs out is made again for it, in this turn, not for a better call
-- of its value parked since. Deciding at the turn, not at parking, leaves a park one insert.
-- Args     prefix, name
-- Returns  one row (t_task_id, t_message) of the call handed the turn; no row when nothing
--          is parked.
CREATE FUNCTION __schema__.singleton_lock_turn_v1(p_prefix text, p_name text)
RETURNS TABLE (t_task_id text, t_message bytea)
LANGUAGE plpgsql AS $$
DECLARE
    head __schema__.singleton_lock_parked;
    best __schema__.singleton_lock_parked;
BEGIN
    SELECT p.* INTO head FROM __schema__.singleton_lock_parked p
    WHERE p.prefix = p_prefix AND p.name = p_name
    ORDER BY p.round, p.arrival LIMIT 1;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF head.fair_arrival IS NULL THEN
        -- no fairness value, or handed this turn already: the turn is its own
        RETURN QUERY SELECT head.task_id, head.message;
        RETURN;
    END IF;
    SELECT p.* INTO best FROM __schema__.singleton_lock_parked p
    WHERE p.prefix = p_prefix AND p.name = p_name AND p.fair = head.fair
        AND p.fair_arrival IS NOT NULL
    ORDER BY p.rank DESC, p.fair_arrival LIMIT 1;  -- head itself at worst
    UPDATE __schema__.singleton_lock_parked p
    SET round = CASE WHEN p.task_id = best.task_id THEN head.round ELSE best.round END,
        arrival = CASE WHEN p.task_id = best.task_id THEN head.arrival ELSE best.arrival END,
        fair_arrival = CASE WHEN p.task_id = best.task_id THEN NULL ELSE p.fair_arrival END
    WHERE p.prefix = p_prefix AND p.name = p_name AND p.task_id IN (head.task_id, best.task_id);
    RETURN QUERY SELECT best.task_id, best.message;
END
$$;
