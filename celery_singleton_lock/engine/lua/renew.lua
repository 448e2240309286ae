-- Renew the leases of a process at once (the renewer's tick): each lease's TTL replaced if it
-- is still held by its owner's token, whether it is a lock key or a slot of a lock taken by up
-- to N holders (its slot table, includes/slot_table.lua: its expiry score replaced).
-- KEYS[i..]   per lease, in order: its lock key, or (a slot, see ARGV[3]) its lock's two slot
--             table keys (slots, slot-data)
-- KEYS[last]  optional, after the leases' keys: the held index (includes/held_index.lua; one
--             server only): each renewed lock key, or slot table key, written with its new end
--             (added if it was not there: a lease taken by a script that does not index is
--             listed from its first renewal)
-- ARGV[1]     ttl in ms for every lease without an override
-- ARGV[2]     the leases' tokens concatenated, 32 characters each, in order
-- ARGV[3]     one character per lease: 'k' a lock key, 's' a slot; '' every lease a lock key
-- ARGV[4..]   optional overrides, pairs: lease index (1-based), ttl in ms for that lease
-- Returns     the 1-based indices of the leases NOT renewed (gone, holding another token, or
--             not a string: left untouched); empty when every lease was renewed. A renewed
--             TTL is REPLACED by its ttl, never added to.
--- @include "slot_table"

local ttl, tokens, layout, override = ARGV[1], ARGV[2], ARGV[3], {}
for j = 4, #ARGV, 2 do
  override[tonumber(ARGV[j])] = ARGV[j + 1]
end
local count = #tokens / 32
local width = 0  -- how many KEYS the leases take: the held index, if any, comes after them
for lease = 1, count do
  width = width + ((layout == '' or string.sub(layout, lease, lease) == 'k') and 1 or 2)
end
local held = KEYS[width + 1]  -- held index: nil without it
local now = (held or layout ~= '') and now_ms() or 0
local ends, m = {}, 0  -- held index: (end, key) pairs of the lock keys, written by one ZADD
local lost, n, i = {}, 0, 1
for lease = 1, count do
  local token = string.sub(tokens, 32 * lease - 31, 32 * lease)
  local ms = tonumber(override[lease] or ttl)
  if layout == '' or string.sub(layout, lease, lease) == 'k' then
    if redis.pcall('GETRANGE', KEYS[i], '0', '31') == token then
      redis.call('PEXPIRE', KEYS[i], ms)
      if held then
        ends[m + 1], ends[m + 2], m = now + ms, KEYS[i], m + 2
      end
    else
      n = n + 1
      lost[n] = lease
    end
    i = i + 1
  else
    local S = slot_keys(i, held)  -- slot_extend writes the table's entry itself
    local slot = slot_by(S, token, now)
    if slot then
      slot_extend(S, slot, now, ms)
    else
      n = n + 1
      lost[n] = lease
    end
    i = i + 2
  end
end
index_held_all(held, ends)  -- held index
return lost
