-- resolve.lua: apply one ended dependency to a waiting job, in the waiting job's slot
-- (docs/workflows.md): the relay's step for an outbox message, and the producer's or the
-- repair sweep's for a child that had ended before it was linked. The dependency leaves the
-- job's pending SET (SREM: a repeat is a no-op), its outcome goes in the job's dependency
-- results HASH, and then: a failed, cancelled, purged or missing dependency under policy
-- 'fail' dead-letters the job (re-drivable, the reason names the dependency); the last one
-- makes it ready (its level's stream, or the delayed ZSET when it starts later). The other
-- keys are named by the record's 'wk' (written from the key builder, all in this slot).
-- KEYS[1]   the waiting job's record HASH
-- ARGV[1]   its job id
-- ARGV[2]   the deps SET member: '<policy><index> <child queue> <child id>' ('': release
--           the job if nothing is pending any more: the repair sweep's check)
-- ARGV[3]   the outcome: '<state letter><result or reason>'
-- Returns 0 no-op (not waiting, or already resolved), 1 recorded, 2 dead-lettered,
--           3 released.
-- A job released to its default-level stream is handed to an idle worker's ticket when one
-- waits (_flow.lua's hand: 'wk' words 14 and 15), started here.
local res = lib_flow().resolve(KEYS[1], ARGV[1], ARGV[2], ARGV[3], now_ms())
if V1_KEPT then lib_cold().v1_restore() end  -- (layout-1 records read: back in layout 1)
return res
