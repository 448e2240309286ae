-- Drop from the held index (includes/held_index.lua), or the marker index, the keys a reader
-- found gone: each entry is removed only if its key is STILL gone now (a lock taken again since
-- the read keeps its entry, written by the script that took it). One server only, as the index.
-- KEYS[1]     the held index (or the marker index)
-- KEYS[2..]   lock (or slot, or marker) keys a reader found gone
-- ARGV[]      none
-- Returns     how many entries were removed.
local removed = 0
for i = 2, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 0 then
    removed = removed + redis.call('ZREM', KEYS[1], KEYS[i])
  end
end
return removed
