-- The live cap of a task's locks (`celery locks limit`, keys.py's cap_key): at most that many
-- slots of a lock taken at once, whatever its lock_limit. Read here only, by every script
-- that takes or hands on a slot.

-- The cap stored at `key` (a string), or nil without a key or a cap.
local function live_cap(key)
  if not key then
    return nil
  end
  return tonumber(redis.call('GET', key))
end
