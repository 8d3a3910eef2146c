-- enqueue.lua: accept N jobs (N >= 1) atomically per job, with dedup by id and backpressure.
-- KEYS[1]   ready stream
-- KEYS[2]   delayed ZSET
-- KEYS[3]   stats HASH
-- KEYS[4]   events STREAM
-- KEYS[4+i] job record HASH of job i (i = 1..N)
-- ARGV[1]   events max length (0 = no events)
-- ARGV[2]   max queue depth, ready + in flight + delayed (0 = unlimited)
-- ARGV[3]   wake channel published when a delayed job becomes the earliest ('' = none)
-- ARGV[4]   N, the number of jobs
-- ARGV[5 + 9*(i-1) ..] per job i: id, type, envelope, max_attempts, result_ttl_s,
--           deadline_ms (0 = none; negative = that many ms after the server's now),
--           delay_ms, run_at_ms (0 = none), notify channel ('' = none)
-- Returns a flat array, in job order: 1 element for a job accepted or refused, its status
--           (queued|scheduled|full); 5 for a duplicate: 'duplicate', its state, result
--           ('' unless completed), error ('' unless failed), 1 when it carries this very
--           envelope (a retried call) else 0.
local stream, delayed, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local events_maxlen = ARGV[1]
local max_depth = tonumber(ARGV[2])
local wake = ARGV[3]
local n = tonumber(ARGV[4])
local now = now_ms()
local out = {}
local depth = -1
if max_depth > 0 then
  depth = redis.call('XLEN', stream) + redis.call('ZCARD', delayed)
end
local enqueued, duplicates, rejected = 0, 0, 0
-- One EXISTS over the batch: when no record exists yet (a fresh bulk load, the common case)
-- no job needs its own check, except an id that comes again within this call.
local none_exist = n > 1 and redis.call('EXISTS', unpack(KEYS, 5, 4 + n)) == 0
local seen = {}
for i = 1, n do
  local b = 5 + 9 * (i - 1)
  local jobkey = KEYS[4 + i]
  local status, state, result, err, mine = accept(jobkey, stream, delayed, events,
    events_maxlen, wake, now, ARGV, b, max_depth > 0 and depth >= max_depth,
    none_exist and not seen[jobkey])
  seen[jobkey] = true
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
