-- prune.lua: delete a dead consumer from the group, but only when its pending list is empty
-- (deleting a consumer drops its pending entries) and its heartbeat is stale or absent.
-- KEYS[1]   ready stream
-- KEYS[2]   workers ZSET (consumer name -> last heartbeat ms)
-- ARGV[1]   consumer group
-- ARGV[2]   consumer name
-- ARGV[3]   staleness threshold in ms (heartbeat older than now - this counts as dead)
-- Returns 1 deleted, 0 kept
local stream, workers, group, consumer = KEYS[1], KEYS[2], ARGV[1], ARGV[2]
local now = now_ms()
local seen = redis.call('ZSCORE', workers, consumer)
if seen and now - tonumber(seen) < tonumber(ARGV[3]) then return 0 end
local pel = redis.call('XPENDING', stream, group, '-', '+', 1, consumer)
if #pel > 0 then return 0 end
redis.call('XGROUP', 'DELCONSUMER', stream, group, consumer)
redis.call('ZREM', workers, consumer)
return 1
