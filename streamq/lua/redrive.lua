-- redrive.lua: send dead-lettered jobs back to the queue with fresh attempts.
-- Each dead entry is consumed atomically (checked, then deleted), so two operators re-driving
-- the same selection at once re-drive every job exactly once; re-running is harmless.
-- Safe to repeat: a repeat finds its dead entries gone and answers 'gone'. A layout-1 record
-- stays in layout 1 (_lib.lua's rec_t and v1_restore). A layout-2 record that an old worker
-- dead-lettered as 'job record corrupted' (it wrote 'state' = failed beside 's') is re-driven
-- too, its layout-1 fields dropped.
-- KEYS[1]   ready stream
-- KEYS[2]   dead STREAM
-- KEYS[3]   stats HASH
-- KEYS[4]   events STREAM
-- KEYS[4+i] job record HASH of dead entry i (i = 1..N)
-- KEYS[5+N .. 15+N] the group keys (Keys.group_keys): a grouped job re-enters its group
--           (admitted or waiting: _lib.lua's g_enter)
-- KEYS[#KEYS-4 .. #KEYS] (optional) the levels SET, then the ready streams of priorities
--           0, 1, 3, 4: a job with a priority ('p') goes back to its level's stream (the
--           count of keys after the records says what came: 11 groups, 5 levels, 16 both)
-- ARGV[1]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[2]   who re-drives (recorded in the event)
-- ARGV[3]   group defaults (QueueConfig.group_arg)
-- ARGV[4..] per dead entry i: dead entry id, job id (pairs)
-- A re-driven job of a workflow keeps its parents SET and dependency results (_flow.lua's
-- redriven): completing, it re-opens the job its failure dead-lettered (docs/workflows.md).
-- Returns per entry: 'redriven' | 'gone' (entry no longer in the dead stream) | 'missing'
--           (record expired: entry removed) | 'not_failed' (job is in another state: entry
--           removed) | 'not_a_job' (a malformed-entry record: kept for inspection)
local stream, dead, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local events_maxlen, who = ARGV[1], ARGV[2]
local now = now_ms()
local out = {}
local redriven = 0
local n = (#ARGV - 3) / 2
local G = gctx(KEYS, 5 + n, ARGV[3])
local extra = #KEYS - (4 + n)  -- keys after the records
local lv = (extra == 5 or extra == 16) and (#KEYS - 4) or nil  -- the level keys
for i = 1, n do
  local dead_id, id = ARGV[2 + 2 * i], ARGV[3 + 2 * i]
  local jobkey = KEYS[4 + i]
  if #rcall('XRANGE', dead, dead_id, dead_id) == 0 then
    out[i] = 'gone'
  elseif id == '' then
    out[i] = 'not_a_job'
  else
    rcall('XDEL', dead, dead_id)
    local r = rec(jobkey, true, 's', 'g', 'p')
    local state = r[1]
    if state and state ~= 'failed' and rcall('HGET', jobkey, 'state') == 'failed' then
      -- a layout-2 record an old worker dead-lettered as corrupted (during a rolling
      -- upgrade, docs/key-layout.md): its start.lua wrote layout-1 fields beside 's' and
      -- deleted the stream entry. Failed, and re-driven as such.
      rcall('HDEL', jobkey, 'state', 'entry', 'token', 'finished')
      state = 'failed'
    end
    if not state then
      out[i] = 'missing'
    elseif state ~= 'failed' then
      out[i] = 'not_failed'
    else
      rcall('PERSIST', jobkey)
      rcall('HDEL', jobkey, 'reason', 'f', 'o', 'r', 'k', 'n')
      local fl = rcall('HMGET', jobkey, 'pk', 'wk')
      if fl[1] or fl[2] then
        lib_flow().redriven(jobkey)  -- workflows: its parents SET, its dependency results
      end
      local to = stream
      if lv and r[3] then
        to = level_stream(KEYS, lv, r[3], stream)
        level_used(KEYS, lv, r[3])
      end
      if G and r[2] then
        local entry = g_enter(G, r[2], id, jobkey, to, now)
        if entry then set_entry(jobkey, 'queued', entry) end
      else
        set_entry(jobkey, 'queued', rcall('XADD', to, '*', 'id', id))
      end
      emit(events, events_maxlen, id, 'redriven', now, who)
      redriven = redriven + 1
      out[i] = 'redriven'
    end
  end
end
count(stats, 'redriven', redriven)
v1_restore()  -- (layout-1 records read here: back in layout 1)
return out
