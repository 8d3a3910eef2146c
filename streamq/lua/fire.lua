-- fire.lua: fire one cron tick: enqueue its job unless this tick (or a later one) already
-- fired. With a deterministic job id per (cron name, tick) as well, several schedulers can
-- race on the same tick and exactly one job is enqueued.
-- KEYS[1]   ready stream
-- KEYS[2]   delayed ZSET
-- KEYS[3]   stats HASH
-- KEYS[4]   events STREAM
-- KEYS[5]   job record HASH of the tick's job
-- KEYS[6]   cron state HASH (field '<name>:last' = last fired tick ms, '<name>' = ops info)
-- ARGV[1]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[2]   wake channel ('' = none)
-- ARGV[3]   cron entry name
-- ARGV[4]   tick, ms since the epoch
-- ARGV[5]   ops info (JSON text) stored under '<name>' when the tick fires
-- ARGV[6..14] the job: id, options, body, max_attempts, result_ttl_s, deadline_ms, delay_ms,
--           run_at_ms, notify channel (as in enqueue.lua)
-- ARGV[15]  mode: 'fire' (enqueue the tick's job) or 'skip' (a missed tick: only mark it fired)
-- ARGV[16]  (optional) the shard count the scheduler routed the tick's job by: when KEYS[3]
--           has 'lay' (a reshard froze the shard: enqueue.lua's header) and it differs, the
--           call writes nothing and answers the error 'STREAMQ_LAYOUT <lay>'
-- Returns {status, state}: status 'queued' | 'scheduled' | 'duplicate' | 'skipped' | 'stale'
--           (an equal or later tick already fired; nothing written) | 'future' (the tick is
--           still in the server's future: the caller's clock is ahead; nothing written)
-- Safe to repeat: a repeat finds its own tick already fired ('stale').
local stream, delayed, stats, events, jobkey, cron = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5], KEYS[6]
local name, tick = ARGV[3], tonumber(ARGV[4])
if ARGV[16] and ARGV[16] ~= '' then
  local lay = rpcall('HGET', stats, 'lay')
  if type(lay) == 'string' and lay ~= ARGV[16] then
    return redis.error_reply('STREAMQ_LAYOUT ' .. lay)
  end
end
local last = tonumber(rcall('HGET', cron, name .. ':last') or '-1')
if last >= tick then return {'stale', ''} end
local now = now_ms()
if tick > now then return {'future', ''} end  -- ticks are decided by the server's clock
if ARGV[15] == 'skip' then
  rcall('HSET', cron, name .. ':last', tick)
  return {'skipped', ''}
end
local status, state = accept(jobkey, stream, delayed, events, ARGV[1], ARGV[2], now, ARGV, 6,
  false)
rcall('HSET', cron, name .. ':last', tick, name, ARGV[5])
if status == 'duplicate' then
  count(stats, 'duplicates', 1)
else
  count(stats, 'enqueued', 1)
end
if V1_KEPT then lib_cold().v1_restore() end  -- (layout-1 records read: back in layout 1)
return {status, state}
