-- A cooldown (lock_cooldown): a release that leaves the key taken for a while. The key holds
-- the released value with the token 'cooldowncooldowncooldowncooldown' and the pid 'cooldown'
-- (no owner has that token, no process that pid): an acquire finds it held by the run that
-- just ended, no one can release or renew it, and it frees itself when the cooldown ends.

-- Write the lock (or slot) `key`, whose released value was `v`, into its cooldown of `ms` ms.
-- The value of a cooldown after the released value `v`.
local function cooled(v)
  local fence_end = string.find(v, '|', 34, true)
  local acquired_end = string.find(v, '|', fence_end + 1, true)
  local pid_end = string.find(v, '|', acquired_end + 1, true)
  return 'cooldowncooldowncooldowncooldown' .. string.sub(v, 33, acquired_end) .. 'cooldown'
         .. string.sub(v, pid_end)
end

local function cool_down(key, v, ms)
  redis.call('SET', key, cooled(v), 'PX', ms)
end
