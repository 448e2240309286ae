-- Release a lock (or slot) into its cooldown (lock_cooldown): compare the owner's token as
-- release.lua does, then leave the key taken for the cooldown (includes/cooldown.lua), and
-- publish the release: a waiter (policy wait) re-reads the key and sleeps for the cooldown
-- left, instead of until the TTL it read of the running holder.
-- KEYS[1]  lock (or slot) key
-- KEYS[2]  optional: the held index (as release.lua's KEYS[2]): the key's entry ends with the
--          cooldown
-- KEYS[#KEYS] with ARGV[4..5]: the finish-record set (as release.lua's)
-- ARGV[1]  token of the releasing owner (32 characters)
-- ARGV[2]  the cooldown in ms
-- ARGV[3]  channel to publish the release on (as release.lua's ARGV[2])
-- ARGV[4..5]  with KEYS[2]: as release.lua's ARGV[3..4] (record lifetime in ms, the owner's
--          task id)
-- Returns  1 released into its cooldown: KEYS[1] holds the released value with the cooldown's
--          token and pid, expiring in ARGV[2] ms;
--          0 not ours (expired, or taken over): nothing changed.
--- @include "finish_records"
--- @include "cooldown"
--- @include "announce"
--- @include "held_index"

local records = ARGV[5] and KEYS[#KEYS]
local held = #KEYS == (records and 3 or 2) and KEYS[2]  -- held index: false without it
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 32) ~= ARGV[1] then
  return 0
end
if records then
  record_finished(records, ARGV[4], ARGV[5])
end
cool_down(KEYS[1], v, ARGV[2])
index_held(held, KEYS[1], ARGV[2])  -- held index
announce(ARGV[3], KEYS[1])
return 1
