-- Before a message is published (opt-in dedupe_on_enqueue): is this lock name already queued
-- or running? One round trip; the caller publishes only on nil.
-- KEYS[1]  lock key
-- KEYS[2]  the lock's queued marker: a string holding the task id of the message queued
--          under this name, with its own TTL. acquire.lua given its ARGV[6] deletes it.
-- KEYS[3]  optional: the marker index (engine/keys.py's marker_index; one server only): the
--          marker's entry, scored by its expiry (includes/held_index.lua's functions)
-- ARGV[1]  task id of the message about to be published (not empty)
-- ARGV[2]  marker TTL in ms
-- ARGV[3]  '0': a queued message or a running execution is a duplicate;
--          '1': a re-send of an existing message under its own task id (Celery's retry, a
--          lock retry): never reported as a duplicate, whatever is queued or running;
--          '2': only a queued message is a duplicate (the lock is not read)
-- Returns  nil: publish. The marker now holds ARGV[1] with TTL ARGV[2]: written when absent
--               (SET NX), its TTL replaced when it already held ARGV[1] (a retry is not
--               blocked by its own marker); left alone when it holds another id (ARGV[3]
--               '1').
--          string: the task id queued (the marker) or else running (the lock value's
--               task_id, when not empty and not ARGV[1]; ARGV[3] '0' only) under this name:
--               do not publish; nothing changed. A lock value without the lock shape is
--               ignored here (the worker's acquire reports it).
--- @include "lock_value"
--- @include "held_index"

local q = redis.call('GET', KEYS[2])
if q == ARGV[1] then
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  index_held(KEYS[3], KEYS[2], ARGV[2])  -- marker index
  return false
end
if q then
  if ARGV[3] == '1' then
    return false
  end
  return q
end
if ARGV[3] == '0' then
  local v = redis.call('GET', KEYS[1])
  if v and string.sub(v, 33, 33) == '|' then
    local holder = task_id_of(v)
    if holder ~= '' and holder ~= ARGV[1] then
      return holder
    end
  end
end
redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ARGV[2])
index_held(KEYS[3], KEYS[2], ARGV[2])  -- marker index
return false
