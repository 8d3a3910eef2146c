-- adopt.lua: a running job takes children it enqueued (docs/workflows.md#dynamic-children):
-- their edges go into its pending SET, and its record gets 'wk' (the keys of its release, as
-- wait.lua writes for a waiting job), so that each child's end resolves it (_flow.lua's
-- resolve: recorded while it runs; released or dead-lettered once it waits). The job then
-- raises WaitForChildren (finish.lua's 'children' outcome: it waits only if a child is still
-- pending then).
-- Safe to repeat: the same call id answers the same first index and writes nothing new ('wa' in
-- the record: the last WA_KEEP calls' '<call id> <first index>' pairs, so a repeat of an
-- earlier call than the last, e.g. by a producer that restarted, is recognised too).
-- A waiting job takes more dependencies the same way when it is a batch's callback
-- (docs/workflows.md#batches-with-callbacks): ARGV[2] is then '@<the batch's open member>', and the edges are
-- added only while that member is still pending in its SET (the batch not closed: batch_close.lua
-- resolves it, in this slot, in one script with every callback). '@@<open member>': called from
-- a running job of the batch, which every callback still waits for: added while the callback
-- waits, closed or not.
-- KEYS[1]   the job record HASH
-- KEYS[2]   its pending SET (Keys.deps)
-- KEYS[3]   its dependency results HASH (Keys.dep_results)
-- ARGV[1]   call id (the caller's, the same on a repeat)
-- ARGV[2]   'wk' (flow.wk_of: 13 or 15 words, every name in this slot), or '@<open member>' (a
--           batch's waiting callback)
-- ARGV[3..] one per child: '<policy letter> <child queue> <child id>'
-- Returns {'ok', first index} (child i gets first index + i - 1) or {'not_running', state}
--           (a job not 'active': it cannot take children) or {'grouped', ''} (a job of a
--           group: not supported) or {'closed', ''} (a batch's callback: the batch is closed).
local WA_KEEP = 32
local jobkey, deps, dres = KEYS[1], KEYS[2], KEYS[3]
local call, wk = ARGV[1], ARGV[2]
local f = rcall('HMGET', jobkey, 's', 'wa', 'wn', 'g')
local kept = {}  -- the last calls' '<call id> <first index>' pairs ('wa'), oldest first
local function earlier()  -- this call's first index when it is a repeat, else nil
  for c, b in string.gmatch(f[2] or '', '(%S+) (%d+)') do
    if c == call then return tonumber(b) end
    kept[#kept + 1] = c .. ' ' .. b
  end
  return nil
end
local batch = ssub(wk, 1, 1) == '@'
if batch and f[1] == 'w' then
  local inside = ssub(wk, 2, 2) == '@'
  if not inside and rcall('SISMEMBER', deps, ssub(wk, 2)) == 0 then
    local b = earlier()  -- (a repeat after the close)
    if b then return {'ok', b} end
    return {'closed', ''}
  end
elseif f[1] ~= 'a' then return {'not_running', f[1] and state_of(f[1]) or ''} end
if f[4] then return {'grouped', ''} end
local again = earlier()
if again then return {'ok', again} end
while #kept >= WA_KEEP do table.remove(kept, 1) end
kept[#kept + 1] = call
local n = #ARGV - 2
local base = tonumber(f[3])
if not base then base = rcall('HLEN', dres) + rcall('SCARD', deps) end
kept[#kept] = call .. ' ' .. base
rcall('HSET', jobkey, 'wn', base + n, 'wa', table.concat(kept, ' '))
if not batch then
  rcall('HSETNX', jobkey, 'wk', wk)
  rcall('HDEL', jobkey, 'z')  -- (finish.lua reads 'wk' again: _lib.lua's start_entry)
end
for i = 1, n do
  local pol, rest = string.match(ARGV[2 + i], '^(%S+) (.*)$')
  rcall('SADD', deps, pol .. (base + i - 1) .. ' ' .. rest)
end
return {'ok', base}
