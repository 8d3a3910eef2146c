-- search.lua: read the next candidates of one search index and check them on their job
-- records in Redis (docs/search.md), so a search that checks thousands of records costs one
-- call per shard and page, not a round of commands per record. Reads only: safe to repeat.
-- KEYS[1]   the index: a search ZSET (Keys.ix_*) or the dead-letter STREAM of one queue shard
-- ARGV[1]   'z' (ZSET, newest first by rank) or 'd' (STREAM, newest first)
-- ARGV[2]   the shard's job record key prefix (Keys.job(''), built by the key builder: the
--           record of id <id> is it .. <id>, in KEYS[1]'s slot, like claim.lua's records)
-- ARGV[3]   z: the first rank to read; d: the newest entry id to read (inclusive)
-- ARGV[4]   d only: the oldest entry id to read ('-' = none)
-- ARGV[5]   how many entries to read
-- ARGV[6]   state wanted: its layout-2 letter ('' = any state)
-- ARGV[7]   the same state's name (a layout-1 record keeps 'state' = the name)
-- ARGV[8]   group wanted ('' = any)
-- ARGV[9]   job type wanted ('' = any): the body's first word, or a layout-1 'type'
-- ARGV[10]  text wanted in the error, lower case ('' = any): a dead letter's reason and
--           error type, else the record's last error and reason
-- ARGV[11]  error type wanted ('' = any): a dead letter's, else the record's last error's
-- Returns per entry read, in order: z: member, score, code; d: entry id, job id, reason,
--           error type (both '' unless the code is 2), code. Code 0: the record is gone; 1: it does not match; 2: it
--           matches these filters (the caller reads it whole and checks the rest).
local kind, prefix, n = ARGV[1], ARGV[2], tonumber(ARGV[5])
local want_s, want_name, want_g, want_t = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local want_e, want_et = ARGV[10], ARGV[11]
local lower = string.lower
local need_err = want_e ~= '' or want_et ~= ''
local F = {'s', 'state', 'g'}  -- one read per record: the fields the filters need
if need_err then F[#F + 1] = 'error'; F[#F + 1] = 'reason' end
if want_t ~= '' then F[#F + 1] = 'b'; F[#F + 1] = 'type' end
local IE, IT = 4, need_err and 6 or 4
local function check(id, reason, etype)
  local r = rcall('HMGET', prefix .. id, unpack(F))
  if not r[1] and not r[2] then return 0 end
  if want_s ~= '' and not ((r[1] and r[1] == want_s) or (not r[1] and r[2] == want_name)) then
    return 1
  end
  if want_g ~= '' and r[3] ~= want_g then return 1 end
  if want_t ~= '' then
    local b, t = r[IT], r[IT + 1]
    if b then
      local sp = sfind(b, ' ', 1, true)
      t = sp and ssub(b, 1, sp - 1) or b
    end
    if t ~= want_t then return 1 end
  end
  if not need_err then return 2 end
  if want_et ~= '' and etype and etype ~= want_et then return 1 end
  local text_ok = want_e == '' or (etype and sfind(lower(reason .. ' ' .. etype), want_e, 1,
    true))
  local type_ok = want_et == '' or etype ~= nil  -- (a dead letter's: checked just above)
  if text_ok and type_ok then return 2 end
  local err = r[IE] or ''
  if not type_ok and not sfind(err, '"type":"' .. want_et .. '"', 1, true)
      and not sfind(err, '"type": "' .. want_et .. '"', 1, true) then
    return 1
  end
  if not text_ok and not sfind(lower(err .. ' ' .. (r[IE + 1] or '')), want_e, 1, true) then
    return 1
  end
  return 2
end
local out = {}
if kind == 'z' then
  local start = tonumber(ARGV[3])
  local got = rcall('ZREVRANGE', KEYS[1], start, start + n - 1, 'WITHSCORES')
  for i = 1, #got, 2 do
    out[#out + 1] = got[i]
    out[#out + 1] = got[i + 1]
    out[#out + 1] = check(got[i], nil, nil)
  end
else
  local got = rcall('XREVRANGE', KEYS[1], ARGV[3], ARGV[4], 'COUNT', n)
  for _, e in ipairs(got) do
    local f, job, reason, etype = e[2], '', '', ''
    for j = 1, #f, 2 do
      local k = f[j]
      if k == 'job' then job = f[j + 1]
      elseif k == 'reason' then reason = f[j + 1]
      elseif k == 'etype' then etype = f[j + 1] end
    end
    local code = job ~= '' and check(job, reason, etype) or 1
    out[#out + 1] = e[1]
    out[#out + 1] = job
    out[#out + 1] = code == 2 and reason or ''  -- (the texts only of a match: a short
    out[#out + 1] = code == 2 and etype or ''   -- reply when a rare error is looked for)
    out[#out + 1] = code
  end
end
return out
