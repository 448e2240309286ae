-- Drop from the rule index (keys.py's rule_index: the families with a live rule) the families
-- a reader found without one (a cap reset, a pause resumed or ended by itself): each is
-- removed only if its rule is STILL none now (a rule set again since the read keeps its
-- entry), and a rule whose only field is a pause that has ended is deleted with it (its
-- 'until' lingers: includes/live_rule.lua reads the time, not the field). One server or
-- Sentinel only: on a Cluster a family's rule copies share no slot with the index. Called
-- by the reader of the index (live_rules.py's every), never by an acquire.
-- KEYS[1]     the rule index (set)
-- KEYS[2..]   the rules (hashes, keys.py's cap_key) of the families found without one
-- ARGV[i]     the family of KEYS[i + 1] (its member in the index)
-- Returns     how many families were removed.
--- @include "live_rule"

local removed = 0
for i = 2, #KEYS do
  local cap, paused = live_rule(KEYS[i])
  if not cap and not paused then
    redis.call('DEL', KEYS[i])
    removed = removed + redis.call('SREM', KEYS[1], ARGV[i - 1])
  end
end
return removed
