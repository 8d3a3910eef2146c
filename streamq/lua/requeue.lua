-- requeue.lua: hand pending entries back to the queue as fresh entries (recovery sweeps when
-- no worker is alive, operator requeue of a stuck job). The interrupted attempt counts: a job
-- whose attempts are exhausted is dead-lettered instead. The lease token is cleared, so a
-- worker still running the job somewhere is fenced out.
-- KEYS[1]   ready stream
-- KEYS[2]   dead STREAM
-- KEYS[3]   stats HASH
-- KEYS[4]   events STREAM
-- KEYS[4+i] job record HASH of entry i (i = 1..N)
-- ARGV[1]   consumer group
-- ARGV[2]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[3]   dead-letter retention in seconds
-- ARGV[4]   dead stream max length
-- KEYS[5+N .. 15+N] the group keys (Keys.group_keys): a grouped job dead-lettered here frees
--           its slot; one admitted from its wait list takes its entry first (g_adopt)
-- ARGV[5]   who requeues (recorded in the event)
-- ARGV[6]   group defaults (QueueConfig.group_arg)
-- ARGV[7..] per entry i: stream entry id, job id ('' when the entry has none) (pairs)
-- Returns per entry: 'requeued' | 'failed' (dead-lettered) | 'skipped' (not pending work of
--           this job: acked and deleted as a ghost) | 'missing' (no record, or an empty job id:
--           a malformed stream entry; dead-lettered)
-- Safe to repeat: a dead letter is written only while the entry is still in the stream, and a
-- requeued job's record points at its new entry, so a repeat skips it. A layout-1 record (an
-- older worker's) stays in layout 1 (_lib.lua's rec_t and v1_restore).
local stream, dead, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local group, events_maxlen, dead_ttl, dead_maxlen, who = ARGV[1], ARGV[2], ARGV[3], ARGV[4],
  ARGV[5]
local now = now_ms()
local out = {}
local requeued, failed = 0, 0
local n = (#ARGV - 6) / 2
local G = gctx(KEYS, 5 + n, ARGV[6])
for i = 1, n do
  local entry, id = ARGV[5 + 2 * i], ARGV[6 + 2 * i]
  local jobkey = KEYS[4 + i]
  local gr = {}
  if G and id ~= '' then
    gr = rpcall('HMGET', jobkey, 'g', 'e', 'gw')
    if not gr.err and gr[1] and not gr[2] and gr[3] then g_adopt(jobkey, stream, entry, gr[3]) end
  end
  rcall('XACK', stream, group, entry)
  local present = rcall('XDEL', stream, entry) == 1  -- a repeated call finds it gone
  local r = {}
  if id ~= '' then r = rec(jobkey, true, 's', 'e', 'n', 'max_attempts') end
  local state = r[1]
  if id == '' then  -- an entry without a job id
    if present then
      rcall('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', 'job', '', 'reason',
        'malformed stream entry', 'etype', 'MalformedEntry', 'type', '', 't', now,
        'entry', entry, 'raw', 'no job id')
      failed = failed + 1
    end
    out[i] = 'missing'
  elseif not state then
    if present then
      rcall('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', 'job', id,
        'reason', 'job record missing', 'etype', 'MissingRecord', 'type', '', 't', now)
      failed = failed + 1
    end
    out[i] = 'missing'
  elseif r[2] ~= entry or (state ~= 'queued' and state ~= 'active') then
    out[i] = 'skipped'
  elseif state == 'active' and (tonumber(r[4]) or 0) > 0
      and (tonumber(r[3]) or 0) >= tonumber(r[4]) then
    bury(jobkey, dead, events, id, 'attempts exhausted (lease lapsed)', '', 'LeaseExpired',
      now, dead_ttl, dead_maxlen, events_maxlen, true)
    if gr[1] then g_release(G, gr[1], id, stream, now) end
    failed = failed + 1
    out[i] = 'failed'
  else
    set_entry(jobkey, 'queued', rcall('XADD', stream, '*', 'id', id))
    rcall('HDEL', jobkey, 'k')
    emit(events, events_maxlen, id, 'requeued', now, who)
    requeued = requeued + 1
    out[i] = 'requeued'
  end
end
count(stats, 'requeued', requeued)
count(stats, 'failed', failed)
v1_restore()  -- (layout-1 records read here: back in layout 1)
return out
