-- Renew the leases of a process at once (the renewer's tick): each lease's TTL replaced if it
-- is still held by its owner's token, whether it is a lock key or a slot of a lock taken by up
-- to N holders (its slot table, includes/slot_table.lua: its expiry score replaced).
-- KEYS[i..]   per lease, in order: its lock key, or (a slot, see ARGV[3]) its lock's two slot
--             table keys (slots, slot-data)
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
local lost, n, i, now = {}, 0, 1, nil
for lease = 1, #tokens / 32 do
  local token = string.sub(tokens, 32 * lease - 31, 32 * lease)
  if layout == '' or string.sub(layout, lease, lease) == 'k' then
    if redis.pcall('GETRANGE', KEYS[i], '0', '31') == token then
      redis.call('PEXPIRE', KEYS[i], override[lease] or ttl)
    else
      n = n + 1
      lost[n] = lease
    end
    i = i + 1
  else
    local S = slot_keys(i)
    now = now or now_ms()
    local slot = slot_by(S, token, now)
    if slot then
      slot_extend(S, slot, now, tonumber(override[lease] or ttl))
    else
      n = n + 1
      lost[n] = lease
    end
    i = i + 2
  end
end
return lost
