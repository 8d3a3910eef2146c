-- group.lua: change one group's settings at run time (admin API, CLI), on one shard, and
-- act on the change at once: a raised limit or a resumed group admits waiting jobs now
-- (g_fill); a lowered limit never pre-empts running jobs (start.lua hands back unstarted
-- ones while the group is over it); a paused group admits nothing and starts nothing.
-- Safe to repeat: every operation sets a value; a repeat sets the same and admits nothing
-- more than free slots allow.
-- KEYS[1]   ready stream
-- KEYS[2..12] the group keys (Keys.group_keys)
-- ARGV[1]   group defaults (QueueConfig.group_arg)
-- ARGV[2]   operation: 'limit' | 'rate' | 'pause' | 'resume'
-- ARGV[3]   group
-- ARGV[4]   value: limit (a positive integer) or rate '<n> <period ms>'; '' = back to the
--           queue's default
-- Returns {in flight, waiting, admitted by this call}
local stream = KEYS[1]
local G = gctx(KEYS, 2, ARGV[1])
local op, g, v = ARGV[2], ARGV[3], ARGV[4]
local now = now_ms()
if op == 'limit' then
  if v == '' then rcall('HDEL', G.cfg, 'l:' .. g)
  else rcall('HSET', G.cfg, 'l:' .. g, v) end
elseif op == 'rate' then
  if v == '' then rcall('HDEL', G.cfg, 'r:' .. g)
  else rcall('HSET', G.cfg, 'r:' .. g, v) end
  rcall('ZREM', G.parked, g)  -- re-judged by the new rate (its TAT is kept)
elseif op == 'pause' then
  rcall('HSET', G.cfg, 'p:' .. g, 1)
elseif op == 'resume' then
  rcall('HDEL', G.cfg, 'p:' .. g)
else
  return redis.error_reply('unknown group operation ' .. op)
end
local admitted = g_fill(G, g, stream, now)
g_tidy(G, g)
return {g_count(G.fl, g), g_count(G.wait, g), admitted}
