-- Renew the leases of a process at once (the renewer's tick): each key's TTL replaced if it
-- still holds its owner's token.
-- KEYS[1..N]  lock keys
-- KEYS[N+1]   optional: the held index (includes/held_index.lua; one server only): each
--             renewed key's entry written with its new end (added if it was not there: a
--             lease taken by a script that does not index is listed from its first renewal)
-- ARGV[1]     ttl in ms for every key without an override
-- ARGV[2]     the N tokens concatenated, 32 characters each, in KEYS order
-- ARGV[3..]   optional overrides, pairs: key index (1-based), ttl in ms for that key
-- Returns     the 1-based indices of the keys NOT renewed (gone, holding another token, or
--             not a string: left untouched); empty when every key was renewed. A renewed
--             key's TTL is REPLACED by its ttl, never added to.
--- @include "held_index"
local ttl, tokens, override = ARGV[1], ARGV[2], {}
for j = 3, #ARGV, 2 do
  override[tonumber(ARGV[j])] = ARGV[j + 1]
end
local count = #tokens / 32
local held = KEYS[count + 1]  -- held index: nil without it
local now = held and now_ms()
local ends, m = {}, 0  -- held index: (end, key) pairs, written by one ZADD
local lost, n = {}, 0
for i = 1, count do
  if redis.pcall('GETRANGE', KEYS[i], '0', '31') == string.sub(tokens, 32 * i - 31, 32 * i) then
    redis.call('PEXPIRE', KEYS[i], override[i] or ttl)
    if held then
      ends[m + 1], ends[m + 2], m = now + tonumber(override[i] or ttl), KEYS[i], m + 2
    end
  else
    n = n + 1
    lost[n] = i
  end
end
index_held_all(held, ends)  -- held index
return lost
