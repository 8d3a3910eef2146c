-- start.lua: start a batch of delivered (or reclaimed) stream entries, one lease each.
-- Only entries in the caller's own pending list are started (a stale delivery is skipped).
-- Each startable job gets the lease token the caller chose for it (unique per start: a worker
-- prefix and a counter), its attempt counted, owner set, and its entry's idle time in the PEL
-- reset (XCLAIM ... JUSTID), so a lease never begins half-spent. Entries that must not run
-- are settled here: ghosts and finished or cancelled jobs are acked and deleted; expired or
-- exhausted jobs and malformed entries are dead-lettered. While the queue is paused, startable
-- entries are handed back as fresh stream entries with no attempt counted (pause is atomic).
-- A job whose cancel was requested while it ran ('cx', cancel.lua) and that comes back here
-- (its worker died, or handed it back) ends 'cancelled' and never runs again.
-- Safe to repeat: a job already 'active' under the very token of this call and owned by the
-- caller is the same start seen again (a lost reply): it answers 'run' with the same lease and
-- attempt and writes nothing new. A layout-1 record (an older release's) is upgraded in place
-- by the first start that owns its entry (_lib.lua's rec), which is itself safe to repeat.
-- KEYS[1]   ready stream
-- KEYS[2]   dead STREAM
-- KEYS[3]   stats HASH
-- KEYS[4]   events STREAM
-- KEYS[5]   pause flag (STRING; exists while the queue is paused)
-- KEYS[5+i] job record HASH of entry i (i = 1..N)
-- ARGV[1]   consumer group
-- ARGV[2]   consumer name
-- ARGV[3]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[4]   dead-letter retention in seconds
-- ARGV[5]   dead stream max length
-- ARGV[6]   N, the number of entries with a job id
-- ARGV[7 + 3*(i-1) ..] per entry i: stream entry id, job id, lease token for this start
-- ARGV[7 + 3*N]        M, the number of malformed entries (no usable job id)
-- ARGV[8 + 3*N + 2*(j-1) ..] per malformed entry j: stream entry id, description
-- Returns a flat array, 7 per job entry: code ('run' | 'skip' | 'dead' | 'paused'), token,
--           attempt, the job's data (job_data below; run) or the reason (skip, dead), deadline ms
--           (0 = none), ms since the job (re)entered the stream, ms since it was created.
local stream, dead, stats, events, paused = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, consumer = ARGV[1], ARGV[2]
local events_maxlen, dead_ttl, dead_maxlen = ARGV[3], ARGV[4], ARGV[5]
local n = tonumber(ARGV[6])
local now = now_ms()
local out = {}
local fresh = {}  -- entries whose lease starts now: their idle time is reset below
local started, reclaimed, failed, handed, cancelled = 0, 0, 0, 0, 0
local is_paused = redis.call('EXISTS', paused) == 1
local KNOWN = {scheduled = true, queued = true, active = true, retrying = true,
               completed = true, failed = true, cancelled = true}
-- What the worker needs to run a job: '<body>' or '!<n>:<options, n bytes><body>' (layout
-- 2), or '~<envelope>' (a layout-1 record: its producer's envelope, kept as it was).
local function job_data(r)
  if not r[6] then return '~' .. (r[11] or '') end
  if r[10] then return '!' .. #r[10] .. ':' .. r[10] .. r[6] end
  return r[6]
end
local function push(a, b, c, d, e, f, g)
  out[#out + 1] = a; out[#out + 1] = b; out[#out + 1] = c; out[#out + 1] = d
  out[#out + 1] = e or 0; out[#out + 1] = f or 0; out[#out + 1] = g or 0
end
for i = 1, n do
  local b = 7 + 3 * (i - 1)
  local entry, id, token = ARGV[b], ARGV[b + 1], ARGV[b + 2]
  local jobkey = KEYS[5 + i]
  -- Only the consumer whose pending list holds the entry may start it: a stale delivery (the
  -- caller stalled after XREADGROUP and another worker took the entry over) is left alone.
  local owner = redis.call('XPENDING', stream, group, entry, entry, 1)
  local r, state = {}, nil
  if owner[1] ~= nil and owner[1][2] == consumer then
    r = rec(jobkey, true, 's', 'e', 'n', 'max_attempts', 'deadline', 'b', 'c', 'k', 'o',
      'op', 'env', 'cx')
    state = r[1]
  end
  if owner[1] == nil or owner[1][2] ~= consumer then
    push('skip', 0, 0, 'not the owner')
  elseif r.err then  -- the key holds something else than a job record
    ack_del(stream, group, entry)
    redis.call('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', 'job', id,
      'reason', 'job record corrupted', 'etype', 'CorruptRecord', 'type', '', 't', now)
    failed = failed + 1
    push('dead', 0, 0, 'job record corrupted')
  elseif not state and redis.call('EXISTS', jobkey) == 0 then
    ack_del(stream, group, entry)
    redis.call('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', 'job', id,
      'reason', 'job record missing', 'etype', 'MissingRecord', 'type', '', 't', now)
    failed = failed + 1
    push('dead', 0, 0, 'job record missing')
  elseif not state or not KNOWN[state]
      or ((state == 'queued' or state == 'active')
        and not string.match(r[2] or '', '^%d+%-%d+$')) then
    -- a record without a usable state or stream entry is damaged, not a ghost: bury it
    ack_del(stream, group, entry)
    bury(jobkey, dead, events, id, 'job record corrupted', '', 'CorruptRecord', now,
      dead_ttl, dead_maxlen, events_maxlen, true)
    failed = failed + 1
    push('dead', 0, 0, 'job record corrupted')
  elseif r[2] ~= entry or (state ~= 'queued' and state ~= 'active') then
    -- a ghost of an older delivery, or a job already finished or cancelled
    ack_del(stream, group, entry)
    push('skip', 0, 0, state)
  elseif state == 'active' and r[8] == token and r[9] == consumer then
    -- this very start ran before (its reply was lost): the same lease, the same attempt
    fresh[#fresh + 1] = entry
    local deadline = tonumber(r[5]) or 0
    push('run', token, tonumber(r[3]) or 1, job_data(r), deadline,
      now - (entry_ms(r[2]) or now), now - (tonumber(r[7]) or now))
  elseif r[12] then  -- cancel requested while it ran: it ends here, never runs again
    ack_del(stream, group, entry)
    redis.call('HDEL', jobkey, 'k')
    end_cancelled(jobkey, events, events_maxlen, id, now, 'cancel requested')
    cancelled = cancelled + 1
    push('skip', 0, 0, 'cancelled')
  elseif is_paused then
    -- hand it back untouched (no attempt counted); a lapsed lease's owner is fenced out
    ack_del(stream, group, entry)
    set_entry(jobkey, 'queued', redis.call('XADD', stream, '*', 'id', id))
    redis.call('HDEL', jobkey, 'k')
    handed = handed + 1
    push('paused', 0, 0, 'queue paused')
  else
    local attempts = tonumber(r[3]) or 0
    local max_attempts = tonumber(r[4]) or 0  -- 0: the handler's setting decides
    local deadline = tonumber(r[5]) or 0
    if deadline > 0 and now > deadline then
      ack_del(stream, group, entry)
      bury(jobkey, dead, events, id, 'deadline passed', '', 'DeadlineExceeded', now,
        dead_ttl, dead_maxlen, events_maxlen, true)
      failed = failed + 1
      push('dead', 0, attempts, 'deadline passed')
    elseif max_attempts > 0 and attempts >= max_attempts then
      ack_del(stream, group, entry)
      bury(jobkey, dead, events, id, 'attempts exhausted (lease lapsed)', '',
        'LeaseExpired', now, dead_ttl, dead_maxlen, events_maxlen, true)
      failed = failed + 1
      push('dead', 0, attempts, 'attempts exhausted (lease lapsed)')
    else
      attempts = attempts + 1
      redis.call('HSET', jobkey, 's', 'a', 'n', attempts, 'k', token, 'o', consumer, 'a', now)
      if state == 'active' then
        reclaimed = reclaimed + 1
        emit(events, events_maxlen, id, 'reclaimed', now, consumer)
      end
      started = started + 1
      fresh[#fresh + 1] = entry
      emit(events, events_maxlen, id, 'started', now, attempts)
      push('run', token, attempts, job_data(r), deadline, now - (entry_ms(r[2]) or now),
        now - (tonumber(r[7]) or now))
    end
  end
end
if #fresh > 0 then
  fresh[#fresh + 1] = 'JUSTID'  -- idle time back to 0; JUSTID keeps the delivery count
  redis.call('XCLAIM', stream, group, consumer, 0, unpack(fresh))
end
local m = tonumber(ARGV[7 + 3 * n])
for j = 1, m do
  local b = 8 + 3 * n + 2 * (j - 1)
  local owner = redis.call('XPENDING', stream, group, ARGV[b], ARGV[b], 1)
  if owner[1] ~= nil and owner[1][2] == consumer then  -- (a repeated call finds it gone)
    ack_del(stream, group, ARGV[b])
    redis.call('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', 'job', '', 'reason',
      'malformed stream entry', 'etype', 'MalformedEntry', 'type', '', 't', now,
      'entry', ARGV[b], 'raw', ARGV[b + 1])
    failed = failed + 1
  end
end
count(stats, 'started', started)
count(stats, 'reclaimed', reclaimed)
count(stats, 'failed', failed)
count(stats, 'released', handed)
count(stats, 'cancelled', cancelled)
return out
