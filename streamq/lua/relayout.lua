-- relayout.lua: the last step of a reshard (reshard.finish, docs/scaling.md#resharding):
-- on shard 0's meta HASH, set 'live' back to 'shards' once every old-only shard is retired,
-- and drop 'prev' / 'prev_until' once server time has passed 'prev_until'. Only when the
-- layout is the one the caller read (same 'epoch', no 'next': a reshard begun meanwhile
-- decides its own live shards), so a late finish never hides shards a new reshard uses.
-- Safe to repeat: a repeat finds the fields already set or dropped.
-- KEYS[1]   meta HASH of shard 0 (the stored layout: shards.py)
-- ARGV[1]   the epoch the caller read
-- ARGV[2]   '1': every old-only shard is retired, set live = shards; '0': leave live
-- Returns {'ok' or 'moved', live, prev or ''}
local meta = KEYS[1]
local epoch = rcall('HGET', meta, 'epoch') or '0'
if epoch ~= ARGV[1] or rcall('HEXISTS', meta, 'next') == 1 then
  return {'moved', rcall('HGET', meta, 'live') or '', rcall('HGET', meta, 'prev') or ''}
end
local shards = rcall('HGET', meta, 'shards')
if ARGV[2] == '1' and shards then rcall('HSET', meta, 'live', shards) end
local untl = tonumber(rcall('HGET', meta, 'prev_until') or '')
if untl and now_ms() >= untl then rcall('HDEL', meta, 'prev', 'prev_until') end
return {'ok', rcall('HGET', meta, 'live') or '', rcall('HGET', meta, 'prev') or ''}
