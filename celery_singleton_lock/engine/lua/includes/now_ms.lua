-- The server's clock in ms: every time a script compares or stores is read here (TIME), so
-- the clocks of the workers never matter.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
