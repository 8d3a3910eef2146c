-- finish.lua: settle a batch of finished attempts (complete, retry or dead-letter), fenced.
-- An outcome is applied only while the job is 'active' under the caller's lease token; a stale
-- token yields 'lost' (counted, nothing written). Safe to repeat: re-running the same call (a
-- client retry after a lost reply) answers with the outcome already applied and writes nothing
-- more, even when the job has moved on since (a retry promoted or started again, a dead letter
-- re-driven): a retry or dead outcome leaves 'ft' = '<state>:<token>' in the record for that.
-- A lapsed-lease dead letter (error type LeaseExpired) is not added to the errors history.
-- The stream entries of the applied outcomes are acknowledged and deleted after the loop, in
-- one XACK and one trim (_lib.lua's ack_trim_del: XTRIM MINID below the oldest pending entry,
-- XDEL for the ones above it).
-- A layout-1 record (an older release's job, started by today's start.lua or claim.lua)
-- is settled in layout 1, which old workers and producers read (_lib.lua's rec_t and
-- v1_restore); an old worker's lease (its tokens) only ever answers 'lost' here.
-- A fire-and-forget job (result TTL 0) has its record deleted when it completes: the tokens
-- of those a call completed are kept in the caller's finish marker (KEYS[17+N]), and a
-- repeat finds its token there ('completed'); a late finish under any other token (a lease
-- taken over by another worker that completed the job) is not there: 'lost'.
-- KEYS[1]   ready stream
-- KEYS[2]   delayed ZSET
-- KEYS[3]   dead STREAM
-- KEYS[4]   stats HASH
-- KEYS[5]   events STREAM
-- KEYS[5+i] job record HASH of attempt i (i = 1..N)
-- ARGV[1]   consumer group
-- ARGV[2]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[3]   dead-letter retention in seconds
-- ARGV[4]   dead stream max length
-- ARGV[5]   wake channel ('' = none)
-- KEYS[6+N .. 16+N] the group keys (Keys.group_keys; absent: no group slot is freed)
-- ARGV[6]   N, the number of attempts
-- ARGV[7 + 7*(i-1) ..] per attempt i: job id, stream entry id, lease token,
--           outcome ('ok' | 'retry' | 'dead' | 'later' | 'children' | 'cancel'), data
--           (result for ok,
--           '' = None, which is not stored; error JSON otherwise),
--           delay ms (retry, later) or reason (dead, cancel), error type ('' for ok)
--           'later': a handler's RateLimited: back in the delayed set after the delay, the
--           attempt not counted (_lib.lua's put_back_later); 'later_group': the same, and the
--           job's group is held back as long (_lib.lua's g_hold). 'children': a handler's
--           WaitForChildren (_flow.lua's park: waiting while a child it adopted is pending,
--           else ready again; the attempt not counted); a job that never took children is
--           dead-lettered ('WaitForChildren without children'). 'cancel': the worker stopped the
--           handler for a requested cancel. Once a cancel was requested ('cx' in the record,
--           cancel.lua) every outcome but 'ok' ends the job 'cancelled' (never retried, never
--           dead-lettered); 'ok' wins when it arrives (the job finished first).
-- ARGV[6] = -N, the compact form (_worker/settle.py, when every attempt of the call has the
--           same outcome, delay ms or reason, and error type: each is sent once, not per job):
--           ARGV[7], ARGV[8], ARGV[9] that outcome, delay or reason, error type;
--           ARGV[10] P, the length in bytes of the job record key prefix (Keys.job('')):
--           attempt i's job id is KEYS[5+i] after its first P bytes (not sent again);
--           ARGV[11] D: '1' = each attempt sends its data, '0' = every attempt's data is ''
--           (not sent: a batch of handlers that returned None); then
--           ARGV[12 + (2+D)*(i-1) ..] per attempt i: stream entry id, lease token, and its
--           data when D is '1'.
--           Below, '7 + 7*N' (the first argument after the attempts) is then 12 + (2+D)*N.
-- ARGV[7 + 7*N] group defaults (QueueConfig.group_arg), with the group keys
-- KEYS[17+N] (optional, after the group keys) the caller's finish marker HASH
--           (Keys.finished): field 't' = the lease tokens (space-separated) of the
--           fire-and-forget jobs the caller's last call on this stream completed, recognised
--           or deleted. A worker sends one finish call at a time per stream and repeats a call
--           before it sends the next, so the last call's tokens are all a repeat needs. It is
--           written only by a call that deletes a record, and expires an hour later.
-- KEYS[18+N] (optional, after the finish marker) the recent completions LIST (Keys.recent):
--           '<finish ms> <job id>' of up to 10 of the jobs this call completed (the last ones),
--           newest first, trimmed to ARGV[8 + 7*N] entries: one LPUSH and one LTRIM per call
--           that completed a job, none per job (absent: an older worker; nothing is written)
-- ARGV[8 + 7*N] (with KEYS[18+N]) how many entries the recent completions list keeps
-- ARGV[9 + 7*N .. 12 + 7*N] (optional, after ARGV[8 + 7*N]) the caller as a hand-off target
--           (docs/workflows.md#hand-off): its consumer name, the job record key prefix
--           (Keys.job('')), its lease-token prefix and how many jobs it takes (0 = none). A
--           job with dependencies that this call releases into KEYS[1] (default level, no
--           group, the queue not paused) is delivered to the caller and started here, as
--           start.lua starts one (_flow.lua's hand: token '<prefix>h<entry>', attempt counted),
--           up to that many; more go to idle workers' tickets (hand_off) or wait in the
--           stream. A repeat releases nothing again (the outcome is applied already), so it
--           hands nothing: the caller finds a job handed to a lost reply among its own pending
--           entries (start.lua with its token prefix answers the same start).
-- An applied outcome of a grouped job (record 'g') frees its slot and admits its group's next
-- waiting job(s) (_lib.lua's g_release; a repeat frees nothing more).
-- A job with a dedup key (record 'dk') frees it when its outcome ends the key's window
-- (_lib.lua's dedup_end: completed here, dead-lettered in bury, cancelled in end_cancelled).
-- A job with parents ('pk') or dependencies ('wk') resolves them in its terminal transition
-- (_flow.lua's settled: inline in this slot, through the outbox for another one).
-- Returns per attempt: the state now held ('completed' | 'retrying' | 'failed' |
--           'cancelled') or 'lost'; then, with ARGV[9 + 7*N ..], 10 values per job handed to
--           the caller: stream entry id, job id, code ('run', or 'own': read your own pending
--           entries), token, attempt, data, deadline ms, ms in the stream, age ms (start.lua's),
--           and its dependency results (field, value, ... as HGETALL gives them; 0: more than
--           _flow.lua's DEPS_INLINE, read them).
local stream, delayed, dead, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local group, events_maxlen, dead_ttl, dead_maxlen, wake =
  ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local n = tonumber(ARGV[6])
local A0, S = 7, 7  -- the first attempt's first argument, arguments per attempt
local c_out, c_extra, c_etype = nil, nil, nil  -- the compact form's shared values
local c_p = 0  -- (and its key prefix's length: a job id is its key's rest)
if n < 0 then
  n, A0, S = -n, 12, ARGV[11] == '0' and 2 or 3
  c_out, c_extra, c_etype, c_p = ARGV[7], ARGV[8], ARGV[9], tonumber(ARGV[10]) + 1
end
local T = A0 + S * n  -- the first argument after the attempts ('7 + 7*N' in the header)
local now = now_ms()
DD_DELAYED, DD_WAKE = delayed, wake  -- (a keep_last job's end makes its follow-up due)
local out = {}
local completed, retried, failed, lost, cancelled, limited = 0, 0, 0, 0, 0, 0
local settled = {}  -- acknowledged and deleted with one XACK and one XDEL after the loop
local G, G_made = nil, false  -- the group context, made when a grouped job needs it
-- what every attempt needs; the rest ('ft', attempts) only on the paths that use it (the
-- name lists of rec_t, made when first needed)
local NAMES, TRIES = nil, nil
local TTL = {}  -- tonumber of each 'x' value met
local now_s, ev_completed = nstr(now), emit_on(events_maxlen, 'completed')
local mark = KEYS[17 + n]
local ff, ff_new = nil, false  -- tokens for the marker; whether this call deleted a record
local recent = KEYS[18 + n]
local done_ids = recent and {} or nil  -- ids this call completed (for the recent list)
local MARKED = nil  -- ' <token> <token> ... ': the marker, read when a record is missing
if ARGV[T + 5] then FLOW_AT = T + 2 end  -- the caller takes jobs this call
-- releases (_flow.lua's flow_to)
-- Whether the caller's last call completed this token's fire-and-forget job (deleted its
-- record): a repeat of that call. The token is kept for the marker this call may write.
local function marked(token)
  if not mark then return false end
  if not MARKED then
    local v = rpcall('HGET', mark, 't')
    if type(v) ~= 'string' then v = '' end  -- (none, or not a hash: nothing is marked)
    MARKED = ' ' .. v .. ' '
  end
  if not sfind(MARKED, ' ' .. token .. ' ', 1, true) then return false end
  ff = ff or {}
  ff[#ff + 1] = token
  return true
end
for i = 1, n do
  local b = A0 + S * (i - 1)
  local jobkey = KEYS[5 + i]
  local id, entry, token, outcome, data, extra, etype
  if c_out then
    id, entry, token = ssub(jobkey, c_p), ARGV[b], ARGV[b + 1]
    outcome, data, extra, etype = c_out, S == 3 and ARGV[b + 2] or '', c_extra, c_etype
  else
    id, entry, token = ARGV[b], ARGV[b + 1], ARGV[b + 2]
    outcome, data, extra, etype = ARGV[b + 3], ARGV[b + 4], ARGV[b + 5], ARGV[b + 6]
  end
  -- rec_t(jobkey, false, NAMES) inlined for a layout-2 record (literal names, no unpack).
  -- 'z' (start_entry's flag, docs/key-layout.md): none of the six rare fields is there, and
  -- 'z' holds 'x' ('' = absent), so they are not read; without it (a record started by an
  -- older release, or one that has any of them) 'x' and the six are read as before
  local r = rpcall('HMGET', jobkey, 's', 'k', 'z')
  local z = r[3]
  if z and z ~= '0' and outcome == 'ok' and r[1] == 'a' and r[2] == token then
    -- the common completion, as the 'ok' branch below applies it to a record with 'z'
    -- (active under this token, none of the rare fields; fire-and-forget '0' goes below)
    if entry ~= '' then settled[#settled + 1] = entry end
    if data ~= '' then
      rcall('HSET', jobkey, 's', 'c', 'r', data, 'f', now_s)
    else  -- a None result is not stored
      rcall('HSET', jobkey, 's', 'c', 'f', now_s)
    end
    if z == '' then z = DEFAULT_TTL end
    local ttl = TTL[z]
    if not ttl then ttl = tonumber(z) or 0; TTL[z] = ttl end
    if ttl > 0 then rcall('EXPIRE', jobkey, nstr(ttl)) end
    completed = completed + 1
    if done_ids then done_ids[#done_ids + 1] = id end
    if ev_completed then emit(events, events_maxlen, id, 'completed', now, '') end
    out[i] = 'completed'
  else
    if not r.err then
      local v = r[1]
      if v then
        r[1] = state_of(v)
        local z = r[3]
        if z then
          if z == '' then r[3] = DEFAULT_TTL end
        else
          local q = rcall('HMGET', jobkey, 'x', 'notify', 'cx', 'g', 'dk', 'pk', 'wk')
          r[3], r[4], r[5], r[6], r[7], r[8], r[9] = q[1] or DEFAULT_TTL, q[2], q[3], q[4], q[5],
            q[6], q[7]
        end
      else  -- layout 1, or no record
        NAMES = NAMES or {'s', 'k', 'x', 'notify', 'cx', 'g', 'dk', 'pk', 'wk'}
        r = lib_cold().rec_t(jobkey, false, NAMES)
      end
    end
    local state, cur = r[1], r[2]
    if not r.err and not state and marked(token) then
      out[i] = 'completed'  -- deleted by this very call's earlier run (fire-and-forget)
    elseif r.err or not state then  -- (a corrupted record is settled by a reclaim)
      lost = lost + 1
      emit(events, events_maxlen, id, 'lease_lost', now, token)
      out[i] = 'lost'
    elseif cur == token and state ~= 'active' then
      -- applied by an earlier run of this same call (every other path that ends a lease
      -- changes the token); a retry may have been promoted or cancelled since
      if state == 'completed' or state == 'failed' then out[i] = state else out[i] = 'retrying' end
      if rcall('HGET', jobkey, 'ft') == 'cancelled:' .. token then out[i] = 'cancelled' end
    elseif cur ~= token then
      local ft = rcall('HGET', jobkey, 'ft')
      if ft == 'retrying:' .. token then
        out[i] = 'retrying'
      elseif ft == 'failed:' .. token then
        out[i] = 'failed'
      elseif marked(token) then  -- deleted by an earlier run, and its id enqueued again since
        out[i] = 'completed'
      else
        lost = lost + 1
        emit(events, events_maxlen, id, 'lease_lost', now, token)
        out[i] = 'lost'
      end
    else
      if entry ~= '' then settled[#settled + 1] = entry end
      local C = outcome ~= 'ok' and lib_cold()  -- (the helpers of every other outcome)
      if outcome ~= 'ok' and (outcome == 'cancel' or r[5]) then
        C.end_cancelled(jobkey, events, events_maxlen, id, now, 'running')
        rcall('HSET', jobkey, 'ft', 'cancelled:' .. token)
        cancelled = cancelled + 1
        out[i] = 'cancelled'
      elseif outcome == 'children' and r[9] then  -- WaitForChildren (_flow.lua's park)
        out[i] = lib_flow().park(jobkey, id, now, r[9])
        rcall('HSET', jobkey, 'ft', out[i] .. ':' .. token)
        if out[i] == 'failed' then failed = failed + 1 end
      elseif outcome == 'children' then  -- WaitForChildren with no child ever added
        C.bury(jobkey, dead, events, id, 'WaitForChildren without children', data,
          'WaitForChildren', now, dead_ttl, dead_maxlen, events_maxlen, false)
        rcall('HSET', jobkey, 'ft', 'failed:' .. token)
        failed = failed + 1
        out[i] = 'failed'
      elseif outcome == 'later' or outcome == 'later_group' then
        C.put_back_later(jobkey, delayed, wake, id, now + tonumber(extra), data, token)
        if outcome == 'later_group' and r[6] then
          if not G_made then G, G_made = lib_groups().gctx(KEYS, 6 + n, ARGV[T]), true end
          if G then C.g_hold(G, r[6], now + tonumber(extra)) end
        end
        limited = limited + 1
        emit(events, events_maxlen, id, 'rate_limited', now, extra)
        out[i] = 'retrying'
      elseif outcome == 'ok' then
        if r[7] then lib_cold().dedup_end(r[7], jobkey, id, false, now) end  -- (docs/dedup.md)
        if data ~= '' then
          rcall('HSET', jobkey, 's', 'c', 'r', data, 'f', now_s)
        else  -- a None result is not stored
          rcall('HSET', jobkey, 's', 'c', 'f', now_s)
        end
        local x = r[3]
        local ttl = TTL[x]
        if not ttl then ttl = tonumber(x) or 0; TTL[x] = ttl end
        if x == '0' then  -- fire-and-forget: nothing is kept once the job completed
          rcall('DEL', jobkey)
          if mark then
            ff = ff or {}
            ff[#ff + 1] = token
            ff_new = true
          end
        elseif ttl > 0 then
          rcall('EXPIRE', jobkey, nstr(ttl))
        end
        completed = completed + 1
        if done_ids then done_ids[#done_ids + 1] = id end
        if ev_completed then emit(events, events_maxlen, id, 'completed', now, '') end
        if r[4] then notify(r[4], 'completed', id, data) end
        if r[8] or r[9] then lib_flow().settled(jobkey, id, 'c' .. data, r[8], r[9], now) end
        out[i] = 'completed'
      else
        TRIES = TRIES or {'s', 'n', 'max_attempts'}
        local a = C.rec_t(jobkey, false, TRIES)
        local max_attempts = tonumber(a[3]) or 0
        if outcome == 'retry' and (max_attempts == 0 or (tonumber(a[2]) or 0) < max_attempts) then
          local due = now + tonumber(extra)
          C.wake_if_sooner(delayed, wake, due)
          rcall('ZADD', delayed, due, id)
          rcall('HSET', jobkey, 's', 'r', 'due', due, 'error', data, 'ft', 'retrying:' .. token)
          C.remember_error(jobkey, a[2], etype, now)
          retried = retried + 1
          emit(events, events_maxlen, id, 'retrying', now, etype)
          out[i] = 'retrying'
        else
          local reason = extra
          if outcome == 'retry' then reason = 'attempts exhausted' end
          if etype ~= 'LeaseExpired' then C.remember_error(jobkey, a[2], etype, now) end
          C.bury(jobkey, dead, events, id, reason, data, etype, now, dead_ttl, dead_maxlen,
            events_maxlen, false)
          rcall('HSET', jobkey, 'ft', 'failed:' .. token)
          failed = failed + 1
          out[i] = 'failed'
        end
      end
      if r[6] then
        if not G_made then G, G_made = lib_groups().gctx(KEYS, 6 + n, ARGV[T]), true end
        if G then lib_groups().g_release(G, r[6], id, stream, now) end
      end
    end
  end
end
if #settled > 0 then
  ack_trim_del(stream, group, settled, rcall('XACK', stream, group, unpack(settled)))
end
if ff_new then  -- (errors ignored: the outcomes are written; a repeat would answer 'lost')
  rpcall('HSET', mark, 't', table.concat(ff, ' '))
  rpcall('EXPIRE', mark, 3600)
end
if done_ids and #done_ids > 0 then  -- (a repeated call completes nothing new: no entry)
  local pushed, at = {}, string.format('%.0f', now)
  for j = math.max(1, #done_ids - 9), #done_ids do
    pushed[#pushed + 1] = at .. ' ' .. done_ids[j]
  end
  -- (errors ignored: the outcomes are written, and an ACL rule of an earlier release without
  -- +lpush/+ltrim must not turn every completion into an error that a repeat answers 'lost')
  rpcall('LPUSH', recent, unpack(pushed))
  rpcall('LTRIM', recent, 0, (tonumber(ARGV[T + 1]) or 100) - 1)
end
count(stats, 'completed', completed)
count(stats, 'retried', retried)
count(stats, 'retrying_now', retried + limited)
count(stats, 'rate_limited', limited)
count(stats, 'cancelled', cancelled)
count(stats, 'failed', failed)
count(stats, 'lease_lost', lost)
if FLOW_TO then
  for _, v in ipairs(FLOW_TO.rows) do out[#out + 1] = v end
end
if V1_KEPT then lib_cold().v1_restore() end  -- (layout-1 records read: back in layout 1)
return out
