-- singleton_lock_take_v1: the lock given to an owner, as park.sql and latest.sql take it (the
-- lease row locked by singleton_lock_row_v1 in the caller's transaction): its task id leaves
-- the parked calls (it runs now) and the row holds the owner, with a fresh fence if asked.
-- Args     prefix, name; token, pid, host, task_id of the owner; ttl_ms; fencing (draw a fence)
-- Returns  the fence (NULL without fencing).
CREATE FUNCTION __schema__.singleton_lock_take_v1(
    p_prefix text, p_name text, p_token text, p_pid integer, p_host text, p_task_id text,
    p_ttl_ms bigint, p_fencing boolean)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_fence bigint;
BEGIN
    DELETE FROM __schema__.singleton_lock_parked p
    WHERE p.prefix = p_prefix AND p.name = p_name AND p.task_id = p_task_id;
    UPDATE __schema__.singleton_lock_leases x SET token = p_token, pid = p_pid,
        host = p_host, task_id = p_task_id, acquired_at = now(),
        lease_until = now() + p_ttl_ms * interval '1 millisecond',
        fence = CASE WHEN p_fencing THEN nextval('__schema__.singleton_lock_fence') END
    WHERE x.prefix = p_prefix AND x.name = p_name
    RETURNING x.fence INTO v_fence;
    RETURN v_fence;
END
$$;
