-- _lib.lua: shared helpers, prepended by the script registry to every other script.
-- It defines functions only; it reads no KEYS and no ARGV of its own.
-- Conventions used by all scripts: times are milliseconds from the server's TIME;
-- an events/dead max length of 0 disables that stream; every key arrives in KEYS.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- Lifecycle event. The entry id carries the server time (ms); every entry has the same
-- three fields, so the stream stores field names once per node.
local function emit(events, maxlen, job_id, ev, now, detail)
  if maxlen ~= '0' then
    redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*', 'job', job_id, 'ev', ev,
      'd', detail or '')
  end
end

local function count(stats, field, n)
  if n ~= 0 then redis.call('HINCRBY', stats, field, n) end
end

local function ack_del(stream, group, entry)
  if entry and entry ~= '' then
    redis.call('XACK', stream, group, entry)
    redis.call('XDEL', stream, entry)
  end
end

-- Tell a waiter (the job's 'notify' channel, if any): '<state> <job id>', so one channel can
-- serve every waiter of a producer (job ids have no spaces).
local function notify(channel, state, job_id)
  if channel and channel ~= '' then
    redis.call('PUBLISH', channel, state .. ' ' .. job_id)
  end
end

-- Wake sleepers (scheduler, promoters) when a job becomes due sooner than anything else.
local function wake_if_sooner(delayed, channel, due)
  if channel == '' then return end
  local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  if first[2] == nil or tonumber(first[2]) >= due then
    redis.call('PUBLISH', channel, due)
  end
end

-- Keep a short history of failed attempts in the record ('errors': JSON list, newest last,
-- at most 10), so an operator sees every attempt's error type without reading the events.
local function remember_error(jobkey, attempt, etype, now)
  local raw = redis.call('HGET', jobkey, 'errors')
  local list = {}
  if raw then
    local ok, decoded = pcall(cjson.decode, raw)
    if ok and type(decoded) == 'table' then list = decoded end
  end
  list[#list + 1] = {attempt = tonumber(attempt) or 0, type = etype, t = now}
  while #list > 10 do table.remove(list, 1) end
  redis.call('HSET', jobkey, 'errors', cjson.encode(list))
end

-- Dead-letter a job: terminal 'failed' state, dead index entry, retention TTL, waiters told.
-- The caller counts it in the stats HASH ('failed'). clear_token: anyone but the lease holder
-- settling its own attempt buries the job, so the old lease ends here (a worker still running
-- it gets 'lost' from finish.lua, never another's outcome).
local function bury(jobkey, dead, events, job_id, reason, err, etype, now,
                    dead_ttl, dead_maxlen, events_maxlen, clear_token)
  if err and err ~= '' then
    redis.call('HSET', jobkey, 'state', 'failed', 'finished', now, 'reason', reason,
      'error', err, 'entry', '')
  else
    redis.call('HSET', jobkey, 'state', 'failed', 'finished', now, 'reason', reason, 'entry', '')
  end
  if clear_token then redis.call('HSET', jobkey, 'token', '') end
  local r = redis.call('HMGET', jobkey, 'type', 'notify')
  local jtype = r[1] or ''
  if tonumber(dead_maxlen) > 0 then
    redis.call('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', 'job', job_id,
      'reason', reason, 'etype', etype or '', 'type', jtype, 't', now)
  end
  if tonumber(dead_ttl) > 0 and redis.call('EXISTS', jobkey) == 1 then
    redis.call('EXPIRE', jobkey, dead_ttl)
  end
  emit(events, events_maxlen, job_id, 'failed', now, reason)
  notify(r[2], 'failed', job_id)
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
    redis.call('HSET', jobkey, 'w', tag)
    return 1
  end
  if so == co then return 1 end
  return 0
end

-- Accept one job (enqueue.lua, fire.lua). The job's 9 arguments start at args[b]: id, type,
-- envelope, max_attempts (0 = handler decides), result_ttl_s, deadline_ms (0 = none; negative
-- = that many ms after now), delay_ms, run_at_ms (0 = none), notify channel ('' = none).
-- tag: the caller's writer tag (nil or '' = none; see writer_mine), kept in the record as
-- 'w' when the job is created.
-- Returns status (queued|scheduled|duplicate|full), state, result, error, mine (1 when an
-- existing duplicate was written by this very call or row: by writer tag when one is given,
-- else when it carries this very envelope). The caller counts stats. known_new: the caller
-- already knows the record does not exist (enqueue.lua's batch check).
local function accept(jobkey, stream, delayed, events, events_maxlen, wake, now, args, b, full,
                      known_new, tag)
  local id, jtype, env = args[b], args[b + 1], args[b + 2]
  if tag == '' then tag = nil end
  if not known_new and redis.call('EXISTS', jobkey) == 1 then
    local existing = redis.call('HMGET', jobkey, 'state', 'result', 'error', 'env', 'w')
    local mine = 0
    if tag then
      mine = writer_mine(jobkey, existing[5], tag)
    elseif existing[4] == env then
      mine = 1
    end
    return 'duplicate', existing[1] or '', existing[2] or '', existing[3] or '', mine
  end
  if full then return 'full', '', '', '', 0 end
  local delay_ms, run_at = tonumber(args[b + 6]), tonumber(args[b + 7])
  local due = 0
  local deadline = tonumber(args[b + 5])
  if deadline < 0 then deadline = now - deadline end
  if run_at > 0 then due = run_at elseif delay_ms > 0 then due = now + delay_ms end
  local status
  -- the fields every job has go in one HSET with literal arguments (no table, no unpack:
  -- the bulk path's cost), the optional ones in a second HSET only when there are any
  if due > now then
    wake_if_sooner(delayed, wake, due)
    redis.call('ZADD', delayed, due, id)
    status = 'scheduled'
    if tag then
      redis.call('HSET', jobkey, 'type', jtype, 'env', env, 'result_ttl', args[b + 4],
        'created', now, 'due', due, 'state', status, 'w', tag)
    else
      redis.call('HSET', jobkey, 'type', jtype, 'env', env, 'result_ttl', args[b + 4],
        'created', now, 'due', due, 'state', status)
    end
  else
    local entry = redis.call('XADD', stream, '*', 'id', id)
    status = 'queued'
    if tag then
      redis.call('HSET', jobkey, 'type', jtype, 'env', env, 'result_ttl', args[b + 4],
        'created', now, 'entry', entry, 'enqueued', now, 'state', status, 'w', tag)
    else
      redis.call('HSET', jobkey, 'type', jtype, 'env', env, 'result_ttl', args[b + 4],
        'created', now, 'entry', entry, 'enqueued', now, 'state', status)
    end
  end
  local extra = nil
  if args[b + 3] ~= '0' then extra = {'max_attempts', args[b + 3]} end
  if deadline > 0 then
    extra = extra or {}
    extra[#extra + 1] = 'deadline'; extra[#extra + 1] = deadline
  end
  if args[b + 8] ~= '' then
    extra = extra or {}
    extra[#extra + 1] = 'notify'; extra[#extra + 1] = args[b + 8]
  end
  if extra then redis.call('HSET', jobkey, unpack(extra)) end
  emit(events, events_maxlen, id, 'enqueued', now, status)
  return status, status, '', '', 0
end
