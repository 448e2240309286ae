-- A release is announced on the lock's release channel only when someone listens there: a
-- waiter subscribes before it reads the lock again (engine/waiting.py), so one that waits is
-- counted, and one that subscribes later reads the lock as it is. A PUBLISH nobody hears
-- still goes to every replica and the AOF, and on a Redis Cluster to every node.

-- Publish `lock` on `channel` if anyone is subscribed to it.
local function announce(channel, lock)
  if redis.call('PUBSUB', 'NUMSUB', channel)[2] > 0 then
    redis.call('PUBLISH', channel, lock)
  end
end
