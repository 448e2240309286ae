-- Remove a queued marker (see enqueue.lua): after a failed publish, a revoked message, or by
-- hand.
-- KEYS[1]  the lock's queued marker
-- KEYS[2]  optional: the marker index (see enqueue.lua): the marker's entry is removed with it
-- ARGV[1]  optional: a task id; then the marker is deleted only if it holds exactly that id
--          (a compare-and-delete: a newer message's marker is never removed)
-- Returns  1 deleted; 0 absent, or held by another task id: nothing changed.
--- @include "held_index"

if ARGV[1] and redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
unindex_held(KEYS[2], KEYS[1])  -- marker index
return redis.call('DEL', KEYS[1])
