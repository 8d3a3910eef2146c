-- reconcile.lua: heal drift of group slots (docs/fairness.md#reconcile). The in-flight set
-- should hold '<group> <id>' exactly for the grouped jobs admitted to the stream or running;
-- a member whose job is no longer there (its record gone, finished, in another group, back
-- on the wait list, or its stream entry gone) is a leaked slot: it is removed and the group
-- admits its next waiting job. Every group named is then refilled (admits waiting jobs while
-- it has free slots and is open) or forgotten when it is empty. The caller pages through the
-- in-flight set and the group index (<= 1000 per call).
-- Safe to repeat: every check is made against the current state; a repeat finds nothing left.
-- (The opposite drift, a running job without a member, is healed by start.lua's g_gate,
-- which asserts the member of every grouped job it starts and hands back one over the limit.)
-- KEYS[1]   ready stream (of the default priority)
-- KEYS[2..12] the group keys (Keys.group_keys; its level streams are where a grouped job
--           of another priority has its entry: the record's 'p')
-- KEYS[12+i] job record HASH of member i (i = 1..M)
-- ARGV[1]   group defaults (QueueConfig.group_arg)
-- ARGV[2]   M, the number of in-flight members to check
-- ARGV[3..2+M] the members '<group> <job id>'
-- ARGV[3+M..] groups to refill
-- Returns {slots healed, jobs admitted}
local stream = KEYS[1]
local G = gctx(KEYS, 2, ARGV[1])
local now = now_ms()
local m = tonumber(ARGV[2])
local healed, admitted = 0, 0
local touched = {}
for i = 1, m do
  local member = ARGV[2 + i]
  local g, id = string.match(member, '^(%S+) (%S+)$')
  if g and rcall('ZSCORE', G.fl, member) then
    local r = rec(KEYS[12 + i], false, 's', 'e', 'g', 'gw', 'p')
    local state, live = r[1], false
    if not r.err and r[3] == g and (state == 'queued' or state == 'active') then
      if r[2] then  -- its entry is in its own level's stream (priority 'p'; absent: 2)
        local at = stream
        if r[5] and G.levels then at = G.levels[(tonumber(r[5]) or 2) + 1] or stream end
        live = #rcall('XRANGE', at, r[2], r[2]) > 0
      elseif r[4] then  -- admitted from its wait list and not yet met by a script: live
        live = not rcall('ZSCORE', G.wait, g .. ' ' .. r[4] .. id)
      end
    end
    if not live then
      rcall('ZREM', G.fl, member)
      healed = healed + 1
      touched[g] = true
    end
  end
end
for i = 3 + m, #ARGV do touched[ARGV[i]] = true end
for g in pairs(touched) do
  admitted = admitted + g_fill(G, g, stream, now)
  g_tidy(G, g)
end
v1_restore()  -- (layout-1 records read here: back in layout 1)
return {healed, admitted}
