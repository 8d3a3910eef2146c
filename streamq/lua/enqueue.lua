-- enqueue.lua: accept N jobs (N >= 1) atomically per job, with dedup by id and backpressure.
-- Safe to repeat: a repeat finds its own jobs and answers 'duplicate' with mine = 1 (the same
-- writer tag and offset, or without tags the same body and options), writing nothing new.
-- Records are written in layout 2; a duplicate's layout-1 record is read too (and left in
-- layout 1: _lib.lua's rec_t and v1_restore).
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
--           job i ('' = none): only with the group keys, and the N groups only when a job of
--           the call has one (left out, every job's is ''; told by the count of arguments).
--           A ready grouped job is admitted to the stream or waits for a slot of its group
--           (_lib.lua's g_enter).
-- ARGV[#ARGV-N+i] (only with the level keys) the priority of job i ('' = the default, 2:
--           KEYS[1]; else 0..4, kept as the record's 'p', the level added to the levels SET)
-- KEYS[#KEYS-2 .. #KEYS] (optional; the group keys and their ARGV then always come too, so
--           the count of keys after the records is 14 or 19) the hand-off keys: the tickets
--           ZSET of KEYS[1] (Keys.tickets), the pause flag, the dead STREAM. With them, for
--           each job this call adds to KEYS[1] (no group, the default priority) while the
--           queue is not paused, one idle worker's ticket (ticket.lua) is taken: KEYS[1] is
--           read for its consumer (XREADGROUP COUNT 1: the oldest entry not yet delivered
--           lands in that worker's pending list, as a claim's would), that entry's job is
--           started as start.lua starts one (_lib.lua's start_entry, through its group's gate
--           if it has one; token '<the worker's token prefix>h<stream entry id>') and the
--           start is written to the worker's inbox STREAM, where its blocked read wakes with
--           it (docs/performance.md#hand-off). The ticket names the inbox and the record key
--           prefix: the two keys not passed in KEYS (like claim.lua's records, they carry this
--           shard's hash tag). A ticket is dropped, not used, when its inbox no longer exists
--           or the channel of the inbox's name has no subscriber (PUBSUB NUMSUB: each worker
--           subscribes to it while it runs, so a killed worker's closed connection ends it; on
--           Redis Cluster the count is the shard's node's only). An entry without a job id is not started: code 'own' sends the worker to
--           read its own pending entries (start.lua dead-letters it). A repeat of this call
--           adds no job, so it hands nothing off.
-- ARGV[4] may be 'N:D' instead of N: D jobs of the call have a dedup key (docs/dedup.md), and
--           the call ends with a dedup section, after everything above: KEYS[#KEYS-D+j] the
--           dedup key STRING of the j-th of them (Keys.dedup: the id of the job holding it),
--           and ARGV: the job record key prefix (the record of job <id> is it .. <id>, built
--           by the key builder like claim.lua's: same hash tag), then per dedup job j: its
--           index i in the call, mode letter (t throttle, d debounce, k keep_last, s
--           until_start, f until_finish), key TTL ms (throttle's window, else the
--           backstop), debounce's delay ms and max wait ms ('0' for other modes). The
--           positions "from the end" above are counted without that section. A job whose
--           key names another job within its mode's window is folded into it (nothing new
--           is written; debounce and keep_last replace its body, debounce pushes its due
--           time back, up to max wait after its creation; the 'deduplicated' event); a
--           keep_last key whose job is running or retrying makes this job its follow-up,
--           held in the delayed ZSET for the TTL (the running job's record gets 'dn' = its
--           id; its end makes it due: _lib.lua's dedup_end). A new job takes the key (SET
--           with the TTL) and keeps '<mode letter><key name>' as its record's 'dk'. A key
--           that names this very job (a repeated call that created it) is passed over (the
--           id's duplicate answer follows); a folded job remembers the last job id folded
--           into it ('dl'), so a repeated call is answered the same and writes nothing.
-- ARGV[4] may be 'N:D:S' (D may be 0: then no dedup section) with S > 0 search index keys
--           (docs/search.md; QueueConfig.search), a section after all of the above (the
--           positions above are counted without it): KEYS[#KEYS-S+j] the j-th index ZSET of
--           this shard (Keys.ix_*), ARGV[#ARGV-S] the retention ms, ARGV[#ARGV-S+j] that
--           index's kind and the jobs of the call it takes: '<A|L|T> <i> <i> ...' (A: the
--           time index, always first; L: the id-prefix index, score 0; T: a type, group or
--           field index). Each job this call accepts (queued or scheduled: never a
--           duplicate, a refused or a folded one, so a repeat writes nothing new; a
--           debounce/keep_last fold adds the job it replaced to the indexes it is not in yet,
--           ZADD NX) is added
--           with the server's now as score; entries older than the retention are trimmed
--           (the time index's oldest 100 + 2N at most per call, so trimming keeps up with
--           any rate of enqueues; they also leave L; the T
--           indexes of the call only when the time index had such entries), and each
--           index written gets the retention as its TTL (an index nobody writes expires).
-- Returns a flat array, in job order: 1 element for a job accepted or refused, its status
--           (queued|scheduled|full); 5 for a duplicate: 'duplicate', its state, result
--           ('' unless completed), error ('' unless failed), mine: 1 when this very row
--           wrote it (with a writer tag: by writer_mine's rules, a retried call or a row of
--           an earlier task attempt; without: it carries this very body and options, a
--           retried call) else 0; 3 for a job folded by its dedup key: 'deduplicated', the
--           id of the job it was folded into, that job's state ('' when its record is gone).
-- ARGV[4] may start with '=' (the compact form, prepare.py's _compact: a batch whose jobs
--           differ only in id and body, and whose ids are distinct: a batch with an id twice
--           comes in the full form, so F below needs no check of its own): then ARGV[5 .. 12]
--           are the 8 values the jobs share (options, max_attempts, result_ttl_s,
--           deadline_ms, delay_ms, run_at_ms, notify, writer tag), ARGV[13 + 2*(i-1)],
--           ARGV[14 + 2*(i-1)] job i's id and body, and the rest follows as above; the call
--           reads them as if each job had its 10 (A below).
--           Each argument costs the server its parsing, an object and a Lua string.
--           F (the plain batch): a call in the compact form with no dedup or search
--           section, no level keys, the group keys only with every job's group '' (with or
--           without the hand-off keys), no max depth and no record of the batch existing,
--           is written job by job without the general path's per-job work: one EXISTS over
--           the records, the key checks, the count of 'enqueued' as the first write, then
--           per job what accept() writes (the same fields, in the same order: below), its
--           'enqueued' event when on, and the hand-off. Its jobs share their delay and run
--           time, so all are queued (XADD to KEYS[1], one HSET) or all scheduled (ZADD to
--           KEYS[2], one HSET; the wake channel published once, before the first ZADD,
--           when their due time is the earliest). Its answer is an integer: N, every job
--           queued, or -N, every job scheduled (one reply element, not N). Any other call
--           takes the general path, as if F were not. On Redis 7.0+ the entries of such a
--           call share one ms: the first XADD of the call takes '*', the ones after it
--           '<that ms>-*' (as '*' does within a script on Redis 7.2+), so 'e' is counted
--           rather than parsed; from sequence 999 on '*' again.
-- ARGV[4] may end with '/L' (after any of the forms above: '3/6', '=3:1/6'): L is the shard
--           count the producer routed the call's jobs by (shards.Layout.shards). When KEYS[3]
--           has 'lay' (the count this shard takes new jobs for: a reshard froze it,
--           docs/scaling.md#resharding) and it differs from L, the call writes nothing and
--           answers the error 'STREAMQ_LAYOUT <lay>' (the producer re-reads the layout and
--           resends to the jobs' new homes). No 'lay' (a queue never resharded), or no '/L'
--           (a caller that routes by no count), accepts. One HGET per call.
local ARGV = ARGV
do
  local h = ARGV[4]
  local sl = sfind(h, '/', 1, true)
  if sl then
    local lay = rpcall('HGET', KEYS[3], 'lay')
    if type(lay) == 'string' and lay ~= ssub(h, sl + 1) then
      return redis.error_reply('STREAMQ_LAYOUT ' .. lay)
    end
    ARGV[4] = ssub(h, 1, sl - 1)  -- (a stats key of another type: refused below, by expect)
  end
end
local function expect(key, cmd, want, arg, arg2)  -- (below: every key is checked)
  local r
  if arg2 then r = rpcall(cmd, key, arg, arg2)
  elseif arg then r = rpcall(cmd, key, arg) else r = rpcall(cmd, key) end
  if type(r) == 'table' and r.err then
    if ssub(r.err, 1, 9) == 'WRONGTYPE' then
      return redis.error_reply('WRONGTYPE ' .. key .. ' is not a ' .. want
        .. ': nothing was enqueued')
    end
    return r  -- any other refusal (NOPERM, ...) as the server said it
  end
end
-- The plain batch (the header's F): the compact form (no id twice), every record new, no
-- group, priority, dedup, search or depth limit: every job queued now, or every one
-- scheduled. What accept() writes for each job, written without its per-job work (the same
-- records, entries, events and counts; the answer in one integer); the fields every job
-- shares are made once. nil: not such a batch, nothing done.
-- (Made only for a call in the compact form: each closure made costs every call.)
if sbyte(ARGV[4], 1) == 61 then local function plain_batch()
  local STAR_OK = (redis.REDIS_VERSION_NUM or 0) >= 0x070000  -- (XADD '<ms>-*')
  local src, K = ARGV, KEYS  -- (a local: KEYS is a global, looked up at each use)
  local n = tonumber(ssub(src[4], 2))
  if not n or n < 1 or (tonumber(src[2]) or 1) > 0 then return nil end
  local extra = #KEYS - 4 - n
  if not ((extra == 0 and #src == 12 + 2 * n) or ((extra == 11 or extra == 14)
      and (#src == 13 + 2 * n or #src == 13 + 3 * n))) then
    return nil
  end
  local d, t = src[9], src[10]
  local now, due = nil, 0  -- (the due time of every job, made as the general path makes it)
  if (d ~= '0' and (tonumber(d) or 1) > 0) or (t ~= '0' and (tonumber(t) or 1) > 0) then
    now = now_ms()
    local delay_ms, run_at = d == '0' and 0 or tonumber(d), t == '0' and 0 or tonumber(t)
    if run_at > 0 then due = run_at elseif delay_ms > 0 then due = now + delay_ms end
  end
  local later = now ~= nil and due > now  -- (else queued now, as a run time past is)
  for i = 14 + 2 * n, #src do  -- (with the group keys: each job's group)
    if src[i] ~= '' then return nil end
  end
  -- (no id twice: the compact form's own rule, kept by its producer, _compact)
  if rcall('EXISTS', unpack(K, 5, 4 + n)) ~= 0 then return nil end
  local stream, stats, events, spec = KEYS[1], KEYS[3], KEYS[4], src[1]
  local ho = extra == 14 and #KEYS - 2 or nil
  local ev = emit_on(spec, 'enqueued')
  local bad = expect(stream, 'XLEN', 'stream')
    or (later and expect(KEYS[2], 'ZCARD', 'zset'))
    or ((ev or (ho and (emit_on(spec, 'started') or emit_on(spec, 'reclaimed')
      or emit_on(spec, 'failed') or emit_on(spec, 'cancelled'))))
      and expect(events, 'XLEN', 'stream'))
    or expect(stats, 'HINCRBY', 'hash', 'enqueued', n)  -- (the first write)
  if bad then return bad end
  -- the fields accept() writes after s, b and e (or c and due), in its order
  local more = {}
  local tag, opts, ttl, ma, sl, nt = src[12], src[5], src[7], src[6], src[8], src[11]
  if tag ~= '' then more[#more + 1] = 'w'; more[#more + 1] = tag end
  if opts ~= '' then more[#more + 1] = 'op'; more[#more + 1] = opts end
  if ttl ~= DEFAULT_TTL then more[#more + 1] = 'x'; more[#more + 1] = ttl end
  if ma ~= '0' then more[#more + 1] = 'max_attempts'; more[#more + 1] = ma end
  local deadline = sl == '0' and 0 or tonumber(sl)
  if deadline < 0 then now = now or now_ms(); deadline = now - deadline end
  if deadline > 0 then more[#more + 1] = 'deadline'; more[#more + 1] = deadline end
  if nt ~= '' then more[#more + 1] = 'notify'; more[#more + 1] = nt end
  if not more[1] then more = nil end
  if later then  -- scheduled: the delayed ZSET, one wake for the call (the jobs share due)
    local delayed = KEYS[2]
    lib_cold().wake_if_sooner(delayed, src[3], due)
    local c, u, j = nstr(now), nstr(due), 11
    for i = 5, 4 + n do
      j = j + 2
      local id = src[j]
      rcall('ZADD', delayed, u, id)
      if more then
        rcall('HSET', K[i], 's', 's', 'b', src[j + 1], 'c', c, 'due', u, unpack(more))
      else
        rcall('HSET', K[i], 's', 's', 'b', src[j + 1], 'c', c, 'due', u)
      end
      if ev then emit(events, spec, id, 'enqueued', 0, 'scheduled') end
    end
    return -n
  end
  -- Entry ids: a job takes '*', and on Redis 7.0+ the jobs after it '<its ms>-*' (the same
  -- ms, the next sequence number: what '*' gives on Redis 7.2+, where time stands still
  -- within a script), so that the record's 'e' (enc_entry's '<ms><seq, 3 digits>') is made
  -- of digits counted here rather than parsed from each reply; after sequence 999, '*' again.
  local D = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9'}
  local ms, star, seq, hi, lo = nil, nil, 999, nil, 0  -- hi: '<ms><hundreds><tens>'
  local j = 11
  for i = 5, 4 + n do
    j = j + 2
    local id, e = src[j], nil
    if seq < 999 then
      rcall('XADD', stream, star, 'id', id)
      seq, lo = seq + 1, lo + 1
      if lo == 10 then
        lo = 0
        hi = ms .. D[(seq - seq % 100) / 100 + 1] .. D[(seq % 100 - seq % 10) / 10 + 1]
      end
      e = hi .. D[lo + 1]
    else
      e = rcall('XADD', stream, '*', 'id', id)
      local m, sq = string.match(e, '^(%d+)%-(%d+)$')
      if m and #sq <= 3 then
        seq = tonumber(sq)
        lo = seq % 10
        hi = m .. D[(seq - seq % 100) / 100 + 1] .. D[(seq % 100 - lo) / 10 + 1]
        e = hi .. D[lo + 1]
        if STAR_OK then ms, star = m, m .. '-*' else seq = 999 end
      else
        seq = 999  -- (e: enc_entry's other form, the id as it is)
      end
    end
    if more then
      rcall('HSET', K[i], 's', 'q', 'b', src[j + 1], 'e', e, unpack(more))
    else
      rcall('HSET', K[i], 's', 'q', 'b', src[j + 1], 'e', e)
    end
    if ev then emit(events, spec, id, 'enqueued', 0, 'queued') end
  end
  if ho then  -- (as the general path's hand-off below)
    local c = {dead = KEYS[ho + 2], stats = stats, events = events, stream = stream,
      group = 'streamq', resume = '', now = now or now_ms(), paused = false, started = 0,
      reclaimed = 0, failed = 0, handed = 0, cancelled = 0, fresh = {}, G = nil, gat = 5 + n,
      gkeys = KEYS, gspec = src[13 + 2 * n]}
    local ok = pcall(lib_hand().hand_off, c, KEYS[ho], KEYS[ho + 1], n)
    if not ok then count(stats, 'handoff_errors', 1) end
  end
  return n
end
  local r = plain_batch()
  if r then return r end
end
if sbyte(ARGV[4], 1) == 61 then  -- '='
  local src = ARGV
  local A = {src[1], src[2], src[3], ssub(src[4], 2)}
  local o, ma, ttl, dl, dy, ra, nt, tg = src[5], src[6], src[7], src[8], src[9], src[10],
    src[11], src[12]
  local n0 = tonumber(string.match(A[4], '^%d+'))
  local j, s = 5, 13
  for _ = 1, n0 do
    A[j] = src[s]; A[j + 1] = o; A[j + 2] = src[s + 1]; A[j + 3] = ma; A[j + 4] = ttl
    A[j + 5] = dl; A[j + 6] = dy; A[j + 7] = ra; A[j + 8] = nt; A[j + 9] = tg
    j, s = j + 10, s + 2
  end
  for x = s, #src do A[j] = src[x]; j = j + 1 end
  ARGV = A
end
local stream, delayed, stats, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local events_maxlen = ARGV[1]
local max_depth = tonumber(ARGV[2])
local wake = ARGV[3]
local n = tonumber(ARGV[4])
local NK, NA = #KEYS, #ARGV  -- (without the dedup and search sections)
local DD = nil  -- the dedup section: job index -> {key, mode, ttl ms, delay ms, max wait ms}
local IX = nil  -- the search section: {{key, spec}, ...}, ret = retention ms
if not n then
  local c = sfind(ARGV[4], ':', 1, true)
  local c2 = sfind(ARGV[4], ':', c + 1, true)
  local d = tonumber(ssub(ARGV[4], c + 1, (c2 or 0) - 1))
  n = tonumber(ssub(ARGV[4], 1, c - 1))
  if c2 then
    local s = tonumber(ssub(ARGV[4], c2 + 1))
    IX = {ret = tonumber(ARGV[NA - s])}
    for j = 1, s do IX[j] = {KEYS[NK - s + j], ARGV[NA - s + j]} end
    NK, NA = NK - s, NA - s - 1
  end
  if d > 0 then
    NK, NA = NK - d, NA - 1 - 5 * d
    DD = {prefix = ARGV[NA + 1]}
    for j = 1, d do
      local a = NA + 2 + 5 * (j - 1)
      DD[tonumber(ARGV[a])] = {KEYS[NK + j], ARGV[a + 1], ARGV[a + 2], tonumber(ARGV[a + 3]),
        tonumber(ARGV[a + 4])}
    end
  end
end
local now = now_ms()
local out = {}
local extra = NK - 4 - n  -- keys after the records
local ho = nil  -- the hand-off keys
if extra == 14 or extra == 19 then
  ho = NK - 2
  extra = extra - 3
end
local has_g = extra == 11 or extra == 16
-- GA: where the jobs' groups are (ARGV[GA + i]), nil when they were left out (no job of the
-- call has one: the arguments after the group defaults are then the level ones, or none)
local GA = has_g and NA - 4 - 10 * n - ((extra == 16) and n or 0) > 1 and 5 + 10 * n or nil
local G = nil  -- the group context, built only when a job of the batch or the depth needs it
if has_g then
  local grouped = max_depth > 0
  for i = 1, GA and n or 0 do
    if grouped then break end
    grouped = ARGV[GA + i] ~= ''
  end
  if grouped then G = lib_groups().gctx(KEYS, 5 + n, ARGV[5 + 10 * n]) end
end
local depth = -1
if max_depth > 0 then
  depth = rcall('XLEN', stream) + rcall('ZCARD', delayed)
  if G then depth = depth + rcall('ZCARD', G.wait) end
end
local enqueued, duplicates, rejected = 0, 0, 0
-- Every key is checked before anything is written: a key of the wrong type (overwritten by
-- hand) refuses the whole call, never half of it. A key is checked only when this call may
-- write it: the delayed ZSET when a job has a delay or a run time, the events STREAM when a
-- kind this call may write is on (its jobs' 'enqueued'; a hand-off's start). The stats HASH,
-- when every record of the batch is new, is checked by the call's first write: its count of
-- the jobs enqueued, made before any other write (and corrected at the end for an id that
-- came twice in the batch); otherwise by a read, as the records are (expect, above).
local later = false  -- a job of the batch may go to the delayed ZSET
for i = 1, n do
  local b = 5 + 10 * (i - 1)
  local d, t = ARGV[b + 6], ARGV[b + 7]
  if (d ~= '0' and (tonumber(d) or 1) > 0) or (t ~= '0' and (tonumber(t) or 1) > 0) then
    later = true
    break
  end
end
local ev_check = emit_on(events_maxlen, 'enqueued')
  or (DD and emit_on(events_maxlen, 'deduplicated')) or (ho ~= nil
  and (emit_on(events_maxlen, 'started') or emit_on(events_maxlen, 'reclaimed')
    or emit_on(events_maxlen, 'failed') or emit_on(events_maxlen, 'cancelled')))
local bad = expect(stream, 'XLEN', 'stream')
  or (later and expect(delayed, 'ZCARD', 'zset'))
  or (ev_check and expect(events, 'XLEN', 'stream'))
if bad then return bad end
local DDV = nil  -- dedup key -> the job id it holds now (false: free), read once per call
if DD then
  DDV = {}
  for i = 1, n do
    local dd = DD[i]
    if dd then
      local v = rpcall('GET', dd[1])
      if type(v) == 'table' and v.err then
        bad = expect(dd[1], 'GET', 'string')
        if bad then return bad end
      end
      DDV[dd[1]] = v or false
      if dd[2] == 'd' or dd[2] == 'k' then
        bad = expect(delayed, 'ZCARD', 'zset')
        if bad then return bad end
      end
    end
  end
end
-- One EXISTS over the batch: when no record exists yet (a fresh bulk load, the common case)
-- no job needs its own check, except an id that comes again within this call.
local none_exist = rcall('EXISTS', unpack(KEYS, 5, 4 + n)) == 0
local counted = 0  -- jobs already counted in 'enqueued'
if none_exist and max_depth <= 0 then  -- every job is accepted, but an id repeated in it
  bad = expect(stats, 'HINCRBY', 'hash', 'enqueued', n)
  if bad then return bad end
  counted = n
else
  bad = expect(stats, 'HGET', 'hash', 'enqueued')
  if bad then return bad end
  if not none_exist then
    for i = 1, n do
      bad = expect(KEYS[4 + i], 'HGET', 'hash', 's')
      if bad then return bad end
    end
  end
end
-- Dedup (the header's dedup section) before job i is accepted: returns the id and state of the
-- job it is folded into and whether this call was folded into it already (a repeat), or
-- nil and (keep_last) the running job it follows.
local function dedup_pre(dd, b)
  local dkey, mode, J = dd[1], dd[2], ARGV[b]
  local v = DDV[dkey]
  if not v or v == J then return nil end
  local rk = DD.prefix .. v
  local r = rpcall('HMGET', rk, 's', 'c', 'dl', 'dk')
  local st = ''
  if type(r) == 'table' and not r.err and r[1] then st = state_of(r[1]) else r = nil end
  local waiting = st == 'scheduled' or st == 'queued'
  local ok = waiting
  if mode == 't' then
    ok = true
  elseif mode == 'f' then
    ok = waiting or st == 'active' or st == 'retrying'
  elseif mode == 'k' and (st == 'active' or st == 'retrying') then
    return nil, r and r[4] == 'k' .. dkey and v or nil
  end
  if not ok then return nil end
  if r and r[3] == J then return v, st, true end  -- this very call again: the same answer
  if r and (mode == 'd' or mode == 'k') then
    rcall('HSET', rk, 'b', ARGV[b + 2], 'dl', J)  -- the newest payload is kept
    if IX then IX['f' .. b] = v end  -- (its field entries too: the search section)
    if mode == 'd' and st == 'scheduled' then
      local due = math.min(now + dd[4], (tonumber(r[2]) or now) + dd[5])
      lib_cold().wake_if_sooner(delayed, wake, due)
      rcall('ZADD', delayed, due, v)
      rcall('HSET', rk, 'due', due)
    end
    rcall('PEXPIRE', dkey, dd[3])
  elseif r then
    rcall('HSET', rk, 'dl', J)
  end
  emit(events, events_maxlen, v, 'deduplicated', now, J)
  return v, st
end
local folded = 0
local seen, used = {}, {}
local lv = (extra == 5 or extra == 16) and (4 + n + extra - 4) or nil  -- the level keys
local C = lv and lib_cold()  -- (level_stream, level_used)
local handable = 0
for i = 1, n do
  local b = 5 + 10 * (i - 1)
  local jobkey = KEYS[4 + i]
  local prio = lv and ARGV[NA - n + i] or ''
  local to = stream
  if prio ~= '' then to = C.level_stream(KEYS, lv, prio, stream) end
  local dd = DD and DD[i]
  local into, follows, again = nil, nil, false  -- folded: into (a job id), its state
  if dd then into, follows, again = dedup_pre(dd, b) end
  local status, state, result, err, mine
  if into then
    status, state, result = 'deduplicated', into, follows
    if again then folded = folded - 1 end  -- (counted by the call that folded it)
  else
    if follows then  -- keep_last: held until the running job ends (or for the TTL)
      ARGV[b + 6], ARGV[b + 7] = dd[3], '0'
    end
    status, state, result, err, mine = accept(jobkey, to, delayed, events,
      events_maxlen, wake, now, ARGV, b, max_depth > 0 and depth >= max_depth,
      none_exist and not seen[jobkey], ARGV[b + 9], G, G and (GA and ARGV[GA + i] or ''), prio,
      dd and dd[2] .. dd[1])
    if dd and (status == 'queued' or status == 'scheduled') then
      rcall('SET', dd[1], ARGV[b], 'PX', dd[3])
      DDV[dd[1]] = ARGV[b]
      if follows then rcall('HSET', DD.prefix .. follows, 'dn', ARGV[b]) end
    end
  end
  seen[jobkey] = true
  if ho and status == 'queued' and prio == '' and not (G and GA and ARGV[GA + i] ~= '') then
    handable = handable + 1
  end
  if prio ~= '' and not used[prio] and (status == 'queued' or status == 'scheduled') then
    used[prio] = true
    C.level_used(KEYS, lv, prio)
  end
  if status == 'duplicate' then
    duplicates = duplicates + 1
  elseif status == 'deduplicated' then
    folded = folded + 1
  elseif status == 'full' then
    rejected = rejected + 1
  else
    enqueued = enqueued + 1
    if depth >= 0 then depth = depth + 1 end
  end
  out[#out + 1] = status
  if IX and (status == 'queued' or status == 'scheduled') then IX[-i] = true end
  if status == 'deduplicated' then
    out[#out + 1] = state; out[#out + 1] = result
  elseif status == 'duplicate' then
    out[#out + 1] = state; out[#out + 1] = result; out[#out + 1] = err; out[#out + 1] = mine
  end
end
-- The payload of job i to index: an accepted job's own, or a debounce/keep_last fold's new
-- payload under the job it replaced (true: ZADD NX, its other entries stay; the stale field
-- entries of the old payload are dropped by searches, which check field filters on the
-- record's payload).
local function ix_pick(i)
  local b = 5 + 10 * (i - 1)
  if IX[-i] then return ARGV[b] end
  return IX['f' .. b], true
end
if IX then  -- the search section (header): index the jobs this call accepted
  ix_write(IX, now, n, ix_pick)
end
if handable > 0 then
  -- an optimisation only: whatever it meets (an ACL without a command it needs, ...), the
  -- jobs are enqueued, and a job it did not hand over is read from the stream as usual
  -- (a grouped entry at the stream's head goes through its gate: start_entry makes the
  -- group context from gat and gspec when it meets one)
  local c = {dead = KEYS[ho + 2], stats = stats, events = events, stream = stream,
    group = 'streamq', resume = '', now = now, paused = false, started = 0, reclaimed = 0,
    failed = 0, handed = 0, cancelled = 0, fresh = {}, G = G,
    gat = (has_g and not G) and 5 + n or nil, gkeys = KEYS, gspec = ARGV[5 + 10 * n]}
  local ok = pcall(lib_hand().hand_off, c, KEYS[ho], KEYS[ho + 1], handable)
  if not ok then count(stats, 'handoff_errors', 1) end
end
count(stats, 'enqueued', enqueued - counted)
count(stats, 'duplicates', duplicates)
count(stats, 'deduplicated', folded)
count(stats, 'rejected_full', rejected)
if V1_KEPT then lib_cold().v1_restore() end  -- (layout-1 records read: back in layout 1)
return out
