-- adopt.lua: a running job takes children it enqueued (docs/workflows.md#dynamic-children):
-- their edges go into its pending SET, and its record gets 'wk' (the keys of its release, as
-- wait.lua writes for a waiting job), so that each child's end resolves it (_flow.lua's
-- resolve: recorded while it runs; released or dead-lettered once it waits). The job then
-- raises WaitForChildren (finish.lua's 'children' outcome: it waits only if a child is still
-- pending then).
-- Safe to repeat: the same call id answers the same first index ('wa' in the record, the last
-- call's '<call id> <first index>') and writes nothing new (SADD of the same members).
-- A waiting job takes more dependencies the same way when it is a batch's callback
-- (docs/workflows.md#batches): ARGV[2] is then '@<the batch's open member>', and the edges are
-- added only while that member is still pending in its SET (the batch not closed: batch_close.lua
-- resolves it, in this slot, in one script with every callback). '@@<open member>': called from
-- a running job of the batch, which every callback still waits for: added while the callback
-- waits, closed or not.
-- KEYS[1]   the job record HASH
-- KEYS[2]   its pending SET (Keys.deps)
-- KEYS[3]   its dependency results HASH (Keys.dep_results)
-- ARGV[1]   call id (the caller's, the same on a repeat)
-- ARGV[2]   'wk' (flow.wk_of: 13 words, every name in this slot), or '@<open member>' (a
--           batch's waiting callback)
-- ARGV[3..] one per child: '<policy letter> <child queue> <child id>'
-- Returns {'ok', first index} (child i gets first index + i - 1) or {'not_running', state}
--           (a job not 'active': it cannot take children) or {'grouped', ''} (a job of a
--           group: not supported) or {'closed', ''} (a batch's callback: the batch is closed).
local jobkey, deps, dres = KEYS[1], KEYS[2], KEYS[3]
local call, wk = ARGV[1], ARGV[2]
local f = rcall('HMGET', jobkey, 's', 'wa', 'wn', 'g')
local batch = ssub(wk, 1, 1) == '@'
if batch and f[1] == 'w' then
  local inside = ssub(wk, 2, 2) == '@'
  if not inside and rcall('SISMEMBER', deps, ssub(wk, 2)) == 0 then
    if f[2] and string.match(f[2], '^(%S+) ') == call then  -- (a repeat after the close)
      return {'ok', tonumber(string.match(f[2], ' (%d+)$'))}
    end
    return {'closed', ''}
  end
elseif f[1] ~= 'a' then return {'not_running', f[1] and state_of(f[1]) or ''} end
if f[4] then return {'grouped', ''} end
if f[2] then
  local c, b = string.match(f[2], '^(%S+) (%d+)$')
  if c == call then return {'ok', tonumber(b)} end
end
local n = #ARGV - 2
local base = tonumber(f[3])
if not base then base = rcall('HLEN', dres) + rcall('SCARD', deps) end
rcall('HSET', jobkey, 'wn', base + n, 'wa', call .. ' ' .. base)
if not batch then rcall('HSETNX', jobkey, 'wk', wk) end
for i = 1, n do
  local pol, rest = string.match(ARGV[2 + i], '^(%S+) (.*)$')
  rcall('SADD', deps, pol .. (base + i - 1) .. ' ' .. rest)
end
return {'ok', base}
