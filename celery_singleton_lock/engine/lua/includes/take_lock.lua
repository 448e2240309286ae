-- Take a free lock, with its fence. The fence counter is shared by many locks (keys.py):
-- strictly increasing overall, hence per lock name, and it never expires (a counter that
-- reset would hand out fences lower than ones a store has already seen).

-- The lock `value` (its fence empty, '<token>||...') with the next fence of `counter` written
-- in when `fencing` == '1', and that fence (or 0).
local function fenced(value, fencing, counter)
  if fencing ~= '1' then
    return value, 0
  end
  local fence = redis.call('INCR', counter)
  return string.sub(value, 1, 33) .. string.format('%d', fence) .. string.sub(value, 34), fence
end

-- SET the free lock `key` to `value` (its fence empty) for `ttl` ms, fenced as above.
-- Returns the fence, or 0.
local function take_lock(key, value, ttl, fencing, counter)
  local fence
  value, fence = fenced(value, fencing, counter)
  redis.call('SET', key, value, 'PX', ttl)
  return fence
end
