-- cancel.lua: cancel a job. One that has not started (scheduled, queued or retrying) ends
-- 'cancelled' here. A running ('active') one gets the request recorded in its record ('cx' =
-- the request time, ms) and its job id published on the cancel channel, which its worker
-- listens to (streamq/_worker/cancel.py): the worker stops the handler and settles the job
-- 'cancelled' (finish.lua); a reclaim of it (its worker died) ends it 'cancelled' (start.lua).
-- Safe to repeat: a repeat finds the job 'cancelled' and answers not_cancellable with that
-- state, which the client reads as its own earlier cancel when it is retrying; a repeat on a
-- running job finds 'cx' already there, keeps it, publishes again and answers the same. A
-- layout-1 record stays in layout 1 (_lib.lua's rec_t and v1_restore).
-- KEYS[1]   job record HASH
-- KEYS[2]   ready stream
-- KEYS[3]   delayed ZSET
-- KEYS[4]   stats HASH
-- KEYS[5]   events STREAM
-- KEYS[6..16] the group keys (Keys.group_keys; optional)
-- KEYS[#KEYS-4 .. #KEYS] (optional) the levels SET, then the ready streams of priorities 0,
--           1, 3, 4: a queued job with a priority ('p') has its entry in its level's stream
--           (the count of keys after KEYS[5] says what came: 11 groups, 5 levels, 16 both)
-- ARGV[1]   consumer group
-- ARGV[2]   job id
-- ARGV[3]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[4]   cancel channel of the job's shard (pub/sub; absent or '' = an older caller:
--           running jobs are not cancellable)
-- ARGV[5]   group defaults (QueueConfig.group_arg), with the group keys
-- ARGV[6]   (optional) cascade mode (streamq/_core/flow_cancel.py): the member of this job's
--           parents SET (named by its record's 'pk') of a waiting job that was cancelled. The
--           member is removed; the job is then cancelled only if no other member is left
--           and it has not started: else {'kept', state} (others wait for it) or
--           {'not_cancellable', 'active'} (no cancel request for a running job).
-- A grouped job leaves its group's wait list, or frees its slot (admitting the next one); a
-- running one frees its slot when it settles.
-- A cancelled job's dedup key is freed if it still names the job (_lib.lua's end_cancelled).
-- A job waiting for its dependencies ('waiting') ends 'cancelled' too (docs/workflows.md); its
-- pending SET is kept an hour for the caller's cascade (_flow.lua's settled).
-- Returns {code, state}: code 'cancelled' | 'cancel_requested' | 'not_found' |
--           'not_cancellable'; state is the state the job was in.
local jobkey, stream, delayed, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, id, events_maxlen, channel = ARGV[1], ARGV[2], ARGV[3], ARGV[4] or ''
local r = rec(jobkey, false, 's', 'e', 'x', 'notify', 'cx', 'g', 'gw', 'p')
DD_DELAYED = delayed  -- (a keep_last job cancelled while retrying: its follow-up is due)
local G = gctx(KEYS, 6, ARGV[5])
local g = G and r[6] or nil
local lv = (#KEYS == 10 or #KEYS == 21) and (#KEYS - 4) or nil  -- the level keys
local state = r[1]
if not state then return {'not_found', ''} end
local cascade = ARGV[6] or ''
if cascade ~= '' then
  local pk = rcall('HGET', jobkey, 'pk')
  if pk then
    local P = lib_flow().words(pk)
    rcall('SREM', P[1], cascade)
    if rcall('SCARD', P[1]) > 0 then
      v1_restore()
      return {'kept', state}
    end
  end
  if state == 'active' then
    v1_restore()
    return {'not_cancellable', state}
  end
end
if state == 'active' and channel ~= '' then
  if not r[5] then
    local now = now_ms()
    rcall('HSET', jobkey, 'cx', now)
    rcall('HDEL', jobkey, 'z')  -- (finish.lua reads 'cx' again: _lib.lua's start_entry)
    emit(events, events_maxlen, id, 'cancel_requested', now, '')
  end
  rcall('PUBLISH', channel, id)
  v1_restore()
  return {'cancel_requested', state}
end
if state == 'scheduled' or state == 'retrying' then
  rcall('ZREM', delayed, id)
  if state == 'retrying' then rcall('HINCRBY', stats, 'retrying_now', -1) end
elseif state == 'waiting' then
  -- waiting for its dependencies: nothing in a stream (end_cancelled drops its keys)
elseif state == 'queued' then
  ack_del(lv and level_stream(KEYS, lv, r[8], stream) or stream, group, r[2])
  -- waiting: off the wait list; admitted (its entry, if not yet adopted, is a ghost now)
  if g and not (r[7] and g_unwait(G, g, id, r[7])) then g_release(G, g, id, stream, now_ms()) end
else
  v1_restore()
  return {'not_cancellable', state}
end
local now = now_ms()
end_cancelled(jobkey, events, events_maxlen, id, now, state)
rcall('HINCRBY', stats, 'cancelled', 1)
v1_restore()  -- (a layout-1 record read here: back in layout 1)
return {'cancelled', state}
