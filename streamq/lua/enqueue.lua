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
-- Returns a flat array, 5 per job: status (queued|scheduled|duplicate|full), state,
--           result ('' unless completed), error ('' unless failed), 1 when an existing
--           duplicate carries this very envelope (a retried call), else 0.
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
for i = 1, n do
  local b = 5 + 9 * (i - 1)
  local status, state, result, err, mine = accept(KEYS[4 + i], stream, delayed, events,
    events_maxlen, wake, now, ARGV, b, max_depth > 0 and depth >= max_depth)
  if status == 'duplicate' then
    duplicates = duplicates + 1
  elseif status == 'full' then
    rejected = rejected + 1
  else
    enqueued = enqueued + 1
    if depth >= 0 then depth = depth + 1 end
  end
  out[#out + 1] = status; out[#out + 1] = state; out[#out + 1] = result
  out[#out + 1] = err; out[#out + 1] = mine
end
count(stats, 'enqueued', enqueued)
count(stats, 'duplicates', duplicates)
count(stats, 'rejected_full', rejected)
return out
