-- unpark.lua: admit the waiting jobs of groups whose rate held them back until now (one
-- capped batch of groups), and forget limiter states no longer ahead of the clock (a TAT at
-- or before now limits nothing: the same as none).
-- Safe to repeat: a group is taken out of the parked ZSET as it is admitted, and g_fill
-- admits only while the group has a free slot; a repeat finds nothing more to do.
-- KEYS[1]   ready stream
-- KEYS[2..12] the group keys (Keys.group_keys)
-- ARGV[1]   group defaults (QueueConfig.group_arg)
-- ARGV[2]   max groups to unpark in this call (<= 1000)
-- Returns {admitted, server now ms, when to look again (ms) or -1}: the earliest of the next
--           parked time and the next limiter time (TAT) ahead: a group whose TAT comes first
--           may be parked by then (a finish or a start that found it not yet conformant), so
--           the caller wakes for it instead of sleeping its whole interval.
local stream = KEYS[1]
local G = gctx(KEYS, 2, ARGV[1])
local now = now_ms()
local admitted = 0
local due = rcall('ZRANGEBYSCORE', G.parked, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, g in ipairs(due) do
  rcall('ZREM', G.parked, g)
  admitted = admitted + g_fill(G, g, stream, now)
  g_tidy(G, g)
end
rcall('ZREMRANGEBYSCORE', G.tat, '-inf', now)
local next_at = -1
for _, set in ipairs({G.parked, G.tat}) do
  local first = rcall('ZRANGE', set, 0, 0, 'WITHSCORES')
  if first[2] and (next_at < 0 or tonumber(first[2]) < next_at) then
    next_at = math.ceil(tonumber(first[2]))
  end
end
return {admitted, now, next_at}
