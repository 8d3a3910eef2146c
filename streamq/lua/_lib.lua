-- _lib.lua: shared helpers, prepended by the script registry to every other script.
-- It defines functions only; it reads no KEYS and no ARGV of its own.
-- Conventions used by all scripts: times are milliseconds from the server's TIME;
-- an events/dead max length of 0 disables that stream; every key arrives in KEYS.

-- The globals the hot paths call, as locals: each use of a global is a lookup in the globals
-- table (and redis.call two), an upvalue is read directly (~1% of redis-server's instructions
-- in a drain, callgrind). Names of their own, so a script reads which one it calls.
local rcall, rpcall, tonumber, sfind, ssub, sbyte =
  redis.call, redis.pcall, tonumber, string.find, string.sub, string.byte

local function now_ms()
  local t = rcall('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A number as redis.call sends it ('%.17g'), formatted once per value and script call: up to
-- Redis 7.2 redis.call formats each number argument with snprintf (or, in 7.2.0-7.2.4, in
-- the shortest form, 1e9 for 1000000000); Valkey 8 and Redis 7.4 write an integer with an
-- integer conversion, cheaper than any formatting here: the number goes as it is.
local VK_NUM = redis.VALKEY_VERSION_NUM
local NUM_RAW = (VK_NUM and VK_NUM >= 0x080000)
  or (not VK_NUM and (redis.REDIS_VERSION_NUM or 0) >= 0x070400)
local NUM_STR = {}
local function nstr(x)
  if NUM_RAW and x % 1 == 0 then return x end
  local s = NUM_STR[x]
  if not s then s = string.format('%.17g', x); NUM_STR[x] = s end
  return s
end

-- Lifecycle event. The entry id carries the server time (ms); every entry has the same
-- three fields, so the stream stores field names once per node. spec is the caller's events
-- argument: '0' (no events), '<maxlen>' (every kind) or '<maxlen>:,<kind>,<kind>,' (only the
-- kinds listed: QueueConfig.event_kinds). Whether a kind is on is one plain search for
-- ',<kind>,' in spec (the max length has no comma), asked once per kind and script call: no
-- table of every listed kind is built (a pattern loop over ~13 kinds per script call).
local ev_spec, ev_maxlen, ev_on = nil, '0', nil
local function ev_parse(spec)  -- once per script call
  ev_spec, ev_on = spec, {}
  local c = sfind(spec, ':', 1, true)
  if c then ev_maxlen = ssub(spec, 1, c - 1) else ev_maxlen = spec end
end

-- Whether emit writes events of kind ev under spec (a hot loop asks once, not per job).
local function emit_on(spec, ev)
  if spec ~= ev_spec then ev_parse(spec) end
  local on = ev_on[ev]
  if on == nil then
    on = ev_maxlen ~= '0' and (ev_maxlen == spec
      or sfind(spec, ',' .. ev .. ',', 1, true) ~= nil)
    ev_on[ev] = on
  end
  return on
end

local function emit(events, spec, job_id, ev, now, detail)
  if not emit_on(spec, ev) then return end
  rcall('XADD', events, 'MAXLEN', '~', ev_maxlen, '*', 'job', job_id, 'ev', ev,
    'd', detail or '')
end

-- The job record (layout 2; docs/key-layout.md). Short field names, the state as one letter,
-- the stream entry id as one integer, and no defaults or copies, so that a typical record
-- stays a listpack (every value <= 64 bytes) of about 50 bytes:
--   s state letter, b body ('<type> <serialised payload>'), op options (serialised, only
--   when not default), e stream entry (ENC_ENTRY), c created (only when it differs from e's
--   time), n attempts, k lease token, o owner, a started, f finished, r result (absent:
--   None), x result TTL s (absent: 86400); rare fields keep their layout-1 names.
-- A layout-1 record (state, type, env, entry, ...; written by releases before it) keeps layout
-- 1 for life: old workers and old producers may run beside today's code (a rolling upgrade)
-- and read only that. A script call that reads one through rec_t works on it in layout 2
-- (upgrade_v1) and writes it back in layout 1 before it returns (v1_restore, below).
-- The state letters are told by comparisons, not tables: a table constructor with string
-- keys runs on every script call (~3k redis-server instructions each), a lookup a few times.
local function state_of(v)  -- state letter -> name ('?<v>': not a state letter)
  if v == 'a' then return 'active' elseif v == 'q' then return 'queued'
  elseif v == 'c' then return 'completed' elseif v == 's' then return 'scheduled'
  elseif v == 'r' then return 'retrying' elseif v == 'f' then return 'failed'
  elseif v == 'x' then return 'cancelled' elseif v == 'w' then return 'waiting' end
  return '?' .. v
end
local DEFAULT_TTL = '86400'

-- Stream entry id '<ms>-<seq>' as it is stored in 'e': '<ms><seq, 3 digits>' (an integer,
-- which a listpack keeps in 9 bytes) when seq < 1000, else the id as it is.
local function enc_entry(id)
  local ms, seq = string.match(id, '^(%d+)%-(%d+)$')
  if ms and #seq <= 3 then return ms .. string.rep('0', 3 - #seq) .. seq end
  return id
end

local function dec_entry(v)
  if not v or #v < 4 or not string.match(v, '^%d+$') then return v end  -- (or damaged)
  return ssub(v, 1, -4) .. '-' .. tonumber(ssub(v, -3))
end

-- The ms part of a stored entry ('e', either form), as a number.
local function entry_ms(v)
  if not v or v == '' then return nil end
  local ms = string.match(v, '^(%d+)%-')
  if ms then return tonumber(ms) end
  return tonumber(ssub(v, 1, -4))
end

local function count(stats, field, n)
  if n ~= 0 then rcall('HINCRBY', stats, field, n) end
end

local function ack_del(stream, group, entry)
  if entry and entry ~= '' then
    rcall('XACK', stream, group, entry)
    rcall('XDEL', stream, entry)
  end
end

-- Delete acknowledged entries of the stream (ids as Redis writes them, '<ms>-<seq>'), the
-- oldest ones by trimming. Every entry delivered to the group is in its pending list until
-- it is acknowledged and deleted in the same script, and XREADGROUP delivers in id order, so
-- no entry below the oldest pending one is live: XTRIM MINID to it deletes exactly the
-- acknowledged ids below it (nothing else is left there), walking each stream node once per
-- call where XDEL walks the node from its start for each id (Redis 7.0 t_stream.c's
-- streamDeleteItem: the cost of a batch grows with the square of the node size). The ids
-- above the oldest pending one (an older job still running) are deleted one by one.
-- XTRIM's count is the number of ids below the oldest pending one (only they were left
-- there): all of them, and no id is compared. With nothing pending and every id of the call
-- acknowledged by it (acked: XACK's count, so each was pending, hence delivered), every entry
-- up to the newest id was delivered and is acknowledged: trimmed below the id after it
-- (entries not yet delivered are newer). A caller whose ACL rule does not allow XTRIM (the
-- per-tenant rule of releases before it: docs/security.md) gets every id deleted by XDEL.
local function id_num(e)  -- '<ms>-<seq>' as two numbers (nil: another form)
  local j = sfind(e, '-', 1, true)
  local ms = j and tonumber(ssub(e, 1, j - 1))
  return ms, ms and tonumber(ssub(e, j + 1))
end

local function ack_trim_del(stream, group, ids, acked)
  local first = rcall('XPENDING', stream, group, '-', '+', 1)[1]
  if not first then
    local tms, tseq = nil, nil
    if #ids > 1 and acked == #ids then
      for i = 1, #ids do
        local ms, seq = id_num(ids[i])
        if not seq or ms >= 1e15 or seq >= 1e15 then tms = nil; break end
        if not tms or ms > tms or (ms == tms and seq > tseq) then tms, tseq = ms, seq end
      end
    end
    if not tms or type(rpcall('XTRIM', stream, 'MINID',
        string.format('%.0f-%.0f', tms, tseq + 1))) == 'table' then
      rcall('XDEL', stream, unpack(ids))
    end
    return
  end
  local p = first[1]
  local trimmed = rpcall('XTRIM', stream, 'MINID', p)
  if type(trimmed) == 'table' then  -- (an error: not allowed)
    rcall('XDEL', stream, unpack(ids))
    return
  end
  if trimmed == #ids then return end
  local pms, pseq = id_num(p)
  local above, k = nil, 0
  for i = 1, #ids do
    local e = ids[i]
    local ms, seq = id_num(e)
    if not seq or ms > pms or (ms == pms and seq > pseq) then
      above = above or {}
      k = k + 1
      above[k] = e
    end
  end
  if above then rcall('XDEL', stream, unpack(above)) end
end

-- Tell a waiter (the job's 'notify' channel, if any): '<state> <job id>', so one channel can
-- serve every waiter of a producer (job ids have no spaces). A completed job's result rides
-- along as '<state> <job id> =<result>' ('=' alone: None) when it is at most INLINE_MAX bytes
-- and the channel is a waiter channel whose tag starts with 'r' (a producer that reads it;
-- older producers' tags are plain hex and get the short form): the waiter then needs no read
-- of the record, one round trip less on enqueue_and_wait.
local INLINE_MAX = 1024
local function notify(channel, state, job_id, result)
  if channel and channel ~= '' then
    if result and #result <= INLINE_MAX and sfind(channel, ':wait:r', 1, true) then
      rcall('PUBLISH', channel, state .. ' ' .. job_id .. ' =' .. result)
    else
      rcall('PUBLISH', channel, state .. ' ' .. job_id)
    end
  end
end

-- Group functions (gctx, g_*: docs/fairness.md#groups) are made by lib_groups(), and the
-- queue-wide rate limiter (now_us, rate_*: docs/fairness.md#queue-wide-rate-limit) by
-- lib_rate(), in _groups.lua and _rate.lua, which the script registry appends right after
-- this file; declared here so that accept and start_entry below can call them. The workflow
-- functions (lib_flow: docs/workflows.md) come from _flow.lua, after them.
local lib_groups, lib_rate, lib_flow

-- Helpers of rarer paths (layout-1 records, duplicates, delays, priorities, retries, dead
-- letters, cancels, hand-backs), made by lib_cold() when a script call first needs one and
-- returned in a table (the same one for the rest of the call). Every function a script
-- defines is a closure made on each call, and each local it names an upvalue to find and
-- later collect (~600+ redis-server instructions per function): most calls of enqueue.lua
-- and finish.lua need none of these. A hot function here calls lib_cold().<name>(...) on the
-- paths that need one; the script registry gives every other script that names one a local
-- of that name first (scripts.py cold_first).
local COLD = nil
-- The delayed ZSET and wake channel of a script that has them (finish.lua sets them): with
-- them, the end of a keep_last job makes its held follow-up due (dedup_end); without (start.lua
-- and claim.lua bury a job whose lease lapsed too often), the follow-up waits for its TTL.
local DD_DELAYED, DD_WAKE = nil, ''
-- The layout-1 records this script call turned into layout 2 (rec_t), in the order met, each
-- with its stream entry as it was then ('' for none): v1_restore writes them back.
local V1_KEPT = nil
local function lib_cold()
  if COLD then return COLD end
  local function state_code(name)  -- state name -> letter (nil: not a state name)
    if name == 'active' then return 'a' elseif name == 'queued' then return 'q'
    elseif name == 'completed' then return 'c' elseif name == 'scheduled' then return 's'
    elseif name == 'retrying' then return 'r' elseif name == 'failed' then return 'f'
    elseif name == 'cancelled' then return 'x' elseif name == 'waiting' then return 'w' end
    return nil
  end

  local V1_NAME = nil  -- layout-2 name -> layout-1 name, made when a layout-1 record is met
  local function v1_names()
    if not V1_NAME then
      V1_NAME = {s = 'state', e = 'entry', c = 'created', n = 'attempts', k = 'token',
                 o = 'owner', a = 'started', f = 'finished', r = 'result', x = 'result_ttl'}
    end
    return V1_NAME
  end

  -- Rewrite a layout-1 record in layout 2 (same key, same TTL), for the rest of a script call
  -- (rec_t; downgrade_v1 writes it back). Safe to repeat: a record that has 's' (or no
  -- 'state') is left alone. 'type', 'env' and 'enqueued' stay as they are (the envelope is the
  -- producer's serde's bytes, which Lua cannot split): readers take them when 'b' is absent.
  local function upgrade_v1(jobkey)
    local h = rcall('HGETALL', jobkey)
    local t = {}
    for i = 1, #h, 2 do t[h[i]] = h[i + 1] end
    if t.s or not t.state then return false end
    local set = {'s', state_code(t.state) or t.state}
    if t.entry and t.entry ~= '' then set[#set + 1] = 'e'; set[#set + 1] = enc_entry(t.entry) end
    for short, long in pairs(v1_names()) do
      if short ~= 's' and short ~= 'e' and t[long] and t[long] ~= ''
          and not (short == 'x' and t[long] == DEFAULT_TTL) then
        set[#set + 1] = short; set[#set + 1] = t[long]
      end
    end
    rcall('HDEL', jobkey, 'state', 'entry', 'created', 'attempts', 'token',
      'owner', 'started', 'finished', 'result', 'result_ttl')
    rcall('HSET', jobkey, unpack(set))
    return true
  end

  -- Write a record upgrade_v1 turned into layout 2 back in layout 1, as the release before it
  -- wrote each state: 'state' by name, 'entry' as Redis writes ids ('' when none), 'created',
  -- 'result_ttl' always; 'enqueued' (the time it entered the stream) when the script gave it
  -- another entry than it had (was: that entry, '' for none). A record deleted since (a
  -- fire-and-forget job completed, a purge) or not in layout 2 is left alone.
  local function downgrade_v1(jobkey, was)
    local h = rcall('HGETALL', jobkey)
    local t = {}
    for i = 1, #h, 2 do t[h[i]] = h[i + 1] end
    if not t.s or t.state then return false end
    local name = state_of(t.s)
    if sbyte(name, 1) == 63 then name = t.s end  -- ('?<v>': kept as it is)
    local entry = t.e and dec_entry(t.e) or ''
    local set = {'state', name, 'entry', entry, 'result_ttl', t.x or DEFAULT_TTL}
    local created = t.c or entry_ms(t.e)
    if created then set[#set + 1] = 'created'; set[#set + 1] = created end
    if entry ~= '' and entry ~= was then
      set[#set + 1] = 'enqueued'; set[#set + 1] = entry_ms(t.e)
    end
    for short, long in pairs(v1_names()) do
      if short ~= 's' and short ~= 'e' and short ~= 'c' and short ~= 'x' and t[short] then
        set[#set + 1] = long; set[#set + 1] = t[short]
      end
    end
    rcall('HDEL', jobkey, 's', 'e', 'c', 'n', 'k', 'o', 'a', 'f', 'r', 'x')
    rcall('HSET', jobkey, unpack(set))
    return true
  end

  -- Write back in layout 1 every layout-1 record this script call read (rec_t). Every script
  -- that reads records through rec, rec_t, start_entry or accept calls it before it returns:
  -- 'v1_restore()', or 'if V1_KEPT then lib_cold().v1_restore() end' in one that makes no
  -- cold helper in its common call (tests/test_upgrade_mixed.py checks that each one does).
  local function v1_restore()
    if not V1_KEPT then return end
    for i = 1, #V1_KEPT, 2 do downgrade_v1(V1_KEPT[i], V1_KEPT[i + 1]) end
    V1_KEPT = nil
  end

  local function names_at(names)  -- name -> its index in names, found once per names table
    if names.at then return names.at end
    local at = {}
    for i = #names, 1, -1 do at[names[i]] = i end
    names.at = at
    return at
  end

  -- HMGET of a job record by layout-2 names, decoded: 's' as the state name, 'e' as the stream
  -- entry id, 'x' with its default, 'c' from 'e' when absent. A layout-1 record is turned into
  -- layout 2 for the rest of the script call (upgrade_v1), so that the script reads and writes
  -- it by layout-2 names like any other, and noted in V1_KEPT: the script calls v1_restore
  -- before it returns, which writes it back in layout 1 (old workers and producers may still
  -- read it: docs/key-layout.md). write: unused (every caller is treated alike), kept for the
  -- callers. Returns the reply table, or the error of a key that is not a hash (its .err set).
  -- rec_t takes the names as a list (a script's constant one).
  local function rec_t(jobkey, write, names)
    local r = rpcall('HMGET', jobkey, unpack(names))
    if r.err then return r end
    if names[1] == 's' and not r[1] then
      local v1 = rcall('HMGET', jobkey, 'state', 'entry')
      if v1[1] and upgrade_v1(jobkey) then
        V1_KEPT = V1_KEPT or {}
        V1_KEPT[#V1_KEPT + 1] = jobkey
        V1_KEPT[#V1_KEPT + 1] = v1[2] or ''
        r = rcall('HMGET', jobkey, unpack(names))
      end
    end
    local at = names_at(names)
    local is, ie, ix, ic = at.s, at.e, at.x, at.c
    local v = is and r[is]
    if v then r[is] = state_of(v) end
    if ix then r[ix] = r[ix] or DEFAULT_TTL end
    local e = ie and r[ie]
    if ic and not r[ic] then r[ic] = entry_ms(e) end
    if ie then r[ie] = dec_entry(e) end
    return r
  end

  local function rec(jobkey, write, ...) return rec_t(jobkey, write, {...}) end

  -- Point a record at a new stream entry (promotion, hand-back, requeue, re-drive), keeping
  -- its creation time: 'c' is written once, from the old entry's time, when it was implied.
  local function set_entry(jobkey, state, new_entry, ...)
    local old = rcall('HMGET', jobkey, 'e', 'c')
    if old[1] and not old[2] then rcall('HSET', jobkey, 'c', entry_ms(old[1])) end
    rcall('HSET', jobkey, 's', state_code(state), 'e', enc_entry(new_entry), ...)
  end

  -- The job type of a record, either layout.
  local function job_type(jobkey)
    local r = rcall('HMGET', jobkey, 'b', 'type')
    if r[1] then return string.match(r[1], '^(%S*)') or '' end
    return r[2] or ''
  end

  -- Wake sleepers (scheduler, promoters) when a job becomes due sooner than anything else.
  local function wake_if_sooner(delayed, channel, due)
    if channel == '' then return end
    local first = rcall('ZRANGE', delayed, 0, 0, 'WITHSCORES')
    if first[2] == nil or tonumber(first[2]) >= due then
      rcall('PUBLISH', channel, due)
    end
  end

  -- Keep a short history of failed attempts in the record ('errors': JSON list, newest last,
  -- at most 10), so an operator sees every attempt's error type without reading the events.
  local function remember_error(jobkey, attempt, etype, now)
    local raw = rcall('HGET', jobkey, 'errors')
    local list = {}
    if raw then
      local ok, decoded = pcall(cjson.decode, raw)
      if ok and type(decoded) == 'table' then list = decoded end
    end
    list[#list + 1] = {attempt = tonumber(attempt) or 0, type = etype, t = now}
    while #list > 10 do table.remove(list, 1) end
    rcall('HSET', jobkey, 'errors', cjson.encode(list))
  end

  -- Dedup (docs/dedup.md; enqueue.lua's dedup section): the job whose record holds dk
  -- ('<mode letter><dedup key name>') started (at_start) or ended: the key is deleted when the
  -- transition ends its mode's window (until_start and debounce: the start, or an end before
  -- any start; until_finish and keep_last: the end; throttle: never, its TTL is the window),
  -- only while it still names this job. A keep_last job's end makes its follow-up ('dn'),
  -- held in the delayed ZSET, due now (LT: never later than it was).
  local function dedup_end(dk, jobkey, id, at_start, now)
    local m = ssub(dk, 1, 1)
    if m == 't' or (at_start and m ~= 's' and m ~= 'd') then return end
    local key = ssub(dk, 2)
    if rpcall('GET', key) == id then rcall('DEL', key) end
    if m == 'k' and not at_start and DD_DELAYED then
      local nx = rcall('HGET', jobkey, 'dn')
      if nx then
        rcall('ZADD', DD_DELAYED, 'XX', 'LT', now, nx)
        if DD_WAKE ~= '' then rcall('PUBLISH', DD_WAKE, now) end
      end
    end
  end

  -- Dead-letter a job: terminal 'failed' state, dead index entry, retention TTL, waiters told.
  -- The caller counts it in the stats HASH ('failed'). clear_token: anyone but the lease holder
  -- settling its own attempt buries the job, so the old lease ends here (a worker still running
  -- it gets 'lost' from finish.lua, never another's outcome). The record is in layout 2.
  local function bury(jobkey, dead, events, job_id, reason, err, etype, now,
                      dead_ttl, dead_maxlen, events_maxlen, clear_token)
    if err and err ~= '' then
      rcall('HSET', jobkey, 's', 'f', 'f', now, 'reason', reason, 'error', err)
    else
      rcall('HSET', jobkey, 's', 'f', 'f', now, 'reason', reason)
    end
    if clear_token then rcall('HDEL', jobkey, 'k') end
    local dk = rcall('HGET', jobkey, 'dk')
    if dk then dedup_end(dk, jobkey, job_id, false, now) end
    local jtype = job_type(jobkey)
    if tonumber(dead_maxlen) > 0 then
      rcall('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', 'job', job_id,
        'reason', reason, 'etype', etype or '', 'type', jtype, 't', now)
    end
    if tonumber(dead_ttl) > 0 and rcall('EXISTS', jobkey) == 1 then
      rcall('EXPIRE', jobkey, dead_ttl)
    end
    emit(events, events_maxlen, job_id, 'failed', now, reason)
    notify(rcall('HGET', jobkey, 'notify'), 'failed', job_id)
    local fl = rcall('HMGET', jobkey, 'pk', 'wk')  -- workflows: parents, dependencies
    if fl[1] or fl[2] then lib_flow().settled(jobkey, job_id, 'f' .. reason, fl[1], fl[2], now) end
  end

  -- Whether an existing record was written by the caller's row, told by writer tags
  -- '<run>:<partition>:<attempt>:<offset>' (Spark: the enqueue_dataframe call, the partition,
  -- the task attempt id, increasing within a run, and the row's offset in the partition).
  -- Another run or partition wrote it: no. The same attempt: only the same offset (a repeated
  -- call), a later row is a repeat of the id. An earlier attempt: yes, once: the record takes
  -- the caller's tag, so the attempt's later rows of that id are repeats (offsets may differ
  -- between attempts when Spark reads shuffled rows in another order). A later attempt (a
  -- speculative copy running alongside): only the same offset.
  local function writer_mine(jobkey, stored, tag)
    if not stored then return 0 end
    local sg, sa, so = string.match(stored, '^(.*):(%d+):(%d+)$')
    local cg, ca, co = string.match(tag, '^(.*):(%d+):(%d+)$')
    if sg == nil or sg ~= cg then return 0 end
    if tonumber(sa) < tonumber(ca) then
      rcall('HSET', jobkey, 'w', tag)
      return 1
    end
    if so == co then return 1 end
    return 0
  end

  -- Priorities (docs/fairness.md#priorities): a record's 'p' is its priority 0..4, absent for
  -- the default (2), whose entries go in the queue's ready stream as before priorities. A
  -- script that routes jobs by priority gets the levels SET at KEYS[at] and the other levels'
  -- streams (priorities 0, 1, 3, 4) at KEYS[at + 1 ..]. The stream of priority prio ('' or
  -- absent: the default's, which the caller passes as default):
  local function level_stream(keys, at, prio, default)
    local p = tonumber(prio)
    if not p or p == 2 or not keys[at] then return default end
    if p < 2 then return keys[at + 1 + p] end
    return keys[at + p]
  end

  -- Note a level as used (workers read the levels SET to know which streams to fetch from).
  local function level_used(keys, at, prio)
    local p = tonumber(prio)
    if p and p ~= 2 and keys[at] then rcall('SADD', keys[at], p) end
  end

  -- End a job 'cancelled' (cancel.lua; finish.lua and start.lua for a running job whose cancel
  -- was requested: 'cx'): terminal state, finish time, its result TTL ('x'; fire-and-forget
  -- records are kept a minute, so a repeated cancel still sees them), the event and waiters
  -- told. The caller counts it ('cancelled' in the stats) and acknowledges its entry.
  local function end_cancelled(jobkey, events, events_maxlen, job_id, now, detail)
    local r = rcall('HMGET', jobkey, 'x', 'notify', 'dk', 'pk', 'wk')
    rcall('HSET', jobkey, 's', 'x', 'f', now)
    if r[3] then dedup_end(r[3], jobkey, job_id, false, now) end
    local ttl = tonumber(r[1] or DEFAULT_TTL) or 0
    if r[1] == '0' then
      rcall('EXPIRE', jobkey, 60)
    elseif ttl > 0 then
      rcall('EXPIRE', jobkey, ttl)
    end
    emit(events, events_maxlen, job_id, 'cancelled', now, detail)
    notify(r[2], 'cancelled', job_id)
    if r[4] or r[5] then lib_flow().settled(jobkey, job_id, 'x', r[4], r[5], now) end
  end

  -- RateLimited(group=True) (finish.lua's 'later_group'): hold group g back until 'untl' ms, as
  -- its rate limiter parks it (nothing of it is admitted or started before; unpark.lua admits
  -- its waiting jobs then). A later hold already there is kept (ZADD GT).
  local function g_hold(G, g, untl)
    rcall('ZADD', G.parked, 'GT', untl, g)
    rcall('ZADD', G.idx, 0, g)
  end

  -- A handler raised RateLimited (finish.lua's 'later' outcome): back to the delayed set until
  -- due, as 'retrying', without counting the attempt (start.lua counted it in 'n': taken back,
  -- so max_attempts is not consumed). Every other field (options, priority, group) is kept.
  -- 'ft' makes a repeated finish call answer 'retrying' (as for a retry).
  local function put_back_later(jobkey, delayed, wake, job_id, due, err, token)
    wake_if_sooner(delayed, wake, due)
    rcall('ZADD', delayed, due, job_id)
    rcall('HSET', jobkey, 's', 'r', 'due', due, 'error', err, 'ft', 'retrying:' .. token)
    if (tonumber(rcall('HGET', jobkey, 'n')) or 0) > 0 then
      rcall('HINCRBY', jobkey, 'n', -1)
    end
  end

  local START_F = {'s', 'e', 'n', 'max_attempts', 'deadline', 'b', 'c', 'k', 'o', 'op', 'env',
                   'cx', 'g', 'gw', 'dk'}
  COLD = {state_code = state_code, v1_names = v1_names, upgrade_v1 = upgrade_v1,
    downgrade_v1 = downgrade_v1, v1_restore = v1_restore,
    names_at = names_at, rec_t = rec_t, rec = rec, set_entry = set_entry, job_type = job_type,
    wake_if_sooner = wake_if_sooner, remember_error = remember_error, bury = bury,
    writer_mine = writer_mine, level_stream = level_stream, level_used = level_used,
    end_cancelled = end_cancelled, dedup_end = dedup_end, g_hold = g_hold, put_back_later = put_back_later,
    START_F = START_F}
  return COLD
end

-- Accept one job (enqueue.lua, fire.lua). The job's 9 arguments start at args[b]: id,
-- options (serialised; '' = all default), body ('<type> <serialised payload>'), max_attempts
-- (0 = handler decides), result_ttl_s, deadline_ms (0 = none; negative = that many ms after
-- now), delay_ms, run_at_ms (0 = none), notify channel ('' = none).
-- tag: the caller's writer tag (nil or '' = none; see writer_mine), kept in the record as
-- 'w' when the job is created.
-- Returns status (queued|scheduled|duplicate|full), state, result, error, mine (1 when an
-- existing duplicate was written by this very call or row: by writer tag when one is given,
-- else when it carries this very body and options). The caller counts stats. known_new: the
-- caller already knows the record does not exist (enqueue.lua's batch check).
-- Search indexes (docs/search.md; enqueue.lua's and wait.lua's search sections): IX =
-- {ret = retention ms, {key, spec}, ...}, spec '<A|L|T> <i> <i> ...' (A: the time index,
-- always first; L: the id-prefix index, score 0; T: a type, group or field index); id_of(i)
-- is the id of the call's i-th job when it was accepted, else nil (nothing written for it);
-- a second value true: add the id only where it is not yet (ZADD NX).
-- The oldest 100 + 2n entries past the retention leave A and L (and the T indexes written,
-- when A had any); each index written gets the retention as its TTL. An index key of another
-- type (overwritten by hand) is passed over: the jobs are accepted all the same.
local function ix_write(IX, now, n, id_of)
  local cut = now - IX.ret
  local aged = false
  for j = 1, #IX do
    local key, spec = IX[j][1], IX[j][2]
    local kind = ssub(spec, 1, 1)
    local z, zn = {}, {}
    for tok in string.gmatch(ssub(spec, 3), '%d+') do
      local id, nx = id_of(tonumber(tok))
      if id then
        local t = nx and zn or z
        t[#t + 1] = kind == 'L' and 0 or now
        t[#t + 1] = id
      end
    end
    if kind == 'A' then
      local old = rpcall('ZRANGEBYSCORE', key, '-inf', '(' .. cut, 'LIMIT', 0, 100 + 2 * n)
      if type(old) == 'table' and not old.err and old[1] then
        aged = true
        rpcall('ZREM', key, unpack(old))
        if IX[j + 1] and ssub(IX[j + 1][2], 1, 1) == 'L' then
          rpcall('ZREM', IX[j + 1][1], unpack(old))
        end
      end
    elseif kind == 'T' and z[1] and aged then
      rpcall('ZREMRANGEBYSCORE', key, '-inf', '(' .. cut)
    end
    if zn[1] then rpcall('ZADD', key, 'NX', unpack(zn)) end
    if z[1] or zn[1] then
      if z[1] then rpcall('ZADD', key, unpack(z)) end
      rpcall('PEXPIRE', key, IX.ret)
    end
  end
end

-- The error text of a dead letter (docs/search.md#error-text): one rule for the error-word
-- index (ixdead.lua) and for every check of an error filter (search.lua), so the index and a
-- scan answer alike. The text is '<error type> <reason> <message>' (etype: the dead letter's,
-- else the record's error's 'type'; message: the record's error's 'message', a JSON object's;
-- '' when absent), lower case (ASCII), cut just before its 17th distinct word (a word: a run
-- of a-z 0-9). Returns the text and its distinct words, in order.
local EW_MAX = 16
local function err_text(etype, reason, err)
  local msg = ''
  if err and err ~= '' then
    local okd, e = pcall(cjson.decode, err)
    if okd and type(e) == 'table' then
      if type(e.message) == 'string' then msg = e.message end
      if (not etype or etype == '') and type(e.type) == 'string' then etype = e.type end
    end
  end
  local text = string.lower((etype or '') .. ' ' .. (reason or '') .. ' ' .. msg)
  local seen, words, n = {}, {}, 0
  for p, w in string.gmatch(text, '()([0-9a-z]+)') do
    if not seen[w] then
      if n == EW_MAX then return ssub(text, 1, p - 1), words end
      seen[w] = true
      n = n + 1
      words[n] = w
    end
  end
  return text, words
end

-- Whether query q (lower case) occurs in text where a word starts: q that starts with a
-- letter or digit must not follow one ('declin' finds 'card declined', 'eclined' does not).
local function err_match(text, q)
  local wb = sfind(q, '^[0-9a-z]') ~= nil
  local init = 1
  while true do
    local p = sfind(text, q, init, true)
    if not p then return false end
    if not wb or p == 1 or not sfind(ssub(text, p - 1, p - 1), '^[0-9a-z]') then
      return true
    end
    init = p + 1
  end
end

-- A dead-letter entry id '<ms>-<seq>' as its error-word index position: inverted and fixed
-- width (13 + 8 digits), so that a word's entries sort newest first. Clamped: a bound past
-- the newest possible id is the first position.
local function ew_pos(eid)
  local ms, seq = string.match(eid, '^(%d+)%-(%d+)$')
  ms, seq = tonumber(ms) or 0, tonumber(seq) or 0
  if ms > 9999999999999 then ms, seq = 9999999999999, 99999999 end
  if seq > 99999999 then seq = 99999999 end
  return string.format('%013.0f%08.0f', 9999999999999 - ms, 99999999 - seq)
end

-- The entry id of an index position (ew_pos's inverse), and the ix:ewl member's head.
local function ew_eid(pos)
  local ms = 9999999999999 - tonumber(ssub(pos, 1, 13))
  local seq = 99999999 - tonumber(ssub(pos, 14, 21))
  return string.format('%.0f-%.0f', ms, seq), ms, string.format('%.0f-%08.0f', ms, seq)
end

-- Drop one dead letter's entries from the error-word index (ew) and its list (ewl), given
-- its ewl member ('<ms>-<seq, 8 digits> <word> ...').
local function ew_drop(ew, ewl, member)
  local sp = sfind(member, ' ', 1, true)
  local pos = ew_pos(sp and ssub(member, 1, sp - 1) or member)
  local z = {}
  if sp then
    for w in string.gmatch(ssub(member, sp + 1), '%S+') do z[#z + 1] = w .. '\0' .. pos end
  end
  if z[1] then rcall('ZREM', ew, unpack(z)) end
  rcall('ZREM', ewl, member)
end

-- G, g: the group context (gctx) and the job's group (nil or '' = none; G then non-nil): a
-- ready grouped job is admitted or waits (g_enter); the record keeps the group as 'g'.
-- dk (nil = none): the record's dedup field 'dk' (enqueue.lua's dedup section), written with
-- the rest.
local function accept(jobkey, stream, delayed, events, events_maxlen, wake, now, args, b, full,
                      known_new, tag, G, g, prio, dk)
  local id, opts, body = args[b], args[b + 1], args[b + 2]
  if tag == '' then tag = nil end
  if not known_new and rcall('EXISTS', jobkey) == 1 then
    local C = lib_cold()
    local existing = C.rec(jobkey, false, 's', 'r', 'error', 'b', 'op', 'w', 'env')
    local mine = 0
    if tag then
      mine = C.writer_mine(jobkey, existing[6], tag)
    elseif existing[4] == body and (existing[5] or '') == opts then
      mine = 1
    end
    return 'duplicate', existing[1] or '', existing[2] or '', existing[3] or '', mine
  end
  if full then return 'full', '', '', '', 0 end
  local sd, sr, sl = args[b + 6], args[b + 7], args[b + 5]  -- ('0': no tonumber call)
  local delay_ms = sd == '0' and 0 or tonumber(sd)
  local run_at = sr == '0' and 0 or tonumber(sr)
  local deadline = sl == '0' and 0 or tonumber(sl)
  local due = 0
  if deadline < 0 then deadline = now - deadline end
  if run_at > 0 then due = run_at elseif delay_ms > 0 then due = now + delay_ms end
  -- the optional fields (only when there are any) go in the same HSET as the ones every job
  -- has (one call, not two), behind literal arguments
  local extra = nil
  if g and g ~= '' then extra = {'g', g} end
  if tag then
    extra = extra or {}
    extra[#extra + 1] = 'w'; extra[#extra + 1] = tag
  end
  if opts ~= '' then
    extra = extra or {}
    extra[#extra + 1] = 'op'; extra[#extra + 1] = opts
  end
  if args[b + 4] ~= DEFAULT_TTL then
    extra = extra or {}
    extra[#extra + 1] = 'x'; extra[#extra + 1] = args[b + 4]
  end
  if args[b + 3] ~= '0' then
    extra = extra or {}
    extra[#extra + 1] = 'max_attempts'; extra[#extra + 1] = args[b + 3]
  end
  if deadline > 0 then
    extra = extra or {}
    extra[#extra + 1] = 'deadline'; extra[#extra + 1] = deadline
  end
  if args[b + 8] ~= '' then
    extra = extra or {}
    extra[#extra + 1] = 'notify'; extra[#extra + 1] = args[b + 8]
  end
  if prio and prio ~= '' then
    extra = extra or {}
    extra[#extra + 1] = 'p'; extra[#extra + 1] = prio
  end
  if dk then
    extra = extra or {}
    extra[#extra + 1] = 'dk'; extra[#extra + 1] = dk
  end
  local status
  if due > now then
    lib_cold().wake_if_sooner(delayed, wake, due)
    rcall('ZADD', delayed, due, id)
    status = 'scheduled'
    if extra then
      rcall('HSET', jobkey, 's', 's', 'b', body, 'c', now, 'due', due, unpack(extra))
    else
      rcall('HSET', jobkey, 's', 's', 'b', body, 'c', now, 'due', due)
    end
  elseif g and g ~= '' then
    status = 'queued'
    rcall('HSET', jobkey, 's', 'q', 'b', body, 'c', now)
    if prio and prio ~= '' then rcall('HSET', jobkey, 'p', prio) end  -- (g_push reads it)
    local entry = lib_groups().g_enter(G, g, id, jobkey, stream, now)
    if entry then rcall('HSET', jobkey, 'e', enc_entry(entry)) end
    rcall('HSET', jobkey, unpack(extra))  -- (holds 'g')
  else
    local entry = rcall('XADD', stream, '*', 'id', id)
    status = 'queued'
    if extra then
      rcall('HSET', jobkey, 's', 'q', 'b', body, 'e', enc_entry(entry), unpack(extra))
    else
      rcall('HSET', jobkey, 's', 'q', 'b', body, 'e', enc_entry(entry))
    end
  end
  emit(events, events_maxlen, id, 'enqueued', now, status)
  return status, status, '', '', 0
end

-- What a worker needs to run a job: '<body>' or '!<n>:<options, n bytes><body>' (layout
-- 2), or '~<envelope>' (a layout-1 record: its producer's envelope, kept as it was).
local function job_data(r)
  if not r[6] then return '~' .. (r[11] or '') end
  if r[10] then return '!' .. #r[10] .. ':' .. r[10] .. r[6] end
  return r[6]
end


-- start_entry's read: rec_t(jobkey, true, START_F) from one HGETALL (h, the caller's reply:
-- a short reply, no search per name). canon: entry is as Redis writes ids; 'e' equal to it
-- (either form): r[2] = entry.
-- 16: any of 'notify', 'pk', 'wk' (with cx, g, dk: finish.lua's rare fields); 17: 'z'; 18: 'x';
-- 19: any of the fields that are usually over 64 bytes (a failed attempt's, a handler's)
local START_AT = {s = 1, e = 2, n = 3, max_attempts = 4, deadline = 5, b = 6, c = 7, k = 8,
                  o = 9, op = 10, env = 11, cx = 12, g = 13, gw = 14, dk = 15, notify = 16,
                  pk = 16, wk = 16, z = 17, x = 18, error = 19, errors = 19, logs = 19,
                  progress = 19}
                  -- (names_at(START_F), then the names only the 'z' flag needs)
local PAD = {'00', '0', ''}
local MS_NUM = {}  -- tonumber of each entry time met in this script call (a batch shares few)
local function start_rec(jobkey, entry, canon, h)
  if h.err then return h end
  local at = START_AT
  local r = {false, false, false, false, false, false, false, false, false, false, false, false,
             false, false, false, false, false, false, false}
  for i = 1, #h, 2 do
    local j = at[h[i]]
    if j then r[j] = h[i + 1] end
  end
  local s, e = r[1], r[2]
  if not s then  -- layout 1, or no record
    local C = lib_cold()
    return C.rec_t(jobkey, true, C.START_F)
  end
  local ems
  if canon and e then
    local p = sfind(entry, '-', 1, true)
    local ms, n = ssub(entry, 1, p - 1), #entry - p
    if e == entry or (n <= 3 and e == ms .. PAD[n] .. ssub(entry, p + 1)) then
      ems = MS_NUM[ms]
      if not ems then ems = tonumber(ms); MS_NUM[ms] = ems end
    end
  end
  r[1], r[2] = state_of(s), ems and entry or dec_entry(e)
  if not r[7] then r[7] = ems or entry_ms(e) end
  -- plain (start_entry's 'z'): none of finish.lua's rare fields, and a record that is likely
  -- a listpack (no value over 64 bytes, hash-max-listpack-value's default): in a hashtable
  -- one more field costs ~50-180 bytes for the record's life (its entry, and the table's
  -- doubling), while finish.lua's HMGET there finds each field without a scan anyway
  local b, op = r[6], r[10]
  return r, ems, not (r[12] or r[13] or r[15] or r[16] or r[19]) and b and #b <= 64
    and not (op and #op > 64)
end

-- Start one delivered stream entry (start.lua, claim.lua). c is the call's context: stream
-- (the entry's stream), dead, events, stats, group, consumer, events_maxlen, dead_ttl,
-- dead_maxlen, now, paused (boolean), resume (the caller's token prefix, or '': a record
-- 'active', owned by the caller, under another token of that prefix is a start of this
-- worker whose reply was lost (claim.lua's): the same start seen again, no attempt
-- counted), G (the group context, gctx; nil: no group gate, unless gat is set: then it is
-- made from gkeys[gat ..] and the group defaults gspec once an entry of a group needs it),
-- the counters started,
-- reclaimed, failed, handed, cancelled, gheld, and fresh (entries whose idle
-- time the caller resets with one XCLAIM JUSTID). owned: the caller read the entry into its
-- pending list within this script (claim.lua), so it needs no ownership check and no idle
-- reset. Returns code ('run' | 'skip' | 'dead' | 'paused'), token, attempt, the job's data
-- (run) or the reason, deadline ms (0 = none), ms since the job (re)entered the stream, ms
-- since it was created. c.rate (optional): the queue-wide limiter (rate_take); a start it
-- refuses is handed back like a paused one (code 'limited', the reason: ms to wait).
local function start_entry(c, jobkey, entry, id, token, owned)
  local stream, now = c.stream, c.now
  local r, state, ems, plain  -- ems: the ms of entry, once r[2] is known to be entry; plain:
  -- a layout-2 record without any of finish.lua's rare fields (the 'z' flag, below)
  local canon = owned  -- entry as Redis writes ids ('<ms>-<seq>', no leading zeros)
  if not owned then
    -- Only the consumer whose pending list holds the entry may start it: a stale delivery
    -- (the caller stalled after XREADGROUP and another worker took it over) is left alone.
    local owner = rcall('XPENDING', stream, c.group, entry, entry, 1)
    if owner[1] == nil or owner[1][2] ~= c.consumer then
      return 'skip', 0, 0, 'not the owner', 0, 0, 0
    end
    canon = owner[1][1] == entry
  end
  local h = rpcall('HGETALL', jobkey)
  -- A queued record of the three fields enqueue.lua writes for a job with default options
  -- ('s' 'q', 'b', 'e'; any order: a hashtable's HGETALL has none) whose 'e' is this entry
  -- starts here without start_rec's table (callgrind: ~10k redis-server instructions per
  -- job less in a claim). Every check start_rec's path makes is settled by those fields
  -- alone (no attempts, limits, deadline, group, cancel, dedup key, 'z', 'x'), except the
  -- call's own (paused, rate): with either set, or any other record, the general path runs.
  if #h == 6 and canon and not c.paused and not c.rate then  -- (an error reply: #h == 0)
    local s, b, e
    for i = 1, 5, 2 do
      local f = h[i]
      if f == 's' then s = h[i + 1] elseif f == 'b' then b = h[i + 1]
      elseif f == 'e' then e = h[i + 1] end
    end
    if s == 'q' and b and e then
      local p = sfind(entry, '-', 1, true)
      local ms, n = ssub(entry, 1, p - 1), #entry - p
      if e == entry or (n <= 3 and e == ms .. PAD[n] .. ssub(entry, p + 1)) then
        ems = MS_NUM[ms]
        if not ems then ems = tonumber(ms); MS_NUM[ms] = ems end
        -- (start_rec's 'plain': none of the rare fields, a listpack-sized body)
        if #b <= 64 then
          rcall('HSET', jobkey, 's', 'a', 'n', '1', 'k', token, 'o', c.consumer, 'a',
            nstr(now), 'z', '')
        else
          rcall('HSET', jobkey, 's', 'a', 'n', '1', 'k', token, 'o', c.consumer, 'a',
            nstr(now))
        end
        c.started = c.started + 1
        if not owned then c.fresh[#c.fresh + 1] = entry end
        local spec = c.events_maxlen
        if c.ev_spec ~= spec then c.ev_spec = spec; c.ev_started = emit_on(spec, 'started') end
        if c.ev_started then emit(c.events, spec, id, 'started', now, 1) end
        return 'run', token, 1, b, 0, now - ems, now - ems
      end
    end
  end
  r, ems, plain = start_rec(jobkey, entry, canon, h)
  state = r[1]
  local G = c.G
  if not G and c.gat and (r[13] or r[14]) then  -- (enqueue.lua's hand-off: made when needed)
    G = lib_groups().gctx(c.gkeys, c.gat, c.gspec)
    c.G = G
  end
  if G and not r[2] and r[14] then  -- admitted from its group's wait list: its entry?
    r[2] = lib_groups().g_adopt(jobkey, stream, entry, r[14]) and entry or '0-0'
  end
  local g = G and r[13] or nil
  if r.err then  -- the key holds something else than a job record
    ack_del(stream, c.group, entry)
    rcall('XADD', c.dead, 'MAXLEN', '~', c.dead_maxlen, '*', 'job', id,
      'reason', 'job record corrupted', 'etype', 'CorruptRecord', 'type', '', 't', now)
    c.failed = c.failed + 1
    return 'dead', 0, 0, 'job record corrupted', 0, 0, 0
  elseif not state and rcall('EXISTS', jobkey) == 0 then
    ack_del(stream, c.group, entry)
    rcall('XADD', c.dead, 'MAXLEN', '~', c.dead_maxlen, '*', 'job', id,
      'reason', 'job record missing', 'etype', 'MissingRecord', 'type', '', 't', now)
    c.failed = c.failed + 1
    return 'dead', 0, 0, 'job record missing', 0, 0, 0
  elseif not state or sbyte(state, 1) == 63  -- ('?<letter>': state_of)
      or ((state == 'queued' or state == 'active')
        and not (ems or string.match(r[2] or '', '^%d+%-%d+$'))) then
    -- a record without a usable state or stream entry is damaged, not a ghost: bury it
    ack_del(stream, c.group, entry)
    lib_cold().bury(jobkey, c.dead, c.events, id, 'job record corrupted', '', 'CorruptRecord', now,
      c.dead_ttl, c.dead_maxlen, c.events_maxlen, true)
    c.failed = c.failed + 1
    return 'dead', 0, 0, 'job record corrupted', 0, 0, 0
  elseif r[2] ~= entry or (state ~= 'queued' and state ~= 'active') then
    -- a ghost of an older delivery, or a job already finished or cancelled
    ack_del(stream, c.group, entry)
    return 'skip', 0, 0, state, 0, 0, 0
  elseif state == 'active' and r[9] == c.consumer and (r[8] == token
      or (c.resume ~= '' and r[8] and ssub(r[8], 1, #c.resume) == c.resume)) then
    -- this very start ran before (its reply was lost): the same lease, the same attempt
    if not owned then c.fresh[#c.fresh + 1] = entry end
    return 'run', r[8], tonumber(r[3]) or 1, job_data(r), tonumber(r[5]) or 0,
      now - (ems or entry_ms(r[2]) or now), now - (tonumber(r[7]) or now)
  elseif r[12] then  -- cancel requested while it ran: it ends here, never runs again
    ack_del(stream, c.group, entry)
    rcall('HDEL', jobkey, 'k')
    lib_cold().end_cancelled(jobkey, c.events, c.events_maxlen, id, now, 'cancel requested')
    if g then lib_groups().g_release(G, g, id, stream, now) end
    c.cancelled = c.cancelled + 1
    return 'skip', 0, 0, 'cancelled', 0, 0, 0
  elseif c.paused then
    -- hand it back untouched (no attempt counted); a lapsed lease's owner is fenced out
    ack_del(stream, c.group, entry)
    lib_cold().set_entry(jobkey, 'queued', rcall('XADD', stream, '*', 'id', id))
    rcall('HDEL', jobkey, 'k')
    c.handed = c.handed + 1
    return 'paused', 0, 0, 'queue paused', 0, 0, 0
  end
  local attempts = r[3] and tonumber(r[3]) or 0  -- (absent: no call)
  local max_attempts = r[4] and tonumber(r[4]) or 0  -- 0: the handler's setting decides
  local deadline = r[5] and tonumber(r[5]) or 0
  local charged = false
  if c.rate and not (deadline > 0 and now > deadline)
      and not (max_attempts > 0 and attempts >= max_attempts) then
    charged = lib_rate().rate_take(c.rate)
  end
  if c.rate and not charged and not (deadline > 0 and now > deadline)
      and not (max_attempts > 0 and attempts >= max_attempts) then
    -- over the queue's rate: hand it back untouched (no attempt counted), as when paused
    ack_del(stream, c.group, entry)
    lib_cold().set_entry(jobkey, 'queued', rcall('XADD', stream, '*', 'id', id))
    rcall('HDEL', jobkey, 'k')
    c.handed = c.handed + 1
    return 'limited', 0, 0, lib_rate().rate_wait_ms(c.rate), 0, 0, 0
  end
  if deadline > 0 and now > deadline then
    ack_del(stream, c.group, entry)
    lib_cold().bury(jobkey, c.dead, c.events, id, 'deadline passed', '', 'DeadlineExceeded', now,
      c.dead_ttl, c.dead_maxlen, c.events_maxlen, true)
    if g then lib_groups().g_release(G, g, id, stream, now) end
    c.failed = c.failed + 1
    return 'dead', 0, attempts, 'deadline passed', 0, 0, 0
  elseif max_attempts > 0 and attempts >= max_attempts then
    ack_del(stream, c.group, entry)
    lib_cold().bury(jobkey, c.dead, c.events, id, 'attempts exhausted (lease lapsed)', '',
      'LeaseExpired', now, c.dead_ttl, c.dead_maxlen, c.events_maxlen, true)
    if g then lib_groups().g_release(G, g, id, stream, now) end
    c.failed = c.failed + 1
    return 'dead', 0, attempts, 'attempts exhausted (lease lapsed)', 0, 0, 0
  end
  local held = g and lib_groups().g_gate(G, g, id, now)
  if held then  -- back to the head of its group's wait list, no attempt counted
    if charged then c.rate.tat = c.rate.tat - c.rate.interval end  -- did not start: refund
    ack_del(stream, c.group, entry)
    lib_groups().g_push(G, g, id, jobkey, true)
    rcall('HDEL', jobkey, 'k')
    lib_groups().g_release(G, g, id, stream, now)
    c.gheld = (c.gheld or 0) + 1
    return 'skip', 0, attempts, held, 0, 0, 0
  end
  attempts = attempts + 1
  -- 'z' (docs/key-layout.md): the record holds none of 'notify', 'cx', 'g', 'dk', 'pk', 'wk',
  -- and 'z' is its 'x' ('' = absent), so finish.lua reads 3 fields, not 9; whatever writes one
  -- of the six later (cancel.lua, link.lua, link_many.lua, adopt.lua) removes it
  if plain then
    rcall('HSET', jobkey, 's', 'a', 'n', nstr(attempts), 'k', token, 'o', c.consumer, 'a',
      nstr(now), 'z', r[18] or '')
  else
    rcall('HSET', jobkey, 's', 'a', 'n', nstr(attempts), 'k', token, 'o', c.consumer, 'a',
      nstr(now))
    if r[17] then rcall('HDEL', jobkey, 'z') end  -- (written by an earlier start)
  end
  if r[15] then lib_cold().dedup_end(r[15], jobkey, id, true, now) end  -- (docs/dedup.md)
  if state == 'active' then
    c.reclaimed = c.reclaimed + 1
    emit(c.events, c.events_maxlen, id, 'reclaimed', now, c.consumer)
  end
  c.started = c.started + 1
  if not owned then c.fresh[#c.fresh + 1] = entry end
  local spec = c.events_maxlen  -- (emit_on asked once per context and events argument)
  if c.ev_spec ~= spec then c.ev_spec = spec; c.ev_started = emit_on(spec, 'started') end
  if c.ev_started then emit(c.events, spec, id, 'started', now, attempts) end
  return 'run', token, attempts, job_data(r), deadline, now - (ems or entry_ms(r[2]) or now),
    now - (tonumber(r[7]) or now)
end

-- The counters of a start context (start_entry) into the stats HASH.
local function count_starts(c)
  count(c.stats, 'started', c.started)
  count(c.stats, 'reclaimed', c.reclaimed)
  count(c.stats, 'failed', c.failed)
  count(c.stats, 'released', c.handed)
  count(c.stats, 'cancelled', c.cancelled)
  count(c.stats, 'group_held', c.gheld or 0)
end


-- The hand-off functions (docs/performance.md#hand-off), made on first use in a script call
-- (enqueue.lua when it adds a job an idle worker may take, _flow.lua's release): a script
-- that never hands a job over makes none of them.
local HAND = nil
local function lib_hand()
  if HAND then return HAND end
  -- Hand-off (docs/performance.md#hand-off): deliver the oldest entry of c.stream not yet
  -- delivered to c.consumer (XREADGROUP COUNT 1: it lands in that consumer's pending list, as
  -- a claim's would) and start its job there as start.lua starts one (start_entry, token
  -- '<tokens>h<entry>'; records: the record key prefix, from a field the key builder wrote,
  -- as claim.lua's). only (optional): the entry the caller just added (a job a workflow
  -- released); another one met first (a backlog) and an entry without a job id are left
  -- delivered, not started: code 'own' sends the worker to its own pending entries (start.lua
  -- starts them with every gate). Returns nothing when no entry was delivered, else the entry,
  -- the job id, then start_entry's code, token, attempt, data, deadline, wait and age.
  local function hand_one(c, records, tokens, only)
    local reply = rpcall('XREADGROUP', 'GROUP', c.group, c.consumer, 'COUNT', 1,
      'STREAMS', c.stream, '>')
    if type(reply) ~= 'table' or reply.err or not reply[1] then return end  -- (no group yet,
    -- or nothing left undelivered)
    local e = reply[1][2][1]
    local entry, id = e[1], nil
    for j = 1, #e[2], 2 do
      if e[2][j] == 'id' then id = e[2][j + 1] end
    end
    if not id or (only and entry ~= only) then
      return entry, id or '', 'own', '', 0, '', 0, 0, 0
    end
    return entry, id, start_entry(c, records .. id, entry, id, tokens .. 'h' .. entry, true)
  end

  -- A ticket member's fields: '<records>|<inbox>|<tokens>|<events>|<dead ttl>|<dead max>|<consumer>'
  -- (ticket.lua; the first two not empty, the consumer the rest, not empty); nil: malformed.
  -- Plain searches for '|' (a pattern with seven captures over ~150 bytes costs ~4x more).
  local function ticket_fields(m)
    local find, sub = string.find, string.sub
    local a = find(m, '|', 1, true)
    if not a or a == 1 then return nil end
    local b = find(m, '|', a + 1, true)
    if not b or b == a + 1 then return nil end
    local c = find(m, '|', b + 1, true)
    local d = c and find(m, '|', c + 1, true)
    local e = d and find(m, '|', d + 1, true)
    local f = e and find(m, '|', e + 1, true)
    if not f or f == #m then return nil end
    return sub(m, 1, a - 1), sub(m, a + 1, b - 1), sub(m, b + 1, c - 1), sub(m, c + 1, d - 1),
      sub(m, d + 1, e - 1), sub(m, e + 1, f - 1), sub(m, f + 1)
  end

  -- Hand up to m entries just added to c.stream to idle workers through their tickets (the
  -- tickets ZSET of c.stream; ticket.lua): each taken ticket's worker gets one entry started
  -- (hand_one; only: as there) and written to its inbox STREAM, where its blocked read wakes
  -- with it. paused (optional): the pause flag, checked here (paused: nothing is handed, no
  -- ticket touched); nil: the caller checked it. c is a start context (start_entry) whose
  -- consumer and settings each ticket sets; its starts are counted (count_starts). more
  -- (optional): a function giving a started job's extra inbox field 'r' (or nil for none).
  local function hand_off(c, tickets, paused, m, only, more)
    local live = rcall('ZRANGEBYSCORE', tickets, c.now, '+inf', 'LIMIT', 0, m + 4)
    if not live[1] then return end  -- (the common case under load: no idle worker, nothing
    -- more to do)
    for i, member in ipairs(live) do
      if m <= 0 then break end
      local records, inbox, tokens, ev, dttl, dmax, consumer = ticket_fields(member)
      local there = nil  -- whether the inbox exists (nil: not asked yet)
      if i == 1 and paused then
        -- the pause flag and the first inbox in one EXISTS, the inbox named twice: an odd
        -- count is the flag (paused: nothing starts, no ticket is touched), 2 or more the inbox
        local k
        if inbox then k = rcall('EXISTS', paused, inbox, inbox)
        else k = rcall('EXISTS', paused) end
        if k % 2 == 1 then return end
        there = k >= 2
      end
      -- the worker subscribes to its inbox's name as a channel: no subscriber, no worker
      -- (killed: its connection closed) or none yet; an inbox gone, a worker gone
      local alive = inbox and rcall('PUBSUB', 'NUMSUB', inbox)[2] > 0
      if alive and there == nil then there = rcall('EXISTS', inbox) == 1 end
      if not alive or not there then
        rcall('ZREM', tickets, member)
      else
        c.consumer, c.events_maxlen, c.dead_ttl, c.dead_maxlen = consumer, ev, dttl, dmax
        local entry, id, code, tok, attempt, data, deadline, wait, age =
          hand_one(c, records, tokens, only)
        if not entry then break end  -- nothing left undelivered (or no consumer group yet)
        rcall('ZREM', tickets, member)
        m = m - 1
        local r = more and code == 'run' and more() or nil
        if r then
          rcall('XADD', inbox, 'MAXLEN', 32, '*', 'e', entry, 'id', id, 'c', code,
            'k', tok, 'n', attempt, 'd', data, 'dl', deadline, 'w', wait, 'a', age, 'r', r)
        else
          rcall('XADD', inbox, 'MAXLEN', 32, '*', 'e', entry, 'id', id, 'c', code,
            'k', tok, 'n', attempt, 'd', data, 'dl', deadline, 'w', wait, 'a', age)
        end
        if only then break end  -- (one entry was added)
      end
    end
    count_starts(c)
  end

  HAND = {hand_one = hand_one, hand_off = hand_off}
  return HAND
end
