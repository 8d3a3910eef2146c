-- batch_open.lua: open a batch (docs/workflows.md#batches-with-callbacks). The batch is a record in state
-- 'waiting' that never runs (no stream entry, no 'wk', not in the waiting index): its callbacks
-- (on_success, on_complete, on_death: waiting jobs in this slot, wait.lua) wait for it as for
-- any dependency, so none can be released before batch_close.lua ends it; the batch's jobs are
-- added to the callbacks' pending SETs (adopt.lua) while it is open.
-- Safe to repeat: an existing record answers {'exists', state} and writes nothing.
-- KEYS[1]   the batch record HASH (Keys.job of the batch id)
-- KEYS[2]   events STREAM
-- KEYS[3]   (optional, with ARGV[5]) the shard's stats HASH
-- ARGV[1]   batch id
-- ARGV[2]   body ('streamq.batch <serialised description>', what q.get shows)
-- ARGV[3]   'bc': the callbacks, '<kind>=<job id>' words (kind: on_success | on_complete |
--           on_death)
-- ARGV[4]   events: max length and kinds (_lib.lua's emit)
-- ARGV[5]   (optional) the shard count the batch id was routed by: when KEYS[3] has 'lay' (a
--           reshard froze the shard: enqueue.lua's header) and it differs, a new batch is
--           refused: nothing is written, the error 'STREAMQ_LAYOUT <lay>' (an existing one
--           is answered as always)
-- Returns {'opened'} or {'exists', state}.
local jobkey, events = KEYS[1], KEYS[2]
local s = rcall('HGET', jobkey, 's')
if s then return {'exists', state_of(s)} end
if KEYS[3] and ARGV[5] then
  local lay = rpcall('HGET', KEYS[3], 'lay')
  if type(lay) == 'string' and lay ~= ARGV[5] then
    return redis.error_reply('STREAMQ_LAYOUT ' .. lay)
  end
end
local now = now_ms()
rcall('HSET', jobkey, 's', 'w', 'b', ARGV[2], 'c', now, 'bc', ARGV[3])
emit(events, ARGV[4], ARGV[1], 'enqueued', now, 'batch opened')
return {'opened'}
