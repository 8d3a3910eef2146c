-- enqueue.lua: accept N jobs (N >= 1) atomically per job, with dedup by id and backpressure.
-- Safe to repeat: a repeat finds its own jobs and answers 'duplicate' with mine = 1 (the same
-- writer tag and offset, or without tags the same body and options), writing nothing new.
-- Records are written in layout 2 (_lib.lua's rec); a duplicate's layout-1 record is read too.
-- KEYS[1]   ready stream
-- KEYS[2]   delayed ZSET
-- KEYS[3]   stats HASH
-- KEYS[4]   events STREAM
-- KEYS[4+i] job record HASH of job i (i = 1..N)
-- ARGV[1]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[2]   max queue depth, ready + in flight + delayed (0 = unlimited)
-- ARGV[3]   wake channel published when a delayed job becomes the earliest ('' = none)
-- KEYS[5+N .. 15+N] the group keys (Keys.group_keys), only when a job of the batch has a group
-- KEYS[#KEYS-4 .. #KEYS] the levels SET, then the ready streams of priorities 0, 1, 3, 4:
--           only when a job of the batch has a priority other than the default (so the
--           count of keys after the records says what came: 0, 11 groups, 5 levels, 16 both)
-- ARGV[4]   N, the number of jobs
-- ARGV[5 + 10*(i-1) ..] per job i: id, options (serialised; '' = all default), body
--           ('<type> <serialised payload>'), max_attempts, result_ttl_s,
--           deadline_ms (0 = none; negative = that many ms after the server's now),
--           delay_ms, run_at_ms (0 = none), notify channel ('' = none), writer tag ('' =
--           none; Spark rows: '<run>:<partition>:<task attempt id>:<row offset>', stored as
--           the record's 'w' field; _lib.lua's writer_mine)
-- ARGV[5+10*N]     group defaults (QueueConfig.group_arg), then ARGV[5+10*N+i] the group of
--           job i ('' = none): only with the group keys. A ready grouped job is admitted to
--           the stream or waits for a slot of its group (_lib.lua's g_enter).
-- ARGV[#ARGV-N+i] (only with the level keys) the priority of job i ('' = the default, 2:
--           KEYS[1]; else 0..4, kept as the record's 'p', the level added to the levels SET)
-- Returns a flat array, in job order: 1 element for a job accepted or refused, its status
--           (queued|scheduled|full); 5 for a duplicate: 'duplicate', its state, result
--           ('' unless completed), error ('' unless failed), mine: 1 when this very row
--           wrote it (with a writer tag: by writer_mine's rules, a retried call or a row of
--           an earlier task attempt; without: it carries this very body and options, a
--           retried call) else 0.
local stream, delayed, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local events_maxlen = ARGV[1]
local max_depth = tonumber(ARGV[2])
local wake = ARGV[3]
local n = tonumber(ARGV[4])
local now = now_ms()
local out = {}
local G = gctx(KEYS, 5 + n, ARGV[5 + 10 * n])
local depth = -1
if max_depth > 0 then
  depth = redis.call('XLEN', stream) + redis.call('ZCARD', delayed)
  if G then depth = depth + redis.call('ZCARD', G.wait) end
end
local enqueued, duplicates, rejected = 0, 0, 0
-- Every key is checked before anything is written: a key of the wrong type (overwritten by
-- hand) refuses the whole call, never half of it.
local function expect(key, cmd, want, arg)
  local r
  if arg then r = redis.pcall(cmd, key, arg) else r = redis.pcall(cmd, key) end
  if type(r) == 'table' and r.err then
    if string.sub(r.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('WRONGTYPE ' .. key .. ' is not a ' .. want
        .. ': nothing was enqueued')
    end
    return r  -- any other refusal (NOPERM, ...) as the server said it
  end
end
local bad = expect(stream, 'XLEN', 'stream') or expect(delayed, 'ZCARD', 'zset')
  or expect(stats, 'HGET', 'hash', 'enqueued') or expect(events, 'XLEN', 'stream')
if bad then return bad end
-- One EXISTS over the batch: when no record exists yet (a fresh bulk load, the common case)
-- no job needs its own check, except an id that comes again within this call.
local none_exist = redis.call('EXISTS', unpack(KEYS, 5, 4 + n)) == 0
if not none_exist then
  for i = 1, n do
    bad = expect(KEYS[4 + i], 'HGET', 'hash', 's')
    if bad then return bad end
  end
end
local seen, used = {}, {}
local extra = #KEYS - 4 - n
local lv = (extra == 5 or extra == 16) and (#KEYS - 4) or nil  -- the level keys
for i = 1, n do
  local b = 5 + 10 * (i - 1)
  local jobkey = KEYS[4 + i]
  local prio = lv and ARGV[#ARGV - n + i] or ''
  local to = stream
  if prio ~= '' then to = level_stream(KEYS, lv, prio, stream) end
  local status, state, result, err, mine = accept(jobkey, to, delayed, events,
    events_maxlen, wake, now, ARGV, b, max_depth > 0 and depth >= max_depth,
    none_exist and not seen[jobkey], ARGV[b + 9], G, G and ARGV[5 + 10 * n + i], prio)
  seen[jobkey] = true
  if prio ~= '' and not used[prio] and (status == 'queued' or status == 'scheduled') then
    used[prio] = true
    level_used(KEYS, lv, prio)
  end
  if status == 'duplicate' then
    duplicates = duplicates + 1
  elseif status == 'full' then
    rejected = rejected + 1
  else
    enqueued = enqueued + 1
    if depth >= 0 then depth = depth + 1 end
  end
  out[#out + 1] = status
  if status == 'duplicate' then
    out[#out + 1] = state; out[#out + 1] = result; out[#out + 1] = err; out[#out + 1] = mine
  end
end
count(stats, 'enqueued', enqueued)
count(stats, 'duplicates', duplicates)
count(stats, 'rejected_full', rejected)
return out
