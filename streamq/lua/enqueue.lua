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
  local jobkey = KEYS[4 + i]
  local id, jtype, env = ARGV[b], ARGV[b + 1], ARGV[b + 2]
  if redis.call('EXISTS', jobkey) == 1 then
    local existing = redis.call('HMGET', jobkey, 'state', 'result', 'error', 'env')
    duplicates = duplicates + 1
    local mine = 0
    if existing[4] == env then mine = 1 end
    out[#out + 1] = 'duplicate'
    out[#out + 1] = existing[1] or ''
    out[#out + 1] = existing[2] or ''
    out[#out + 1] = existing[3] or ''
    out[#out + 1] = mine
  elseif max_depth > 0 and depth >= max_depth then
    rejected = rejected + 1
    out[#out + 1] = 'full'; out[#out + 1] = ''; out[#out + 1] = ''
    out[#out + 1] = ''; out[#out + 1] = 0
  else
    local delay_ms, run_at = tonumber(ARGV[b + 6]), tonumber(ARGV[b + 7])
    local due = 0
    local deadline = tonumber(ARGV[b + 5])
    if deadline < 0 then deadline = now - deadline end
    if run_at > 0 then due = run_at elseif delay_ms > 0 then due = now + delay_ms end
    local fields = {'type', jtype, 'env', env, 'result_ttl', ARGV[b + 4], 'created', now}
    if ARGV[b + 3] ~= '0' then
      fields[#fields + 1] = 'max_attempts'; fields[#fields + 1] = ARGV[b + 3]
    end
    if deadline > 0 then
      fields[#fields + 1] = 'deadline'; fields[#fields + 1] = deadline
    end
    if ARGV[b + 8] ~= '' then
      fields[#fields + 1] = 'notify'; fields[#fields + 1] = ARGV[b + 8]
    end
    local status
    if due > now then
      wake_if_sooner(delayed, wake, due)
      redis.call('ZADD', delayed, due, id)
      status = 'scheduled'
      fields[#fields + 1] = 'due'; fields[#fields + 1] = due
    else
      local entry = redis.call('XADD', stream, '*', 'id', id)
      status = 'queued'
      fields[#fields + 1] = 'entry'; fields[#fields + 1] = entry
      fields[#fields + 1] = 'enqueued'; fields[#fields + 1] = now
    end
    fields[#fields + 1] = 'state'; fields[#fields + 1] = status
    redis.call('HSET', jobkey, unpack(fields))
    enqueued = enqueued + 1
    emit(events, events_maxlen, id, 'enqueued', now, status)
    if depth >= 0 then depth = depth + 1 end
    out[#out + 1] = status; out[#out + 1] = status; out[#out + 1] = ''
    out[#out + 1] = ''; out[#out + 1] = 0
  end
end
count(stats, 'enqueued', enqueued)
count(stats, 'duplicates', duplicates)
count(stats, 'rejected_full', rejected)
return out
