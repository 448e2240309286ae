-- Renew locks by their owner fields: for a supervisor keeping alive the locks of its children
-- (it cannot know their tokens): a child whose body holds the GIL in one long C call cannot
-- renew its own lease.
-- KEYS[1..N]     lock keys
-- ARGV[1..N]     '<pid>|<host>|<task_id>' of the owner of each key, in KEYS order, host
--                escaped as in the lock value
-- ARGV[N+1..2N]  ttl in ms of each key, in KEYS order
-- Returns        the 1-based indices of the keys NOT renewed (gone, held by another owner,
--                or not a lock: left untouched); empty when every key was renewed. A renewed
--                key's TTL is REPLACED by its ttl, never added to; a key is never created.
--- @include "lock_value"

local n, lost, k = #KEYS, {}, 0
for i = 1, n do
  local v = redis.pcall('GET', KEYS[i])
  if type(v) == 'string' and string.sub(v, 33, 33) == '|' and owner_of(v) == ARGV[i] then
    redis.call('PEXPIRE', KEYS[i], ARGV[n + i])
  else
    k = k + 1
    lost[k] = i
  end
end
return lost
