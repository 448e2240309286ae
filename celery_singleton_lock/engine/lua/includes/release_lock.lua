-- The release of a lock by its owner: a compare-and-delete of the token, published to the
-- lock's waiters, with the owner's finish record when asked (finish_records.lua).
--- @include "finish_records"
--- @include "announce"

-- Release `lock` if it holds `token`, publishing the release on `channel`; with `records` (the
-- finish-record set of task id `id`), record that `id` finished, for `lifetime` ms. Returns
-- whether it was released (false: not ours, nothing changed).
local function release_lock(lock, token, channel, records, lifetime, id)
  local v = redis.call('GET', lock)
  if not v or string.sub(v, 1, 32) ~= token then
    return false
  end
  if records then
    record_finished(records, lifetime, id)
  end
  redis.call('DEL', lock)
  announce(channel, lock)
  return true
end
