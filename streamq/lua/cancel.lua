-- cancel.lua: cancel a job that has not started (scheduled, queued or retrying).
-- Safe to repeat: a repeat finds the job 'cancelled' and answers not_cancellable with that
-- state, which the client reads as its own earlier cancel when it is retrying. A layout-1
-- record is upgraded in place first (_lib.lua's rec; an active one is only read).
-- KEYS[1]   job record HASH
-- KEYS[2]   ready stream
-- KEYS[3]   delayed ZSET
-- KEYS[4]   stats HASH
-- KEYS[5]   events STREAM
-- ARGV[1]   consumer group
-- ARGV[2]   job id
-- ARGV[3]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- Returns {code, state}: code 'cancelled' | 'not_found' | 'not_cancellable'; state is the
--           state the job was in.
local jobkey, stream, delayed, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, id, events_maxlen = ARGV[1], ARGV[2], ARGV[3]
local r = rec(jobkey, false, 's', 'e', 'x', 'notify')
local state = r[1]
if not state then return {'not_found', ''} end
if state == 'scheduled' or state == 'retrying' then
  redis.call('ZREM', delayed, id)
  if state == 'retrying' then redis.call('HINCRBY', stats, 'retrying_now', -1) end
elseif state == 'queued' then
  ack_del(stream, group, r[2])
else
  return {'not_cancellable', state}
end
local now = now_ms()
redis.call('HSET', jobkey, 's', 'x', 'f', now)
local ttl = tonumber(r[3]) or 0
if r[3] == '0' then  -- fire-and-forget: kept a minute (a repeated cancel still sees it)
  redis.call('EXPIRE', jobkey, 60)
elseif ttl > 0 then
  redis.call('EXPIRE', jobkey, ttl)
end
redis.call('HINCRBY', stats, 'cancelled', 1)
emit(events, events_maxlen, id, 'cancelled', now, state)
notify(r[4], 'cancelled', id)
return {'cancelled', state}
