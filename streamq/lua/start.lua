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
-- attempt and writes nothing new; so is, when ARGV[6] names the caller's token prefix (its
-- own pending entries read again after a claim.lua reply was lost), a job 'active' under
-- another token of that prefix owned by the caller (_lib.lua's start_entry). A layout-1 record
-- (an older release's) is started in layout 1, which old workers read (_lib.lua's rec_t and
-- v1_restore).
-- KEYS[1]   ready stream
-- KEYS[2]   dead STREAM
-- KEYS[3]   stats HASH
-- KEYS[4]   events STREAM
-- KEYS[5]   pause flag (STRING; exists while the queue is paused)
-- KEYS[5+i] job record HASH of entry i (i = 1..N)
-- KEYS[6+N .. 16+N] the group keys (Keys.group_keys; absent: group limits not applied)
-- KEYS[17+N] (optional) rate limiter STRING: with it, each start must conform to the
--           queue-wide rate limit (_lib.lua's rate_take) or is handed back, no attempt
--           counted (code 'limited', the reason: ms until a start conforms)
-- ARGV[1]   consumer group
-- ARGV[2]   consumer name
-- ARGV[3]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[4]   dead-letter retention in seconds
-- ARGV[5]   dead stream max length
-- ARGV[6]   the caller's token prefix when these are its own pending entries read again
--           ('' = none: a token of this call only is the same start seen again)
-- ARGV[7]   N, the number of entries with a job id
-- ARGV[8 + 3*(i-1) ..] per entry i: stream entry id, job id, lease token for this start
-- ARGV[8 + 3*N]        M, the number of malformed entries (no usable job id)
-- ARGV[9 + 3*N + 2*(j-1) ..] per malformed entry j: stream entry id, description
-- ARGV[9 + 3*N + 2*M] group defaults (QueueConfig.group_arg), with the group keys
-- ARGV[10 + 3*N + 2*M], ARGV[11 + 3*N + 2*M] (with KEYS[17+N]) the rate limit's emission
--           interval and tolerance in µs
-- A grouped job (record 'g') starts only through its group's gate (_lib.lua's start_entry and
-- g_gate: pause, limit, rate); one refused goes back to the head of its group's wait list,
-- its slot freed, no attempt counted ('skip'). Any other end of a grouped job frees its slot.
-- Returns a flat array, 7 per job entry: code ('run' | 'skip' | 'dead' | 'paused' |
--           'limited'), token, attempt, the job's data (_lib.lua's job_data; run) or the
--           reason (skip, dead; limited: ms to wait), deadline ms
--           (0 = none), ms since the job (re)entered the stream, ms since it was created.
local c = {stream = KEYS[1], dead = KEYS[2], stats = KEYS[3], events = KEYS[4],
  group = ARGV[1], consumer = ARGV[2], events_maxlen = ARGV[3], dead_ttl = ARGV[4],
  dead_maxlen = ARGV[5], resume = ARGV[6], now = now_ms(),
  paused = rcall('EXISTS', KEYS[5]) == 1,
  started = 0, reclaimed = 0, failed = 0, handed = 0, cancelled = 0, fresh = {}}
local n = tonumber(ARGV[7])
c.G = gctx(KEYS, 6 + n, ARGV[9 + 3 * n + 2 * tonumber(ARGV[8 + 3 * n])])
local out = {}
if KEYS[17 + n] then
  local m0 = tonumber(ARGV[8 + 3 * n])
  c.rate = {key = KEYS[17 + n], interval = tonumber(ARGV[10 + 3 * n + 2 * m0]),
            tolerance = tonumber(ARGV[11 + 3 * n + 2 * m0])}
end
for i = 1, n do
  local b = 8 + 3 * (i - 1)
  local code, token, attempt, data, deadline, wait, age = start_entry(c, KEYS[5 + i], ARGV[b],
    ARGV[b + 1], ARGV[b + 2], false)
  out[#out + 1] = code; out[#out + 1] = token; out[#out + 1] = attempt
  out[#out + 1] = data; out[#out + 1] = deadline; out[#out + 1] = wait; out[#out + 1] = age
end
local fresh = c.fresh
if #fresh > 0 then
  fresh[#fresh + 1] = 'JUSTID'  -- idle time back to 0; JUSTID keeps the delivery count
  rcall('XCLAIM', c.stream, c.group, c.consumer, 0, unpack(fresh))
end
local m = tonumber(ARGV[8 + 3 * n])
for j = 1, m do
  local b = 9 + 3 * n + 2 * (j - 1)
  local owner = rcall('XPENDING', c.stream, c.group, ARGV[b], ARGV[b], 1)
  if owner[1] ~= nil and owner[1][2] == c.consumer then  -- (a repeated call finds it gone)
    ack_del(c.stream, c.group, ARGV[b])
    rcall('XADD', c.dead, 'MAXLEN', '~', c.dead_maxlen, '*', 'job', '', 'reason',
      'malformed stream entry', 'etype', 'MalformedEntry', 'type', '', 't', c.now,
      'entry', ARGV[b], 'raw', ARGV[b + 1])
    c.failed = c.failed + 1
  end
end
if c.rate then rate_save(c.rate) end
count_starts(c)
if V1_KEPT then lib_cold().v1_restore() end  -- (layout-1 records read: back in layout 1)
return out
