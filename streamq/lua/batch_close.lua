-- batch_close.lua: close a batch (docs/workflows.md#batches-with-callbacks): its record ends 'completed'
-- (kept for its result TTL) and, in the same script, every callback waiting for it is resolved
-- (_flow.lua's settled: inline, the callbacks are in this slot): the batch's own edge leaves
-- each callback's pending SET, so from now on adopt.lua adds nothing more, and a callback whose
-- jobs all ended is released (or, on_death without a death, cancelled) here.
-- Safe to repeat: a batch no longer open answers {'not_open', state} and writes nothing.
-- KEYS[1]   the batch record HASH
-- KEYS[2]   events STREAM
-- ARGV[1]   batch id
-- ARGV[2]   its result (serialised; what its callbacks see as the batch's dependency result)
-- ARGV[3]   events: max length and kinds (_lib.lua's emit)
-- Returns {'closed'}, {'not_open', state} or {'not_found', ''}.
local jobkey, events = KEYS[1], KEYS[2]
local r = rcall('HMGET', jobkey, 's', 'x', 'pk', 'bc')
if not r[1] or not r[4] then return {'not_found', ''} end
if r[1] ~= 'w' then return {'not_open', state_of(r[1])} end
local now = now_ms()
rcall('HSET', jobkey, 's', 'c', 'r', ARGV[2], 'f', now)
local ttl = tonumber(r[2] or DEFAULT_TTL) or 0
if ttl > 0 then rcall('EXPIRE', jobkey, ttl) end
emit(events, ARGV[3], ARGV[1], 'completed', now, 'batch closed')
if r[3] then lib_flow().settled(jobkey, ARGV[1], 'c' .. ARGV[2], r[3], nil, now) end
return {'closed'}
