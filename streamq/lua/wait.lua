-- wait.lua: accept one job that waits for others (its dependencies) before it is ready
-- (docs/workflows.md). Its record is written in state 'waiting' with its pending
-- dependencies as a SET (never a counter: a repeated resolve is a no-op) and an entry in the
-- shard's waiting index (the repair sweep's, no SCAN). The dependencies are linked after it
-- (link.lua, in each dependency's slot): a producer that dies in between leaves a waiting job
-- that the repair sweep links or resolves.
-- Safe to repeat: an existing record answers 'duplicate' with its state and writes nothing
-- (mine = 1 when it carries this very body and options: the caller's own earlier try).
-- KEYS[1]   job record HASH
-- KEYS[2]   the job's dependencies SET (Keys.deps)
-- KEYS[3]   the shard's waiting ZSET (Keys.waiting)
-- KEYS[4]   events STREAM
-- KEYS[5]   stats HASH
-- ARGV[1]   job id
-- ARGV[2]   options (serialised; '' = all default)
-- ARGV[3]   body ('<type> <serialised payload>')
-- ARGV[4]   max_attempts (0 = the handler decides)
-- ARGV[5]   result TTL s
-- ARGV[6]   deadline ms (0 = none; negative: that many ms after the server's now)
-- ARGV[7]   delay ms once the dependencies ended (0 = none)
-- ARGV[8]   run at ms (0 = none)
-- ARGV[9]   notify channel ('' = none)
-- ARGV[10]  priority ('' = the default)
-- ARGV[11]  'wk': the key names and settings its release needs (_flow.lua's header)
-- ARGV[12]  events: max length and kinds (_lib.lua's emit)
-- ARGV[13]  the shard count the producer routed the job by ('' = none): when KEYS[5] has
--           'lay' (a reshard froze the shard: enqueue.lua's header) and it differs, a new job
--           is refused: the call writes nothing and answers the error 'STREAMQ_LAYOUT <lay>'
--           (an existing record is answered 'duplicate' as always: that writes nothing, and
--           lets a batch opened before a reshard find its callbacks in its own shard)
-- ARGV[14..] the dependencies: '<policy><index> <queue> <job id>' each
-- KEYS[6..5+S] (S >= 0; docs/search.md, QueueConfig.search) the shard's search index ZSETs
--           the job goes in; then the last S + 1 ARGV (after the dependencies) are the
--           retention ms and each index's spec '<A|L|T> 1' (_lib.lua's ix_write). Written
--           only with a new record: a repeat writes nothing new.
-- Returns {'waiting'} or {'duplicate', state, result, error, mine}.
local jobkey, deps, waiting, events, stats = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id = ARGV[1]
local S = #KEYS - 5
local NA = #ARGV - (S > 0 and S + 1 or 0)  -- (the last dependency)
if rcall('EXISTS', jobkey) == 1 then
  local r = rec(jobkey, false, 's', 'r', 'error', 'b', 'op')
  local mine = 0
  if r[4] == ARGV[3] and (r[5] or '') == ARGV[2] then mine = 1 end
  v1_restore()
  return {'duplicate', r[1] or '', r[2] or '', r[3] or '', mine}
end
if ARGV[13] ~= '' then
  local lay = rpcall('HGET', stats, 'lay')
  if type(lay) == 'string' and lay ~= ARGV[13] then
    v1_restore()  -- (no record read on this path: nothing to write back)
    return redis.error_reply('STREAMQ_LAYOUT ' .. lay)
  end
end
local now = now_ms()
local set = {'s', 'w', 'b', ARGV[3], 'c', now, 'wk', ARGV[11]}
local function add(k, v) set[#set + 1] = k; set[#set + 1] = v end
if ARGV[2] ~= '' then add('op', ARGV[2]) end
if ARGV[5] ~= DEFAULT_TTL then add('x', ARGV[5]) end
if ARGV[4] ~= '0' then add('max_attempts', ARGV[4]) end
local deadline = tonumber(ARGV[6]) or 0
if deadline < 0 then deadline = now - deadline end
if deadline > 0 then add('deadline', deadline) end
if ARGV[9] ~= '' then add('notify', ARGV[9]) end
if ARGV[10] ~= '' then add('p', ARGV[10]) end
if ARGV[7] ~= '0' or ARGV[8] ~= '0' then add('wd', ARGV[7] .. ' ' .. ARGV[8]) end
rcall('HSET', jobkey, unpack(set))
for i = 14, NA, 1000 do  -- (unpack is capped at ~8,000 values: SADD in slices)
  rcall('SADD', deps, unpack(ARGV, i, math.min(i + 999, NA)))
end
rcall('ZADD', waiting, now, id)
if S > 0 then
  local IX = {ret = tonumber(ARGV[NA + 1])}
  for j = 1, S do IX[j] = {KEYS[5 + j], ARGV[NA + 1 + j]} end
  ix_write(IX, now, 1, function() return id end)
end
emit(events, ARGV[12], id, 'enqueued', now, 'waiting')
count(stats, 'enqueued', 1)
v1_restore()  -- (no record read on this path: nothing to write back)
return {'waiting'}
