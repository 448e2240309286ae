-- The lock names a sweeper should look at now (see release_and_hand_off.lua with an empty
-- token).
-- KEYS[1]  hand-off index (or the index of superseded calls left to mark, see displace)
-- ARGV[1]  at most this many names
-- Returns  array of lock names whose time has come (server clock), oldest first.
--- @include "now_ms"

return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now_ms(), 'LIMIT', 0, ARGV[1])
