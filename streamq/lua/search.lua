-- search.lua: the first look at a page of search candidates (docs/search.md), server-side, so
-- a search that checks thousands of records sends one call per shard, not one per record.
-- Reads only: safe to repeat.
-- KEYS[i]   job record HASH of candidate i (all of one queue shard)
-- ARGV[1]   state wanted: its layout-2 letter ('' = any state)
-- ARGV[2]   the same state's name (a layout-1 record keeps 'state' = the name)
-- ARGV[3]   group wanted ('' = any)
-- ARGV[4]   job type wanted ('' = any): the body's first word, or a layout-1 'type'
-- ARGV[5]   text wanted in the record's last error or reason, lower case ('' = any)
-- Returns one number per candidate, in order: 0 the record is gone, 1 it does not match,
--           2 it matches these filters (the caller reads it whole and checks the rest)
local want_s, want_name, want_g, want_t, want_e = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local out = {}
for i = 1, #KEYS do
  local r = rcall('HMGET', KEYS[i], 's', 'state', 'g', 'b', 'type')
  local code = 2
  if not r[1] and not r[2] then
    code = 0
  elseif want_s ~= '' and not ((r[1] and r[1] == want_s) or (not r[1] and r[2] == want_name))
  then
    code = 1
  elseif want_g ~= '' and r[3] ~= want_g then
    code = 1
  elseif want_t ~= '' then
    local t = r[5]
    if r[4] then
      local sp = sfind(r[4], ' ', 1, true)
      t = sp and ssub(r[4], 1, sp - 1) or r[4]
    end
    if t ~= want_t then code = 1 end
  end
  if code == 2 and want_e ~= '' then
    local e = rcall('HMGET', KEYS[i], 'error', 'reason')
    local text = string.lower((e[1] or '') .. ' ' .. (e[2] or ''))
    if not sfind(text, want_e, 1, true) then code = 1 end
  end
  out[i] = code
end
return out
