-- link_many.lua: link.lua's work for many dependency edges whose children share one slot, in
-- one call (docs/workflows.md#costs): a large fan-in's producer links its edges a few hundred
-- per call instead of one script call each. Per edge, in the child's slot: a child not yet
-- ended gets the parent in its parents SET and 'pk' in its record (its own terminal
-- transition resolves the parent: _flow.lua's settled); a child already ended (or missing)
-- is resolved now: inline when its parent is in this slot too (resolve, as settled does:
-- no outbox message), else through this slot's outbox as link.lua writes it, and the
-- message's value comes back in the answer so that the caller applies it (resolve_many.lua)
-- without reading the outbox again; the relay applies what the caller did not.
-- Safe to repeat: SADD of a member, HSET of the same 'pk'; an inline resolve is a no-op the
-- second time (SREM); a repeat on an ended child of another slot writes one more message,
-- whose resolve is a no-op.
-- KEYS[1]        the children's shard's outbox STREAM (Keys.outbox)
-- KEYS[2i]       child i's job record HASH (i = 1 .. n)
-- KEYS[2i+1]     child i's parents SET (Keys.parents)
-- ARGV[3i-2]     child i's job id
-- ARGV[3i-1]     its 'pk': '<parents SET> <outbox STREAM> <the child's queue>'
-- ARGV[3i]       the parents SET member: '<policy><index> <parent record key> <parent id>'
-- Returns one answer per edge, in order: {'linked', state}, {'resolved', state, resolve's
-- code} (ended; its parent, in this slot, resolved here) or {'ended', outbox entry id, state
-- ('missing' for none), the message's value}.
local outbox = KEYS[1]
local mine = string.match(outbox, '{[^}]*}')
local now = now_ms()
local out = {}
for i = 1, (#KEYS - 1) / 2 do
  local jobkey, parents = KEYS[2 * i], KEYS[2 * i + 1]
  local id, pk, member = ARGV[3 * i - 2], ARGV[3 * i - 1], ARGV[3 * i]
  local r = rec(jobkey, false, 's', 'r', 'reason')
  local state = r[1]
  local value
  if not state then value = 'm'
  elseif state == 'completed' then value = 'c' .. (r[2] or '')
  elseif state == 'failed' then value = 'f' .. (r[3] or '')
  elseif state == 'cancelled' then value = 'x'
  end
  if not value then
    rcall('SADD', parents, member)
    rcall('HSET', jobkey, 'pk', pk)
    rcall('HDEL', jobkey, 'z')  -- (finish.lua reads 'pk' again: _lib.lua's start_entry)
    out[i] = {'linked', state}
  else
    local pi, prec, pid = string.match(member, '^(%S+) (%S+) (%S+)$')
    local cq = string.match(pk, '(%S+)$')
    local dmember = pi .. ' ' .. cq .. ' ' .. id
    if string.match(prec, '{[^}]*}') == mine then
      out[i] = {'resolved', state or 'missing', lib_flow().resolve(prec, pid, dmember, value,
        now)}
    else
      local e = rcall('XADD', outbox, '*', 'p', prec, 'i', pid, 'm', dmember, 'v', value)
      out[i] = {'ended', e, state or 'missing', value}
    end
  end
end
v1_restore()
return out
