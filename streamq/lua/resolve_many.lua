-- resolve_many.lua: resolve.lua for many ended dependencies of one waiting job, in one call
-- (docs/workflows.md#costs): the producer's step for the edges link_many.lua found ended
-- (their parent in another slot), and the relay's for outbox messages of one parent. Each
-- dependency in turn, as resolve.lua applies one (SREM of the pending SET: a repeat is a
-- no-op; the last one releases the job, a failure under policy 'fail' dead-letters it and
-- the rest are then recorded as while_dead records them).
-- KEYS[1]        the waiting job's record HASH
-- ARGV[1]        its job id
-- ARGV[2j]       dependency j's deps SET member: '<policy><index> <child queue> <child id>'
--                (j = 1 .. n)
-- ARGV[2j+1]     its outcome: '<state letter><result or reason>'
-- Returns each dependency's code, in order (resolve.lua's: 0 no-op, 1 recorded,
--           2 dead-lettered, 3 released, 4 cancelled).
local now = now_ms()
local resolve = lib_flow().resolve
local out = {}
for j = 1, (#ARGV - 1) / 2 do
  out[j] = resolve(KEYS[1], ARGV[1], ARGV[2 * j], ARGV[2 * j + 1], now)
end
if V1_KEPT then lib_cold().v1_restore() end  -- (layout-1 records read: back in layout 1)
return out
