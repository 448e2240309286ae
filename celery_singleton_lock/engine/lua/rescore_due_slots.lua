-- A sweeper's update of a Redis Cluster's summary of due hand-off slots (keys.py's due_slots,
-- slot_sweep.py's DueSlots): each slot it read is re-scored to its hand-off index's next due
-- time, or removed when that index is empty, but only if its score is still the one the
-- sweeper read: a client that marked the slot since (a call parked there, a release that
-- handed on) wrote a new score, and that mark is kept, so its due lock is not lost. The
-- summary is one key with no hash tag: the indexes were read apart, before this call.
-- KEYS[1]  the summary (sorted set: slot number -> ms at which a sweeper should read it)
-- ARGV[3i-2], ARGV[3i-1], ARGV[3i]
--          a slot, the score the sweeper read, its new score ('' remove it)
-- Returns  how many slots were re-scored or removed (the others were marked since)

local changed = 0
for i = 1, #ARGV, 3 do
  local slot, seen, new = ARGV[i], tonumber(ARGV[i + 1]), ARGV[i + 2]
  if tonumber(redis.call('ZSCORE', KEYS[1], slot)) == seen then
    if new == '' then
      redis.call('ZREM', KEYS[1], slot)
    else
      redis.call('ZADD', KEYS[1], new, slot)
    end
    changed = changed + 1
  end
end
return changed
