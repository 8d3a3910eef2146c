-- unpark.lua: admit the waiting jobs of groups whose rate held them back until now (one
-- capped batch of groups), and forget limiter states no longer ahead of the clock (a TAT at
-- or before now limits nothing: the same as none).
-- Safe to repeat: a group is taken out of the parked ZSET as it is admitted, and g_fill
-- admits only while the group has a free slot; a repeat finds nothing more to do.
-- KEYS[1]   ready stream
-- KEYS[2..7] the group keys (Keys.group_keys)
-- ARGV[1]   group defaults (QueueConfig.group_arg)
-- ARGV[2]   max groups to unpark in this call (<= 1000)
-- Returns {admitted, server now ms, next parked time ms or -1}
local stream = KEYS[1]
local G = gctx(KEYS, 2, ARGV[1])
local now = now_ms()
local admitted = 0
local due = redis.call('ZRANGEBYSCORE', G.parked, '-inf', now, 'LIMIT', 0, tonumber(ARGV[2]))
for _, g in ipairs(due) do
  redis.call('ZREM', G.parked, g)
  admitted = admitted + g_fill(G, g, stream, now)
  g_tidy(G, g)
end
redis.call('ZREMRANGEBYSCORE', G.tat, '-inf', now)
local first = redis.call('ZRANGE', G.parked, 0, 0, 'WITHSCORES')
local next_at = -1
if first[2] then next_at = tonumber(first[2]) end
return {admitted, now, next_at}
