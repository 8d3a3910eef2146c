-- release.lua: hand jobs back to the queue at once (graceful stop).
-- A hand-back never consumes an attempt (invariant 15). A started job is released only under
-- the caller's token; its interrupted attempt is refunded and the token cleared, so a handler
-- still running somewhere is fenced out. A job this worker started without ever learning of it
-- (the start's reply lost at stop, a hand-off not yet read) is released by its entry alone:
-- its token carries the releasing worker's prefix (this run of it), so its handler never ran
-- and its attempt is refunded too; a start of an earlier run of the same consumer name keeps
-- its attempt (that run may have run the handler before it died).
-- Safe to repeat: a released job's record points at its new entry, so a repeat answers 0.
-- A delivered-but-unstarted entry is released when the record still points at it (a grouped
-- job admitted from its wait list takes its entry first: _groups.lua's g_adopt; it keeps its
-- group slot, as every released job does).
-- The old entry is acked and deleted and a fresh entry is appended, so any worker can take it.
-- A layout-1 record is handed back in layout 1, which old workers read (_lib.lua's rec_t and
-- v1_restore).
-- KEYS[1]   ready stream
-- KEYS[2]   stats HASH
-- KEYS[3]   events STREAM
-- KEYS[3+i] job record HASH of job i (i = 1..N)
-- ARGV[1]   consumer group
-- ARGV[2]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[3]   consumer name releasing (unstarted entries of a previous life of it may go too)
-- ARGV[4]   the releasing worker's lease-token prefix (its starts in this run; '' = none)
-- ARGV[5..] per job i: job id, stream entry id, lease token ('' when not known) (triples)
-- Returns per job: 1 released, 0 not ours to release (left untouched)
local stream, stats, events = KEYS[1], KEYS[2], KEYS[3]
local group, events_maxlen, consumer, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()
local out = {}
local n = (#ARGV - 4) / 3
for i = 1, n do
  local id, entry, token = ARGV[2 + 3 * i], ARGV[3 + 3 * i], ARGV[4 + 3 * i]
  local jobkey = KEYS[3 + i]
  local r = rec(jobkey, false, 's', 'k', 'e', 'n', 'o', 'gw')
  if not r.err and not r[3] and r[6] and token == '' and g_adopt(jobkey, stream, entry, r[6]) then
    r[3] = entry
  end
  local ok = false
  if r[3] == entry then
    if token ~= '' then
      ok = r[1] == 'active' and r[2] == token
      if ok then
        rcall('HSET', jobkey, 'n', math.max(0, (tonumber(r[4]) or 1) - 1))
      end
    else
      ok = r[1] == 'queued' or (r[1] == 'active' and r[5] == consumer)
      if ok and r[1] == 'active' and prefix ~= '' and r[2]
          and string.sub(r[2], 1, #prefix) == prefix then
        rcall('HSET', jobkey, 'n', math.max(0, (tonumber(r[4]) or 1) - 1))
      end
    end
  end
  if ok then
    ack_del(stream, group, entry)
    set_entry(jobkey, 'queued', rcall('XADD', stream, '*', 'id', id))
    rcall('HDEL', jobkey, 'k', 'o')
    rcall('HINCRBY', stats, 'released', 1)
    emit(events, events_maxlen, id, 'released', now, consumer)
    out[i] = 1
  else
    out[i] = 0
  end
end
v1_restore()  -- (layout-1 records read here: back in layout 1)
return out
