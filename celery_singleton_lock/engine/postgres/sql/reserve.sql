-- singleton_lock_reserve_v1: the lock (its lease row locked by singleton_lock_row_v1 in the
-- caller's transaction) reserved for a parked task id, as park.sql and hand_on.sql hand it on:
-- a RESERVATION is a lease row whose token is 'handoff-reserved-for-next-parked' (not hex: no
-- owner has it), pid 0 and the reserved task id, no fence, live for reserve_ms.
-- Args     prefix, name; task_id (the parked id it is reserved for); reserve_ms
-- Returns  nothing.
CREATE FUNCTION __schema__.singleton_lock_reserve_v1(
    p_prefix text, p_name text, p_task_id text, p_reserve_ms bigint)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE __schema__.singleton_lock_leases x SET token = 'handoff-reserved-for-next-parked',
        pid = 0, host = '', task_id = p_task_id, acquired_at = now(), fence = NULL,
        lease_until = now() + p_reserve_ms * interval '1 millisecond'
    WHERE x.prefix = p_prefix AND x.name = p_name;
END
$$;
