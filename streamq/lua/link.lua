-- link.lua: register one dependency edge in the dependency's (the child's) slot
-- (docs/workflows.md). A child not yet ended gets the parent in its parents SET and 'pk' in
-- its record, so its own terminal transition resolves the parent (_flow.lua's settled). A
-- child already ended (or missing: expired, purged, never enqueued) cannot do that any more:
-- the resolve message goes into this slot's outbox now, and the caller (the producer, the
-- repair sweep) or else the relay applies it in the parent's slot (resolve.lua).
-- Safe to repeat: SADD of a member, HSET of the same 'pk'; a repeat on an ended child writes
-- one more message, whose resolve is a no-op (SREM).
-- KEYS[1]   the child's job record HASH
-- KEYS[2]   the child's parents SET (Keys.parents)
-- KEYS[3]   the child's shard's outbox STREAM (Keys.outbox)
-- ARGV[1]   the child's job id
-- ARGV[2]   'pk': '<parents SET> <outbox STREAM> <the child's queue>'
-- ARGV[3]   the parents SET member: '<policy><index> <parent record key> <parent id>'
-- Returns {'linked', state} or {'ended', outbox entry id, state ('missing' for none)}.
local jobkey, parents, outbox = KEYS[1], KEYS[2], KEYS[3]
local id, pk, member = ARGV[1], ARGV[2], ARGV[3]
local r = rec(jobkey, false, 's', 'r', 'reason')
local state = r[1]
local value
if not state then value = 'm'
elseif state == 'completed' then value = 'c' .. (r[2] or '')
elseif state == 'failed' then value = 'f' .. (r[3] or '')
elseif state == 'cancelled' then value = 'x'
else
  rcall('SADD', parents, member)
  rcall('HSET', jobkey, 'pk', pk)
  rcall('HDEL', jobkey, 'z')  -- (finish.lua reads 'pk' again: _lib.lua's start_entry)
  v1_restore()
  return {'linked', state}
end
local pi, prec, pid = string.match(member, '^(%S+) (%S+) (%S+)$')
local cq = string.match(pk, '(%S+)$')
local e = rcall('XADD', outbox, '*', 'p', prec, 'i', pid, 'm', pi .. ' ' .. cq .. ' ' .. id,
  'v', value)
v1_restore()
return {'ended', e, state or 'missing'}
