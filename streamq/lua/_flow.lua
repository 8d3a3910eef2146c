-- _flow.lua: the workflow functions (docs/workflows.md), appended by the script registry after
-- _rate.lua. Functions only: no KEYS, no ARGV of their own. They are made by lib_flow()
-- (declared in _lib.lua, whose terminal paths call it) when a script call first meets a job
-- with parents ('pk') or dependencies ('wk'): a plain job's transition makes none of them.
-- A waiting job (state letter 'w') keeps, in its record:
--   'wk' = '<ready stream of its level> <delayed ZSET> <deps SET> <dependency results HASH>
--           <waiting ZSET> <events STREAM> <stats HASH> <dead STREAM> <levels SET>
--           <events spec> <dead ttl s> <dead max length> <wake channel>
--           [<tickets ZSET of its ready stream> <pause flag>]' (13 words, 15 since the
--           release hand-off came (hand, below), written by Python's key builder at enqueue:
--           every name in the parent's own slot)
--   'wd' = '<delay ms> <run at ms>' when it starts later than when its dependencies end.
-- A job that others wait for keeps 'pk' = '<parents SET> <outbox STREAM> <its queue>' (its
-- own slot), written by link.lua. Members of the parents SET: '<policy><index> <parent record
-- key> <parent id>'; of a deps SET: '<policy><index> <child queue> <child id>'; a dependency
-- results field: '<index> <child queue> <child id>' -> '<state letter><result or reason>'.
-- A parent in the child's slot is resolved inline; one in another slot gets a message in
-- the child's outbox ('p' parent record key, 'i' parent id, 'm' deps member, 'v' value),
-- which the relay applies with resolve.lua in the parent's slot, then deletes.
-- A job released into its default-level ready stream with no group, while its queue is not
-- paused, is handed to a worker waiting for work (docs/workflows.md#hand-off), started here as
-- start.lua starts one: to the caller of finish.lua (FLOW_TO, from finish.lua's FLOW_AT)
-- when the job is released into the caller's own stream and the caller takes more, else to an idle
-- worker's ticket (hand_off). That needs 'wk' words 14 (the tickets ZSET of its stream) and
-- 15 (its queue's pause flag), written by the key builder since they came; a record without
-- them is released to its stream only.
-- FLOW_TO: {stream, group, consumer, records (record key prefix), tokens (token prefix), ev,
-- dttl, dmax, left (how many more it takes), rows (10 values per job handed: hand_one's,
-- then its dependency results HASH as HGETALL gives it when it has at most DEPS_INLINE
-- fields, else 0)}.
-- finish.lua sets FLOW_AT (the index of its first hand-off ARGV); FLOW_TO is made from it
-- and from finish.lua's KEYS[1] and ARGV[1..4] (its stream, consumer group, events
-- setting, dead-letter retention and max length) when a release first needs it (flow_to).
local FLOW_AT, FLOW_TO = nil, nil
local DEPS_INLINE = 32
local FLOW = nil
local CASCADE_KEEP_MS = 3600000
function lib_flow()
  if FLOW then return FLOW end
  local resolve, settled, while_dead

  local function words(s)
    local t = {}
    for w in string.gmatch(s, '%S+') do t[#t + 1] = w end
    return t
  end

  local function tag_of(k) return string.match(k, '{[^}]*}') end

  local LETTER = {c = 'completed', f = 'failed', x = 'cancelled', p = 'purged', m = 'missing'}

  -- The caller of finish.lua as a hand-off target (FLOW_TO's header), made when first needed.
  local function flow_to()
    if not FLOW_TO and FLOW_AT then
      FLOW_TO = {stream = KEYS[1], group = ARGV[1], consumer = ARGV[FLOW_AT],
        records = ARGV[FLOW_AT + 1], tokens = ARGV[FLOW_AT + 2], ev = ARGV[2],
        dttl = ARGV[3], dmax = ARGV[4], left = tonumber(ARGV[FLOW_AT + 3]) or 0, rows = {}}
    end
    return FLOW_TO
  end

  -- Hand a job just released to entry e of W[1] to a worker (FLOW_TO's header).
  local function hand(W, e, now)
    if rcall('EXISTS', W[15]) == 1 then return end  -- paused: it waits in its stream
    local T = flow_to()
    local c = {stream = W[1], dead = W[8], stats = W[7], events = W[6], group = 'streamq',
      resume = '', now = now, paused = false, started = 0, reclaimed = 0, failed = 0,
      handed = 0, cancelled = 0, fresh = {}}
    if T and T.left > 0 and T.stream == W[1] then
      c.group, c.consumer, c.events_maxlen, c.dead_ttl, c.dead_maxlen =
        T.group, T.consumer, T.ev, T.dttl, T.dmax
      local row = {lib_hand().hand_one(c, T.records, T.tokens, e)}
      if row[1] then
        T.left = T.left - 1
        -- its dependency results too when they are few (the worker reads them before the
        -- handler: a round trip saved), else 0 (the worker reads them page by page)
        row[10] = 0
        if row[3] == 'run' and rcall('HLEN', W[4]) <= DEPS_INLINE then
          row[10] = rcall('HGETALL', W[4])
        end
        local rows = T.rows
        for j = 1, 10 do rows[#rows + 1] = row[j] end
      end
      count_starts(c)
    elseif W[14] then
      -- its dependency results go in the inbox entry too, when few: '<length>:<bytes>' per
      -- field and value (the worker reads them instead of the results HASH)
      lib_hand().hand_off(c, W[14], nil, 1, e, function()
        if rcall('HLEN', W[4]) > DEPS_INLINE then return nil end
        local t = {}
        for _, v in ipairs(rcall('HGETALL', W[4])) do t[#t + 1] = #v .. ':' .. v end
        return table.concat(t)
      end)
    end
  end

  -- All dependencies ended: the job goes to its level's ready stream (or the delayed ZSET
  -- when it has a start time still ahead), as enqueue.lua puts a new one.
  local function release(prec, pid, W, now)
    rcall('ZREM', W[5], pid)
    rcall('DEL', W[3])
    local r = rcall('HMGET', prec, 'wd', 'p', 'g')
    local due = 0
    if r[1] then
      local d, at = string.match(r[1], '^(%d+) (%d+)$')
      d, at = tonumber(d) or 0, tonumber(at) or 0
      if at > 0 then due = at elseif d > 0 then due = now + d end
    end
    if due > now then
      lib_cold().wake_if_sooner(W[2], W[13], due)
      rcall('ZADD', W[2], due, pid)
      rcall('HSET', prec, 's', 's', 'due', due)
    else
      local e = rcall('XADD', W[1], '*', 'id', pid)
      rcall('HSET', prec, 's', 'q', 'e', enc_entry(e))
      if r[2] then rcall('SADD', W[9], r[2]) end
      emit(W[6], W[10], pid, 'queued', now, 'dependencies ended')
      if W[15] and not r[2] and not r[3] then
        -- an optimisation only: whatever it meets (an ACL without a command it needs, ...),
        -- the job is released, and one not handed over is read from its stream as usual;
        -- one delivered but not started: its worker reads its own entries ('own')
        if not pcall(hand, W, e, now) then
          count(W[7], 'handoff_errors', 1)
          local T = flow_to()
          if T then
            local rows = T.rows
            for _, v in ipairs({'', '', 'own', '', 0, '', 0, 0, 0, 0}) do
              rows[#rows + 1] = v
            end
          end
        end
      end
      return
    end
    emit(W[6], W[10], pid, 'queued', now, 'dependencies ended')
  end

  -- Policy 'death' (a batch's on_death callback, docs/workflows.md#batches-with-callbacks): the first
  -- dependency that was dead-lettered releases the job at once (release drops the rest of its
  -- pending SET, so a second death finds nothing: it fires once); when every dependency ended
  -- and none was dead-lettered, the job is not needed: it ends 'cancelled'.
  local function on_death(prec, pid, W, letter, now)
    if letter == 'f' then
      release(prec, pid, W, now)
      return 3
    end
    if rcall('SCARD', W[3]) > 0 then return 1 end
    lib_cold().end_cancelled(prec, W[6], W[10], pid, now, 'no dependency was dead-lettered')
    count(W[7], 'cancelled', 1)
    return 4
  end

  -- Apply one ended dependency to a waiting job in this slot. A repeat is a no-op (SREM of a
  -- set), so is a parent no longer waiting. Returns 0 no-op, 1 recorded, 2 the parent was
  -- dead-lettered (policy fail), 3 the parent was released, 4 cancelled (policy death).
  function resolve(prec, pid, dmember, value, now)
    local r = rcall('HMGET', prec, 's', 'wk', 'wf')
    if r[1] == 'f' and r[2] and r[3] then return while_dead(prec, pid, dmember, value, now, r) end
    if r[1] ~= 'w' or not r[2] then
      -- a dynamic child (adopt.lua) of a job not waiting (running, or back in the queue):
      -- recorded, so WaitForChildren finds it ended (park); the job itself is not moved
      if r[2] and dmember ~= '' and (r[1] == 'a' or r[1] == 'q' or r[1] == 'r'
          or r[1] == 's') then
        local W = words(r[2])
        if rcall('SREM', W[3], dmember) == 0 then return 0 end
        if ssub(value, 1, 1) == 'c' or ssub(dmember, 1, 1) ~= 'r' then
          rcall('HSET', W[4], ssub(dmember, 2), value)
        end
        if ssub(value, 1, 1) ~= 'c' and ssub(dmember, 1, 1) == 'f' then
          rcall('HSETNX', prec, 'wx', dmember)  -- (park dead-letters it)
        end
        return 1
      end
      return 0
    end
    local W = words(r[2])
    if dmember == '' then  -- (the repair sweep: nothing pending left, yet still waiting)
      if rcall('SCARD', W[3]) > 0 then return 0 end
      release(prec, pid, W, now)
      return 3
    end
    if rcall('SREM', W[3], dmember) == 0 then return 0 end
    local field = ssub(dmember, 2)
    local letter = ssub(value, 1, 1)
    local pol = ssub(dmember, 1, 1)
    -- policy 'remove': a dependency that did not complete leaves as if it never was (no result)
    if letter == 'c' or pol ~= 'r' then rcall('HSET', W[4], field, value) end
    if pol == 'd' then return on_death(prec, pid, W, letter, now) end
    if letter ~= 'c' and pol == 'f' then
      local ref = string.match(field, '^%S+ (.*)$') or field
      rcall('HSET', prec, 'wf', dmember)  -- (the dependency that dead-lettered it: while_dead)
      lib_cold().bury(prec, W[8], W[6], pid, 'dependency ' .. ref .. ' '
        .. (LETTER[letter] or letter), '', 'DependencyFailed', now, W[11], W[12], W[10], false)
      count(W[7], 'failed', 1)
      return 2
    end
    if rcall('SCARD', W[3]) == 0 then
      release(prec, pid, W, now)
      return 3
    end
    return 1
  end

  -- A job dead-lettered by a dependency (policy fail; 'wf' names it) keeps its pending SET and
  -- results as long as its record. A dependency that completes meanwhile is recorded; the one
  -- that dead-lettered it, completing after a re-drive, re-opens it: 'waiting' again, and
  -- released when nothing is pending. A failure meanwhile stays pending (the repair sweep
  -- resolves it once the job waits again). Returns as resolve.
  function while_dead(prec, pid, dmember, value, now, r)
    if ssub(value, 1, 1) ~= 'c' then return 0 end
    local W = words(r[2])
    if dmember == r[3] then
      rcall('HSET', prec, 's', 'w')
      rcall('HDEL', prec, 'wf', 'f', 'reason', 'error')
      rcall('PERSIST', prec)
      rcall('PERSIST', W[3])
      rcall('PERSIST', W[4])
      rcall('ZADD', W[5], now, pid)
      rcall('HSET', W[4], ssub(dmember, 2), value)
      emit(W[6], W[10], pid, 'enqueued', now, 'reopened')
      if rcall('SCARD', W[3]) == 0 then
        release(prec, pid, W, now)
        return 3
      end
      return 1
    end
    if rcall('SREM', W[3], dmember) == 0 then return 0 end
    rcall('HSET', W[4], ssub(dmember, 2), value)
    return 1
  end

  -- A job reached a terminal state (value: '<state letter><result or reason>'): its own
  -- dependency keys go (wk; a dead-lettered job's results stay as long as its record, for a
  -- re-drive) and each job waiting for it is resolved (pk): inline in this slot, else
  -- through this slot's outbox.
  function settled(jobkey, id, value, pk, wk, now)
    local failed = ssub(value, 1, 1) == 'f'
    local t = failed and rcall('PTTL', jobkey) or -2  -- (-1: kept as long as the record)
    if wk then
      local W = words(wk)
      rcall('ZREM', W[5], id)
      if t > 0 then rcall('PEXPIRE', W[3], t); rcall('PEXPIRE', W[4], t)
      elseif t == -2 and ssub(value, 1, 1) == 'x' then
        -- cancelled: the pending SET stays for the caller's cascade (flow_cancel.py), which
        -- deletes it once walked; an hour at most
        rcall('PEXPIRE', W[3], CASCADE_KEEP_MS)
        rcall('DEL', W[4])
      elseif t == -2 then rcall('DEL', W[3], W[4]) end
    end
    if pk then
      local P = words(pk)
      local mine = tag_of(P[1])
      local kept = 0
      for _, m in ipairs(rcall('SMEMBERS', P[1])) do
        local pi, prec, pid = string.match(m, '^(%S+) (%S+) (%S+)$')
        if failed and t ~= -2 and pi and ssub(pi, 1, 1) == 'f' then
          kept = kept + 1  -- (a re-drive that completes re-opens that parent: while_dead)
        else
          rcall('SREM', P[1], m)
        end
        if pi then
          local dmember = pi .. ' ' .. P[3] .. ' ' .. id
          if tag_of(prec) == mine then
            resolve(prec, pid, dmember, value, now)
          else
            rcall('XADD', P[2], '*', 'p', prec, 'i', pid, 'm', dmember, 'v', value)
          end
        end
      end
      if kept == 0 then
        rcall('DEL', P[1])
        if rcall('EXISTS', jobkey) == 1 then rcall('HDEL', jobkey, 'pk') end
      elseif t > 0 then
        rcall('PEXPIRE', P[1], t)
      end
    end
  end

  -- A running job raised WaitForChildren (finish.lua's 'children', fenced there): the attempt
  -- is given back; a child that ended badly under policy 'fail' ('wx', resolve) dead-letters
  -- it as a waiting job's would be; a child still pending makes it 'waiting' (its last child
  -- releases it); none pending puts it back in its ready stream now. Returns the state the
  -- caller reports: 'failed' or 'retrying' (waiting or queued again).
  local function park(jobkey, id, now, wk)
    if (tonumber(rcall('HGET', jobkey, 'n')) or 0) > 0 then rcall('HINCRBY', jobkey, 'n', -1) end
    local W = words(wk)
    local wx = rcall('HGET', jobkey, 'wx')
    if wx then
      local field = ssub(wx, 2)
      local v = rcall('HGET', W[4], field) or 'm'
      local ref = string.match(field, '^%S+ (.*)$') or field
      rcall('HSET', jobkey, 'wf', wx)
      rcall('HDEL', jobkey, 'wx')
      lib_cold().bury(jobkey, W[8], W[6], id, 'dependency ' .. ref .. ' '
        .. (LETTER[ssub(v, 1, 1)] or 'failed'), '', 'DependencyFailed', now, W[11], W[12],
        W[10], false)
      return 'failed'
    end
    if rcall('SCARD', W[3]) > 0 then
      rcall('HSET', jobkey, 's', 'w')
      rcall('ZADD', W[5], now, id)
      emit(W[6], W[10], id, 'waiting', now, 'children')
    else
      release(jobkey, id, W, now)
    end
    return 'retrying'
  end

  -- A dead-lettered job is re-driven: the keys settled gave its record's TTL live on.
  local function redriven(jobkey)
    local f = rcall('HMGET', jobkey, 'pk', 'wk')
    if f[1] then rcall('PERSIST', words(f[1])[1]) end
    if f[2] then
      local W = words(f[2])
      rcall('PERSIST', W[4])
      rcall('DEL', W[3])
      rcall('HDEL', jobkey, 'wf')
    end
  end

  FLOW = {words = words, tag_of = tag_of, release = release, resolve = resolve, park = park,
    settled = settled, while_dead = while_dead, redriven = redriven}
  return FLOW
end
