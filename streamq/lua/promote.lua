-- promote.lua: move due jobs from the delayed ZSET into the ready stream (one capped batch).
-- The caller passes candidate ids (the lowest scores it read); this script re-checks each one
-- against the server clock, so concurrent promoters move every job exactly once.
-- Safe to repeat: a repeat finds its candidates no longer in the delayed ZSET and moves nothing.
-- A layout-1 record is moved in layout 1, which old workers read (_lib.lua's rec_t and
-- v1_restore).
-- KEYS[1]   delayed ZSET
-- KEYS[2]   ready stream
-- KEYS[3]   dead STREAM (for ids whose job record is missing)
-- KEYS[4]   stats HASH
-- KEYS[5]   events STREAM
-- KEYS[5+i] job record HASH of candidate i (i = 1..N)
-- KEYS[6+N .. 16+N] the group keys (Keys.group_keys): a grouped job is admitted to the
--           stream or waits for a slot of its group (_lib.lua's g_enter)
-- KEYS[#KEYS-4 .. #KEYS] (optional) the levels SET, then the ready streams of priorities
--           0, 1, 3, 4: a job whose record has a priority ('p') goes to its level's stream
--           (without them, to KEYS[2], as before priorities; the count of keys after the
--           records says what came: 11 groups, 5 levels, 16 both)
-- ARGV[1]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[2]   dead-letter retention in seconds
-- ARGV[3]   dead stream max length
-- ARGV[4]   group defaults (QueueConfig.group_arg)
-- ARGV[5..] the N candidate job ids, in the same order as KEYS[6..]
-- Returns {moved, server now ms, next due ms or -1}
local delayed, stream, dead, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local events_maxlen, dead_ttl, dead_maxlen = ARGV[1], ARGV[2], ARGV[3]
local now = now_ms()
local moved, missing, retries = 0, 0, 0
local G = gctx(KEYS, 2 + #ARGV, ARGV[4])
local extra = #KEYS - 1 - #ARGV  -- keys after the records
local lv = (extra == 5 or extra == 16) and (#KEYS - 4) or nil  -- the level keys
for i = 5, #ARGV do
  local id = ARGV[i]
  local jobkey = KEYS[i + 1]
  local score = rcall('ZSCORE', delayed, id)
  if score and tonumber(score) <= now then
    rcall('ZREM', delayed, id)
    local r = rec(jobkey, true, 's', 'g', 'p')
    local state = not r.err and r[1] or nil  -- corrupted: as missing
    if state == 'retrying' then retries = retries + 1 end
    local to = stream
    if lv and r[3] and (state == 'scheduled' or state == 'retrying') then
      to = level_stream(KEYS, lv, r[3], stream)
      level_used(KEYS, lv, r[3])
    end
    if state and G and r[2] and (state == 'scheduled' or state == 'retrying') then
      local entry = g_enter(G, r[2], id, jobkey, to, now)
      if entry then set_entry(jobkey, 'queued', entry) end
      emit(events, events_maxlen, id, 'queued', now, state)
      moved = moved + 1
    elseif state == 'scheduled' or state == 'retrying' then
      set_entry(jobkey, 'queued', rcall('XADD', to, '*', 'id', id))
      emit(events, events_maxlen, id, 'queued', now, state)
      moved = moved + 1
    elseif not state then
      rcall('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', 'job', id,
        'reason', 'job record missing', 'etype', 'MissingRecord', 'type', '', 't', now)
      missing = missing + 1
    end
  end
end
count(stats, 'failed', missing)
count(stats, 'retrying_now', -retries)
local first = rcall('ZRANGE', delayed, 0, 0, 'WITHSCORES')
local next_due = -1
if first[2] then next_due = tonumber(first[2]) end
v1_restore()  -- (layout-1 records read here: back in layout 1)
return {moved, now, next_due}
