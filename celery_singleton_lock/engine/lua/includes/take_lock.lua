-- Take a free lock, with its fence. The fence counter is shared by many locks (shared_keys.py):
-- strictly increasing overall, hence per lock name, and it never expires (a counter that
-- reset would hand out fences lower than ones a store has already seen).

-- SET the free lock `key` to `value` (a lock value with an empty fence, '<token>||...') for
-- `ttl` ms; with `fencing` == '1' the next fence of `counter` is written into the value.
-- Returns the fence, or 0.
local function take_lock(key, value, ttl, fencing, counter)
  local fence = 0
  if fencing == '1' then
    fence = redis.call('INCR', counter)
    value = string.sub(value, 1, 33) .. string.format('%d', fence) .. string.sub(value, 34)
  end
  redis.call('SET', key, value, 'PX', ttl)
  return fence
end
