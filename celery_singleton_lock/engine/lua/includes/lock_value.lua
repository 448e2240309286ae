-- Reading a lock value. A lock is a Redis string with a TTL; its value, fields separated by '|':
--
--   <token>|<fence>|<acquired_at>|<pid>|<host>|<task_id>
--
--   token        the holder's 128-bit random token, 32 hex characters (fixed width, so a
--                script compares string.sub(value, 1, 32) or GETRANGE key 0 31); the only
--                proof of ownership
--   fence        the fencing token given with this acquisition ('' when fencing is off)
--   acquired_at  the holder's wall clock at acquisition, in milliseconds
--   pid          the holder's process id
--   host         the holder's host / worker node name, with '%' and '|' escaped as %25 and
--                %7C (only when present)
--   task_id      what the holder runs (free text, may be empty); last, so it may contain '|'
--
-- The client sends the value whole (with an empty fence), so that without fencing acquiring is
-- a single SET key value NX PX ttl. A key at a lock's name whose value does not have this shape
-- (no '|' after 32 characters) was not written by this package: an acquire raises NOTLOCK
-- instead of reporting it as a holder. Two tokens are never an owner's (not hex): the
-- reservation of a hand-off (handoff.lua) and a cooldown (cooldown.lua).

-- The fence in the lock value `v` (0 when it was taken without fencing).
local function fence_of(v)
  return tonumber(string.match(v, '^%d+', 34)) or 0
end

-- '<pid>|<host>|<task_id>' of the lock value `v` (what follows acquired_at), or nil.
local function owner_of(v)
  local fence_end = string.find(v, '|', 34, true)
  local acquired_end = fence_end and string.find(v, '|', fence_end + 1, true)
  return acquired_end and string.sub(v, acquired_end + 1)
end

-- The task id of the lock value `v`: what follows its 5th '|' ('' without one).
local function task_id_of(v)
  local p = 33
  for _ = 1, 4 do
    p = p and string.find(v, '|', p + 1, true)
  end
  return p and string.sub(v, p + 1) or ''
end
