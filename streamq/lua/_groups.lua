-- _groups.lua: the group functions (docs/fairness.md#groups), appended by the script registry
-- right after _lib.lua and before every script. Functions only: no KEYS, no ARGV of its own.
-- They are made by lib_groups() (declared in _lib.lua, so that its accept and start_entry can
-- call it) when a script call first needs one, and returned in a table: a call that meets
-- no group makes none of them (as _lib.lua's lib_cold). The script registry gives every
-- script that names one a local of that name first (scripts.py cold_first); _lib.lua,
-- enqueue.lua and finish.lua call lib_groups().<name>.
-- A grouped job (record field 'g') holds a slot of its group from admission (XADD to the
-- stream) until it leaves the stream for good (completed, retrying, dead, cancelled), or is
-- handed back to its group's wait list (group paused, over its limit, rate not yet due).
-- Slots are members '<group> <job id>' of one in-flight ZSET per shard (not a counter: freeing
-- a slot twice is harmless, and the reconcile step checks each member against its record).
-- A group with no free slot keeps its ready jobs in the wait ZSET ('<group> <seq><p><id>',
-- FIFO by seq; p its priority digit), so the stream holds at most <limit> jobs of each group: groups are served
-- round robin by the stream's own order. A waiting job's record is 'queued' with no 'e' and
-- 'gw' = its seq and priority; a job admitted from the wait list by a script that cannot name its record
-- (the record key is not in KEYS) carries 'w' = that seq in its stream entry, and the first
-- script that meets the entry writes 'e' (g_adopt).
local GROUPS = nil
function lib_groups()
  if GROUPS then return GROUPS end
  local SEQ0 = 5000000000000000  -- wait seqs: SEQ0 + n at the tail; at the head (a job handed
  -- back) <ms now><3 digits of a counter>, below SEQ0 for ages and rising with time, so jobs
  -- handed back go ahead of the never-admitted ones, in the order they were handed back
  local gctx, g_conf, g_count, g_held, g_tidy, g_fill, g_push, g_enter, g_release, g_unwait,
    g_gate, g_adopt

  -- A group's limit, paused flag and rate (n, period ms; n = 0: none): overrides, else defaults.
  function g_conf(G, g)
    local c = rcall('HMGET', G.cfg, 'l:' .. g, 'p:' .. g, 'r:' .. g)
    local rn, rp = G.rn, G.rp
    if c[3] then
      local a, b = string.match(c[3], '^(%d+) (%d+)$')
      rn, rp = tonumber(a) or 0, tonumber(b) or 0
    end
    return tonumber(c[1]) or G.limit, c[2] and true or false, rn, rp
  end

  function g_count(set, g)
    return rcall('ZLEXCOUNT', set, '[' .. g .. ' ', '(' .. g .. '!')
  end

  -- Whether the group's rate holds admissions back now: parked until a time still ahead, or
  -- its limiter's next conformance time (TAT) is ahead (then it is parked until then).
  function g_held(G, g, now, rn)
    local pk = rcall('ZSCORE', G.parked, g)
    if pk and tonumber(pk) > now then return true end
    if rn > 0 then
      local tat = tonumber(rcall('ZSCORE', G.tat, g))
      if tat and tat > now then
        rcall('ZADD', G.parked, tat, g)
        return true
      end
    end
    return false
  end

  -- Forget a group that has nothing waiting and nothing in flight (its limiter state goes
  -- when it is no longer ahead of the clock: unpark.lua sweeps it).
  function g_tidy(G, g)
    if g_count(G.fl, g) == 0 and g_count(G.wait, g) == 0 then
      rcall('ZREM', G.idx, g)
    end
  end

  -- Admit waiting jobs of group g, head first, while it has free slots and is neither paused
  -- nor held by its rate: at most 1,000 per call, and 1 for a rate-limited group (its starts
  -- are spaced anyway; more would only be handed back). Returns how many were admitted.
  function g_fill(G, g, stream, now)
    local limit, paused, rn = g_conf(G, g)
    if paused or g_held(G, g, now, rn) then return 0 end
    local room = limit - g_count(G.fl, g)
    if rn > 0 and room > 1 then room = 1 end
    if room > 1000 then room = 1000 end
    if room <= 0 then return 0 end
    local heads = rcall('ZRANGE', G.wait, '[' .. g .. ' ', '(' .. g .. '!', 'BYLEX',
      'LIMIT', 0, room)
    for _, m in ipairs(heads) do
      rcall('ZREM', G.wait, m)
      -- '<g> <seq, 16 digits><priority, 1 digit><id>': the job goes to its level's stream
      local w, id = ssub(m, #g + 2, #g + 18), ssub(m, #g + 19)
      local to = stream
      if G.levels then to = G.levels[(tonumber(ssub(w, 17)) or 2) + 1] or stream end
      rcall('XADD', to, '*', 'id', id, 'w', w)
      rcall('ZADD', G.fl, 0, g .. ' ' .. id)
    end
    return #heads
  end

  -- Put a ready job on its group's wait list (tail, or head for a job handed back): the record
  -- becomes 'queued' without a stream entry, 'gw' = its wait token (the 16-digit seq and its
  -- priority digit, record 'p', 2 when absent), its creation time kept.
  function g_push(G, g, id, jobkey, head)
    local n = rcall('HINCRBY', G.cfg, head and ' h' or ' t', 1)
    local old = rcall('HMGET', jobkey, 'e', 'c', 'p')
    local seq = string.format('%016d', head and (now_ms() * 1000 + n % 1000) or (SEQ0 + n))
      .. (old[3] or '2')
    rcall('ZADD', G.wait, 0, g .. ' ' .. seq .. id)
    rcall('ZADD', G.idx, 0, g)
    if old[1] and not old[2] then rcall('HSET', jobkey, 'c', entry_ms(old[1])) end
    rcall('HSET', jobkey, 's', 'q', 'gw', seq)
    if old[1] then rcall('HDEL', jobkey, 'e') end
  end

  -- A ready grouped job enters its group (enqueue, promotion, re-drive): admitted to the
  -- stream when the group has a free slot, is open and has nobody waiting ahead (FIFO);
  -- else it waits. Returns the stream entry id when admitted (the caller points the record
  -- at it), else nil.
  function g_enter(G, g, id, jobkey, stream, now)
    local limit, paused, rn = g_conf(G, g)
    local open = not paused and not g_held(G, g, now, rn) and g_count(G.fl, g) < limit
    if open and g_count(G.wait, g) == 0 then
      rcall('ZADD', G.idx, 0, g)
      rcall('ZADD', G.fl, 0, g .. ' ' .. id)
      rcall('HDEL', jobkey, 'gw')
      return rcall('XADD', stream, '*', 'id', id)
    end
    g_push(G, g, id, jobkey, false)  -- (it lists the group)
    if open then g_fill(G, g, stream, now) end  -- others wait ahead of it: the head goes first
    return nil
  end

  -- A grouped job leaves its slot (settled, cancelled, dead-lettered): free it, admit the next
  -- waiting job(s). Safe to repeat: a slot already free is not freed again.
  function g_release(G, g, id, stream, now)
    if rcall('ZREM', G.fl, g .. ' ' .. id) == 1 and g_fill(G, g, stream, now) > 0 then
      return  -- (it admitted a job: not empty)
    end
    g_tidy(G, g)
  end

  -- A waiting job leaves its group's wait list (cancel, purge). Returns whether it was there.
  function g_unwait(G, g, id, seq)
    local gone = rcall('ZREM', G.wait, g .. ' ' .. seq .. id) == 1
    g_tidy(G, g)
    return gone
  end

  -- Whether a grouped job may start now (start.lua): nil, or why not. Its slot is asserted
  -- (ZADD: a member lost by corruption is restored, and then counts against the limit). A
  -- start is refused while the group is paused, while its in-flight count is over its limit
  -- (the limit was lowered: unstarted jobs are handed back until it holds), or while its rate
  -- limiter (GCRA, no burst: one start per period/n) is not yet conformant (the group is then
  -- parked until it is). A start that goes ahead moves the limiter on.
  function g_gate(G, g, id, now)
    local limit, paused, rn, rp = g_conf(G, g)
    rcall('ZADD', G.fl, 0, g .. ' ' .. id)
    if paused then return 'group paused' end
    local pk = rcall('ZSCORE', G.parked, g)  -- held back (RateLimited(group=True), rate)
    if pk and tonumber(pk) > now then return 'group rate' end
    if g_count(G.fl, g) > limit then return 'group over its limit' end
    if rn > 0 and rp > 0 then
      local tat = tonumber(rcall('ZSCORE', G.tat, g)) or 0
      if tat > now then
        rcall('ZADD', G.parked, tat, g)
        return 'group rate'
      end
      rcall('ZADD', G.tat, math.max(tat, now) + rp / rn, g)
    end
    return nil
  end

  -- The group context: the keys of Keys.group_keys from keys[at] (the six group keys, then the
  -- ready streams of priorities 0..4), and QueueConfig.group_arg '<default limit> <default rate
  -- n> <rate period ms>'. nil when the caller passed no keys.
  function gctx(keys, at, spec)
    if not keys[at] or not keys[at + 5] then return nil end
    local l, rn, rp = string.match(spec or '', '^(%d+) (%d+) (%d+)$')
    local levels = nil
    if keys[at + 10] then levels = {keys[at + 6], keys[at + 7], keys[at + 8], keys[at + 9],
                                    keys[at + 10]} end
    return {wait = keys[at], fl = keys[at + 1], idx = keys[at + 2], cfg = keys[at + 3],
            tat = keys[at + 4], parked = keys[at + 5], levels = levels, limit = tonumber(l) or 1,
            rn = tonumber(rn) or 0, rp = tonumber(rp) or 0}
  end

  -- A record admitted from its wait list meets its stream entry: when the entry carries the
  -- record's 'gw', the record takes the entry as its own ('e'). Returns whether it did.
  function g_adopt(jobkey, stream, entry, gw)
    local x = rcall('XRANGE', stream, entry, entry)
    if not x[1] then return false end
    local f = x[1][2]
    for i = 1, #f - 1, 2 do
      if f[i] == 'w' then
        if f[i + 1] ~= gw then return false end
        rcall('HSET', jobkey, 'e', enc_entry(entry))
        rcall('HDEL', jobkey, 'gw')
        return true
      end
    end
    return false
  end
  GROUPS = {gctx = gctx, g_conf = g_conf, g_count = g_count, g_held = g_held, g_tidy = g_tidy,
    g_fill = g_fill, g_push = g_push, g_enter = g_enter, g_release = g_release,
    g_unwait = g_unwait, g_gate = g_gate, g_adopt = g_adopt}
  return GROUPS
end
