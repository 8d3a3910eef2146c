-- purge.lua: delete jobs in one state, with their index entries. Active jobs are never purged
-- (a worker holds them); completed and cancelled records have no index and expire on their own.
-- Safe to repeat: a repeat finds the records gone and answers 'skipped'.
-- KEYS[1]   ready stream
-- KEYS[2]   delayed ZSET
-- KEYS[3]   dead STREAM
-- KEYS[4]   stats HASH
-- KEYS[5]   events STREAM
-- KEYS[5+i] job record HASH of job i (i = 1..N)
-- KEYS[6+N .. 16+N] the group keys (Keys.group_keys): a purged grouped job leaves its
--           group's wait list or frees its slot (the next waiting job is admitted)
-- KEYS[#KEYS-4 .. #KEYS] (optional) the levels SET, then the ready streams of priorities
--           0, 1, 3, 4: a queued job with a priority ('p') has its entry in its level's
--           stream (the count of keys after the records says what came: 11 groups, 5
--           levels, 16 both)
-- ARGV[1]   consumer group
-- ARGV[2]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[3]   the state to purge: queued | scheduled | retrying | failed
-- ARGV[4]   group defaults (QueueConfig.group_arg)
-- ARGV[5..] per job i: job id, dead entry id (failed jobs) or the stream entry it was
--           listed from (queued jobs; '' for a job listed from its group's wait list) (pairs)
-- A purged job's dedup key is freed if it still names the job (_lib.lua's dedup_end).
-- A purged job's parents are resolved ('purged': _flow.lua's settled), its dependency keys go.
-- Returns per job: 'purged' | 'skipped' (the job is in another state now)
local stream, delayed, dead, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, events_maxlen, wanted = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local out = {}
local purged, retries = 0, 0
local n = (#ARGV - 4) / 2
DD_DELAYED = delayed  -- (a keep_last job purged while retrying: its follow-up is due)
local G = gctx(KEYS, 6 + n, ARGV[4])
local extra = #KEYS - (5 + n)  -- keys after the records
local lv = (extra == 5 or extra == 16) and (#KEYS - 4) or nil  -- the level keys
for i = 1, n do
  local id, dead_id = ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local jobkey = KEYS[5 + i]
  local r = rec(jobkey, false, 's', 'e', 'g', 'gw', 'p', 'dk')
  local state = r[1]
  local g = G and r[3] or nil
  if g and wanted == 'queued' and state == 'queued' and not r[2] and r[4] and dead_id ~= ''
      and g_adopt(jobkey, stream, dead_id, r[4]) then
    r[2], r[4] = dead_id, nil  -- admitted from its wait list: its entry goes with it
  end
  if wanted == 'failed' and dead_id ~= '' and (state == 'failed' or not state) then
    rcall('XDEL', dead, dead_id)  -- also clears entries whose record already expired
  end
  if state ~= wanted or state == 'active' then
    out[i] = 'skipped'
  else
    if state == 'queued' then
      ack_del(lv and level_stream(KEYS, lv, r[5], stream) or stream, group, r[2])
      if g and not (r[4] and g_unwait(G, g, id, r[4])) then g_release(G, g, id, stream, now) end
    elseif state == 'scheduled' or state == 'retrying' then
      rcall('ZREM', delayed, id)
      if state == 'retrying' then retries = retries + 1 end
    end
    if r[6] then dedup_end(r[6], jobkey, id, false, now) end  -- (docs/dedup.md)
    local fl = rcall('HMGET', jobkey, 'pk', 'wk')  -- workflows: parents, dependencies
    if fl[1] or fl[2] then lib_flow().settled(jobkey, id, 'p' .. state, fl[1], fl[2], now) end
    rcall('DEL', jobkey)
    emit(events, events_maxlen, id, 'purged', now, state)
    purged = purged + 1
    out[i] = 'purged'
  end
end
count(stats, 'purged', purged)
count(stats, 'retrying_now', -retries)
v1_restore()  -- (layout-1 records read here: back in layout 1)
return out
