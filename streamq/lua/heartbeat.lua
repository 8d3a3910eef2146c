-- heartbeat.lua: record that a worker process is alive, stamped with the server's clock.
-- Safe to repeat: a repeat stamps the heartbeat again.
-- KEYS[1]   workers ZSET (consumer name -> last heartbeat ms)
-- KEYS[2]   worker info HASH of this consumer
-- ARGV[1]   consumer name
-- ARGV[2]   info (JSON text)
-- ARGV[3]   info TTL in seconds
-- Returns the server time in ms
local now = now_ms()
rcall('ZADD', KEYS[1], now, ARGV[1])
rcall('HSET', KEYS[2], 'info', ARGV[2], 'seen', now)
rcall('EXPIRE', KEYS[2], ARGV[3])
return now
