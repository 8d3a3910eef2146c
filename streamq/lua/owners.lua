-- owners.lua: the live workers of a queue, by the server's clock (who owns which shard of a
-- sharded queue: streamq/_worker/owners.py). Reads only: safe to repeat.
-- KEYS[1]   workers ZSET (consumer name -> last heartbeat ms; heartbeat.lua writes it)
-- ARGV[1]   live window in ms (a heartbeat newer than now - this counts as live)
-- ARGV[2]   at most this many names (the oldest heartbeats first are left out)
-- Returns the server time in ms, then the live consumer names (by newest heartbeat first)
local now = now_ms()
local out = rcall('ZRANGE', KEYS[1], '+inf', now - tonumber(ARGV[1]), 'BYSCORE', 'REV',
  'LIMIT', 0, tonumber(ARGV[2]))
table.insert(out, 1, now)
return out
