"""Lua scripts of the lock engine, each headed by its contract.

A lock is a Redis hash with a TTL. Its fields:
    token        the holder's 128-bit random token (hex); the only proof of ownership
    task_id      what the holder runs (free text, may be empty)
    host         the holder's host / worker node name
    pid          the holder's process id
    acquired_at  the holder's wall clock at acquisition, in milliseconds
    fence        the fencing token given with this acquisition ('' when fencing is off)

The fence counter is a separate string key sharing the lock's hash tag, so every key a script
touches lives in one Redis Cluster slot. It never expires: a counter that reset would hand out
fences lower than ones a store has already seen.

All scripts are loaded once and run with EVALSHA (redis-py ``Script`` falls back on NOSCRIPT).
"""

from __future__ import annotations

ACQUIRE = """
-- KEYS[1]  lock key (hash)
-- KEYS[2]  fence counter key (string, never expires)
-- ARGV[1]  token          ARGV[2] ttl in ms        ARGV[3] '1' to hand out a fence, else '0'
-- ARGV[4]  task id        ARGV[5] host             ARGV[6] pid
-- ARGV[7]  acquired-at (ms, caller's clock)
-- Returns  {1, fence}  acquired (fence is '' without fencing). Also returned when the lock
--                      already holds ARGV[1]: a resend after a lost reply is not a duplicate.
--          {0, task_id, host, pid, acquired_at, fence, pttl}  held by someone else.
local current = redis.call('HGET', KEYS[1], 'token')
if not current then
  local fence = ''
  if ARGV[3] == '1' then
    fence = redis.call('INCR', KEYS[2])
  end
  redis.call('HSET', KEYS[1], 'token', ARGV[1], 'task_id', ARGV[4], 'host', ARGV[5],
             'pid', ARGV[6], 'acquired_at', ARGV[7], 'fence', fence)
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, fence}
end
if current == ARGV[1] then
  return {1, redis.call('HGET', KEYS[1], 'fence')}
end
local h = redis.call('HMGET', KEYS[1], 'task_id', 'host', 'pid', 'acquired_at', 'fence')
return {0, h[1], h[2], h[3], h[4], h[5], redis.call('PTTL', KEYS[1])}
"""

RELEASE = """
-- KEYS[1]  lock key
-- ARGV[1]  token of the releasing owner
-- ARGV[2]  channel to publish the release on (waiters subscribe to it)
-- Returns  1 released; 0 not ours (expired, or taken over by another owner): nothing changed.
if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], KEYS[1])
  return 1
end
return 0
"""

RENEW = """
-- KEYS[1..N]  lock keys
-- ARGV        token_1, ttl_ms_1, token_2, ttl_ms_2, ... (two per key, in KEYS order)
-- Returns     {r_1, ..., r_N}: 1 renewed (TTL REPLACED by ttl_ms, never added to),
--             0 lost (key gone or holding another token: left untouched).
local result = {}
for i = 1, #KEYS do
  if redis.call('HGET', KEYS[i], 'token') == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    result[i] = 1
  else
    result[i] = 0
  end
end
return result
"""

RELEASE_ABANDONED = """
-- For a supervisor whose child died holding a lock (it cannot know the child's token).
-- KEYS[1]  lock key
-- ARGV[1]  task id     ARGV[2] host     ARGV[3] pid of the dead holder
-- ARGV[4]  channel to publish the release on
-- Returns  1 released; 0 the lock is gone or held by another execution: nothing changed.
local h = redis.call('HMGET', KEYS[1], 'task_id', 'host', 'pid')
if h[1] == ARGV[1] and h[2] == ARGV[2] and h[3] == ARGV[3] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[4], KEYS[1])
  return 1
end
return 0
"""
