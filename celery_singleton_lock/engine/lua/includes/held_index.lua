-- The held index: one sorted set per prefix on ONE server (P:held, engine/keys.py's
-- held_index), member a held lock key or a slot table's slots key (includes/slot_table.lua:
-- a slot has no key; readers expand the table into its live slots), score when its (latest)
-- lease ends, in ms by the server's clock. Written by the scripts that already take, renew,
-- cool down and release a lock, so that reading the held locks (celery locks list, doctor)
-- costs O(held locks), not a SCAN of the whole database. It has no hash tag: a script may write it only on one server or a
-- Sentinel group's primary, never on a Redis Cluster (its key is in another slot than the
-- lock's); there the client passes no index key, every function below is then a no-op, and the
-- readers SCAN each primary instead (engine/reading.py).
-- The same functions keep the marker index (P:queued, engine/keys.py's marker_index: the queued
-- markers of enqueue.lua, scored by their expiry), passed in their `index` argument.
-- The score is for an operator reading the index by hand: no reader or trim uses it (readers
-- ZSCAN, and trim by the key's existence), so a write that only extends a lease (the main
-- process's renewal by owner, renew_by_owner.lua) need not touch it.
-- An entry may outlive its lock (a holder that died, a key that expired): readers drop it when
-- they find the key gone (trim_held.lua). A lock that is held is always in the index, once
-- the script that took it indexes (or, for a script that does not, from the first renewal).
--- @include "now_ms"

-- The keys of `ends` (pairs: end in server ms, key) are held until their end: written in
-- `index` by one ZADD (nil index or no pair: nothing done). At most a few thousand pairs
-- (unpack's limit): the renewal sends 500 leases a call.
local function index_held_all(index, ends)
  if index and #ends > 0 then
    redis.call('ZADD', index, unpack(ends))
  end
end

-- `key` is held for `ms` from now: write it in `index` (nil: no index, nothing done).
local function index_held(index, key, ms)
  if index then
    redis.call('ZADD', index, now_ms() + tonumber(ms), key)
  end
end

-- `key` was released (deleted): take it out of `index` (nil: no index, nothing done).
local function unindex_held(index, key)
  if index then
    redis.call('ZREM', index, key)
  end
end
