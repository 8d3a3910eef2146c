-- retire.lua: delete one old-only shard of a queue after a reshard down (docs/scaling.md#
-- resharding), in one step with the check that it holds no live work: a job that arrives
-- meanwhile (a retry into its delayed set, a redrive, a promotion, a producer's resend) is
-- either seen by the check or arrives after the delete (and then it is refused: see below).
-- The shard is busy while any of the live-work keys is non-empty (a ready stream of any level:
-- ready or in flight, since a finished entry is deleted; a consumer group's pending list;
-- the delayed set; the dead letters; a group's wait list and in-flight slots; the workflow
-- waiting set and its outbox): then nothing is deleted. Job records (and dedup keys) are
-- left: they expire on their own, and calls by id read them while ``prev`` is kept.
-- The ``lay`` field of the stats HASH (the shard count it takes jobs for: shards.py) is kept:
-- a producer still routing by a count under which this shard existed is refused there
-- (``STREAMQ_LAYOUT``) and resends to the job's new home, never into a deleted shard.
-- Safe to repeat: a retired shard holds nothing live, and deleting it again deletes what a
-- late writer (a worker's heartbeat before it dropped the shard) left.
-- KEYS[1 .. ARGV[2]]  the live-work keys (every level's ready stream, delayed ZSET, dead
--                     STREAM, group wait and in-flight ZSETs, workflow waiting ZSET, outbox)
-- KEYS[ARGV[2] + 1]   stats HASH (emptied but for its 'lay' field)
-- KEYS[ARGV[2] + 2 ..] the shard's other non-record keys (all deleted)
-- ARGV[1]   consumer group name (its pending count is checked on each STREAM)
-- ARGV[2]   how many live-work keys come first
-- ARGV[3]   the shard count of the layout the caller read: a shard whose 'lay' names another
--           count was frozen by a reshard begun since (it may be one of its shards): kept
-- Returns {'retired', keys deleted}, {'busy', index of the first non-empty key, its size}, or
-- {'moved', 0, the shard's 'lay'}
local group, nlive = ARGV[1], tonumber(ARGV[2])
local stats = KEYS[nlive + 1]
local lay = rcall('HGET', stats, 'lay')
if lay and lay ~= ARGV[3] then return {'moved', 0, tonumber(lay) or 0} end

local function size(key)
  local t = rcall('TYPE', key)['ok']
  if t == 'none' then return 0 end
  if t == 'stream' then
    local n = rcall('XLEN', key)
    if n > 0 then return n end
    local p = rpcall('XPENDING', key, group)
    if type(p) == 'table' and tonumber(p[1]) and tonumber(p[1]) > 0 then
      return tonumber(p[1])
    end
    return 0
  end
  if t == 'zset' then return rcall('ZCARD', key) end
  if t == 'list' then return rcall('LLEN', key) end
  if t == 'set' then return rcall('SCARD', key) end
  if t == 'hash' then return rcall('HLEN', key) end
  return 1
end

for i = 1, nlive do
  local n = size(KEYS[i])
  if n > 0 then return {'busy', i, n} end
end
local deleted = 0
for i = 1, #KEYS do
  if i ~= nlive + 1 then deleted = deleted + rcall('DEL', KEYS[i]) end
end
rcall('DEL', stats)
if lay then rcall('HSET', stats, 'lay', lay) end
return {'retired', deleted}
