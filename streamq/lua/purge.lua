-- purge.lua: delete jobs in one state, with their index entries. Active jobs are never purged
-- (a worker holds them); completed and cancelled records have no index and expire on their own.
-- Safe to repeat: a repeat finds the records gone and answers 'skipped'.
-- KEYS[1]   ready stream
-- KEYS[2]   delayed ZSET
-- KEYS[3]   dead STREAM
-- KEYS[4]   stats HASH
-- KEYS[5]   events STREAM
-- KEYS[5+i] job record HASH of job i (i = 1..N)
-- ARGV[1]   consumer group
-- ARGV[2]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[3]   the state to purge: queued | scheduled | retrying | failed
-- ARGV[4..] per job i: job id, dead entry id (for failed jobs; '' otherwise) (pairs)
-- Returns per job: 'purged' | 'skipped' (the job is in another state now)
local stream, delayed, dead, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, events_maxlen, wanted = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local out = {}
local purged, retries = 0, 0
local n = (#ARGV - 3) / 2
for i = 1, n do
  local id, dead_id = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
  local jobkey = KEYS[5 + i]
  local r = rec(jobkey, false, 's', 'e')
  local state = r[1]
  if wanted == 'failed' and dead_id ~= '' and (state == 'failed' or not state) then
    redis.call('XDEL', dead, dead_id)  -- also clears entries whose record already expired
  end
  if state ~= wanted or state == 'active' then
    out[i] = 'skipped'
  else
    if state == 'queued' then
      ack_del(stream, group, r[2])
    elseif state == 'scheduled' or state == 'retrying' then
      redis.call('ZREM', delayed, id)
      if state == 'retrying' then retries = retries + 1 end
    end
    redis.call('DEL', jobkey)
    emit(events, events_maxlen, id, 'purged', now, state)
    purged = purged + 1
    out[i] = 'purged'
  end
end
count(stats, 'purged', purged)
count(stats, 'retrying_now', -retries)
return out
