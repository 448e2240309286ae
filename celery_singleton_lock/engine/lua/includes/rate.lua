-- A rate (lock_rate): the starts of a lock in a sorted set (token scored by the server's clock
-- in ms), at most `rate` in any window of `window` ms.

-- ms until the rate allows one more start (0: now; always 0 without a rate); the window's old
-- starts trimmed.
local function rate_wait(starts, rate, window, now)
  if not rate then
    return 0
  end
  redis.call('ZREMRANGEBYSCORE', starts, '-inf', now - window)
  if redis.call('ZCARD', starts) < rate then
    return 0
  end
  local oldest = redis.call('ZRANGE', starts, 0, 0, 'WITHSCORES')
  return math.max(1, tonumber(oldest[2]) + window - now)
end
