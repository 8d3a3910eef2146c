-- prune.lua: forget dead workers. A consumer is deleted from the group only when its pending
-- list is empty (deleting a consumer drops its pending entries) and its heartbeat is stale or
-- absent. Besides the candidates the caller names (from XINFO CONSUMERS), up to 100 members
-- of the workers ZSET whose heartbeat is stale are looked at too: a worker that died before it
-- ever became a consumer (e.g. while its queue was paused) is never listed as one.
-- Safe to repeat: deleting what is already gone changes nothing.
-- KEYS[1]   ready stream
-- KEYS[2]   workers ZSET (consumer name -> last heartbeat ms)
-- ARGV[1]   consumer group
-- ARGV[2]   staleness threshold in ms (heartbeat older than now - this counts as dead)
-- ARGV[3..] candidate consumer names
-- Returns the names pruned
local stream, workers, group = KEYS[1], KEYS[2], ARGV[1]
local stale_ms = tonumber(ARGV[2])
local now = now_ms()
local names, seen = {}, {}
for i = 3, #ARGV do
  if not seen[ARGV[i]] then names[#names + 1] = ARGV[i]; seen[ARGV[i]] = true end
end
for _, name in ipairs(rcall('ZRANGEBYSCORE', workers, '-inf', now - stale_ms,
    'LIMIT', 0, 100)) do
  if not seen[name] then names[#names + 1] = name; seen[name] = true end
end
local has_group = false
if rcall('EXISTS', stream) == 1 then
  for _, g in ipairs(rcall('XINFO', 'GROUPS', stream)) do
    for j = 1, #g, 2 do
      if g[j] == 'name' and g[j + 1] == group then has_group = true end
    end
  end
end
local out = {}
for _, name in ipairs(names) do
  local seen_ms = rcall('ZSCORE', workers, name)
  if not seen_ms or now - tonumber(seen_ms) >= stale_ms then
    local idle = true
    if has_group then
      idle = #rcall('XPENDING', stream, group, '-', '+', 1, name) == 0
      if idle then rcall('XGROUP', 'DELCONSUMER', stream, group, name) end
    end
    if idle then
      rcall('ZREM', workers, name)
      out[#out + 1] = name
    end
  end
end
return out
