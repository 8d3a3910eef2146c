-- renew.lua: extend the leases of running jobs by resetting their idle time in the PEL.
-- Only entries whose job is still 'active' under the caller's token are touched, so a worker
-- whose lease was reclaimed can never take the entry back from its new owner.
-- Safe to repeat: resetting an idle time twice is resetting it once.
-- KEYS[1]   ready stream
-- KEYS[1+i] job record HASH of lease i (i = 1..N)
-- ARGV[1]   consumer group
-- ARGV[2]   consumer name (the owner)
-- ARGV[3..] per lease i: stream entry id, lease token (pairs)
-- Returns per lease: 1 renewed, 2 renewed and a cancel of the job was requested (cancel.lua's
--           'cx': the worker's fallback when the cancel channel's message was lost), 3 not
--           renewed because the lease's own outcome is in (the record left 'active' and still
--           names this token: finish.lua keeps the holder's token; anyone else's settling
--           clears or replaces it), 0 lost (taken over, settled by another, or gone)
local stream, group, consumer = KEYS[1], ARGV[1], ARGV[2]
local out, ids = {}, {}
local n = (#ARGV - 2) / 2
for i = 1, n do
  local entry, token = ARGV[1 + 2 * i], ARGV[2 + 2 * i]
  local r = rec(KEYS[1 + i], false, 's', 'k', 'cx')
  if r[1] == 'active' and r[2] == token then
    ids[#ids + 1] = entry
    out[i] = r[3] and 2 or 1
  elseif r[2] == token then
    out[i] = 3  -- (its outcome settled while this renewal was on its way)
  else
    out[i] = 0
  end
end
if #ids > 0 then
  ids[#ids + 1] = 'JUSTID'  -- options follow the ids; JUSTID keeps the delivery count
  rcall('XCLAIM', stream, group, consumer, 0, unpack(ids))
end
v1_restore()  -- (layout-1 records read here: back in layout 1)
return out
