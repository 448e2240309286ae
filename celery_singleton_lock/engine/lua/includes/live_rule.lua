-- The live rule of a task's or group's locks, read by every acquire in the same call (no round
-- trip of its own): a hash P:cap:F (keys.py's cap_key) written by `celery locks limit`,
-- `celery locks pause` / `resume` and a body's `self.request.lock.pause_for` (pause.lua):
--   field 'cap'    at most that many slots of each lock taken at once, whatever its limit
--   field 'until'  no body starts before this server time in ms; '-1' until resumed
-- A pause that has ended is read as none (its field may linger: the time is what counts, so
-- a `--for` ends by itself on every server clock reading, with no expiry to wait for).
--- @include "now_ms"

-- The rule at `key` (nil: none): the cap (or nil) and the ms the pause still lasts (nil:
-- not paused; -1: until resumed).
local function live_rule(key)
  if not key then
    return nil, nil
  end
  local rule = redis.call('HMGET', key, 'cap', 'until')
  local till = tonumber(rule[2])
  local paused
  if till == -1 then
    paused = -1
  elseif till then
    local left = till - now_ms()
    if left > 0 then
      paused = left
    end
  end
  return tonumber(rule[1]), paused
end

-- With q.paused (live_rule's pause of the lock's queue `q`, see slot_queue.lua): no slot is
-- free to hand on, and a sweeper's next look at the parked calls is due when the pause ends
-- (or after a reservation's life, until resumed: `resume` makes it due at once). So a parked
-- call wakes when the pause ends, and no sweeper spins meanwhile.
local function paused_free(q, free)
  if q.paused then
    return {}
  end
  return free
end

local function paused_due(q, now, due)
  if not q.paused then
    return due
  end
  local ends = now + (q.paused > 0 and q.paused or q.reserve)
  if not due or ends < due then
    return ends
  end
  return due
end
