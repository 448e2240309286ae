-- singleton_lock_row_v1(prefix, name): the lease row of a lock, made if missing (free), LOCKED
-- (FOR UPDATE) until the end of the caller's transaction. Every function of the queue parts
-- starts with it, so the operations on one lock's parked calls run one at a time; a plain
-- renewal waits for them only the moment they run.
-- Returns  the row.
CREATE FUNCTION __schema__.singleton_lock_row_v1(p_prefix text, p_name text)
RETURNS __schema__.singleton_lock_leases
LANGUAGE plpgsql AS $$
DECLARE
    l __schema__.singleton_lock_leases;
BEGIN
    SELECT * INTO l FROM __schema__.singleton_lock_leases x
    WHERE x.prefix = p_prefix AND x.name = p_name
    FOR UPDATE;
    IF FOUND THEN
        RETURN l;
    END IF;
    -- the lock's first use: no row to lock yet (an insert racing this one wins, and this
    -- one waits for it and locks its row)
    INSERT INTO __schema__.singleton_lock_leases AS x (prefix, name, token, lease_until)
    VALUES (p_prefix, p_name, '', '-infinity')
    ON CONFLICT (prefix, name) DO NOTHING;
    SELECT * INTO l FROM __schema__.singleton_lock_leases x
    WHERE x.prefix = p_prefix AND x.name = p_name
    FOR UPDATE;
    RETURN l;
END
$$;
