-- Renew locks by their owner fields: for a supervisor keeping alive the locks of its children
-- (it cannot know their tokens): a child whose body holds the GIL in one long C call cannot
-- renew its own lease. Each lock is looked for as a lock key, then as a slot of its slot table
-- (a lock_limit, includes/slot_table.lua), found by its owner in O(1) either way.
-- The held index (includes/held_index.lua) is left as it is: no reader uses its scores (they
-- ZSCAN it and drop an entry only once its key is gone, trim_held.lua), and the entry written
-- when the lock was taken stays while its key lives, however late its score says it ends.
-- KEYS[3i-2..3i] the i-th lock's key and its two slot table keys (slots, slot-data)
-- ARGV[1..N]     '<pid>|<host>|<task_id>' of the owner of each lock, in order, host
--                escaped as in the lock value
-- ARGV[N+1..2N]  ttl in ms of each lock, in order
-- Returns        the 1-based indices of the locks NOT renewed (gone, held by another owner,
--                or not a lock: left untouched); empty when every lock was renewed. A renewed
--                TTL is REPLACED by its ttl, never added to; nothing is ever created.
--- @include "slot_table"

local n, lost, k, now = #KEYS / 3, {}, 0, nil
for i = 1, n do
  local key = KEYS[3 * i - 2]
  local v = redis.pcall('GET', key)
  if type(v) == 'string' and string.sub(v, 33, 33) == '|' and owner_of(v) == ARGV[i] then
    redis.call('PEXPIRE', key, ARGV[n + i])
  else
    local S = slot_keys(3 * i - 1)
    now = now or now_ms()
    local slot, held = slot_by(S, 'o:' .. ARGV[i], now)
    if slot and owner_of(held) == ARGV[i] then
      slot_extend(S, slot, now, tonumber(ARGV[n + i]))
    else
      k = k + 1
      lost[k] = i
    end
  end
end
return lost
