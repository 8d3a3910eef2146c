-- search.lua: read the next candidates of one search index and check them on their job
-- records in Redis (docs/search.md), so a search that checks thousands of records costs one
-- call per shard and page, not a round of commands per record. It writes only to drop what
-- is stale from the error-word index (a dead letter gone from its stream, or whose record
-- expired: _lib.lua's ew_drop): safe to repeat.
-- KEYS[1]   the index: a search ZSET (Keys.ix_*), the dead-letter STREAM of one queue shard
--           (or a ready stream: state="queued"), or its error-word index (Keys.ix_ew,
--           written by ixdead.lua)
-- KEYS[2]   e only: the dead-letter STREAM
-- KEYS[3]   e only: the indexed dead letters (Keys.ix_ewl)
-- ARGV[1]   'z' (ZSET, newest first by rank), 'd' (STREAM, newest first) or 'e' (the dead
--           letters with a word of the error-word index, newest first)
-- ARGV[2]   the shard's job record key prefix (Keys.job(''), built by the key builder: the
--           record of id <id> is it .. <id>, in KEYS[1]'s slot, like claim.lua's records)
-- ARGV[3]   z: the first rank to read; d, e: the newest entry id to read (inclusive)
-- ARGV[4]   d, e: the oldest entry id to read ('-' = none)
-- ARGV[5]   how many entries to read
-- ARGV[6]   state wanted: its layout-2 letter ('' = any state)
-- ARGV[7]   the same state's name (a layout-1 record keeps 'state' = the name)
-- ARGV[8]   group wanted ('' = any)
-- ARGV[9]   job type wanted ('' = any): the body's first word, or a layout-1 'type'
-- ARGV[10]  text wanted in the error, lower case ('' = any): it occurs where a word starts
--           in the error text (_lib.lua's err_text and err_match: the dead letter's error
--           type and reason, else the record's, and the record's error message)
-- ARGV[11]  error type wanted ('' = any): a dead letter's, else the record's last error's
-- ARGV[12]  e only: the word to read, 'x<word>' (one word) or 'p<prefix>' (every word that
--           starts so, at most 64 words: more answers {'!broad'}, read the stream instead)
-- Returns per entry read, in order: z: member, score, code; d, e: entry id, job id, reason,
--           error type (both '' unless the code is 2), code. Code 0: the record is gone; 1:
--           it does not match; 2: it matches these filters (the caller reads it whole and
--           checks the rest).
local kind, prefix, n = ARGV[1], ARGV[2], tonumber(ARGV[5])
local want_s, want_name, want_g, want_t = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local want_e, want_et = ARGV[10], ARGV[11]
local lower = string.lower
local need_err = want_e ~= '' or want_et ~= ''
local F = {'s', 'state', 'g'}  -- one read per record: the fields the filters need
if need_err then F[#F + 1] = 'error'; F[#F + 1] = 'reason' end
if want_t ~= '' then F[#F + 1] = 'b'; F[#F + 1] = 'type' end
local IE, IT = 4, need_err and 6 or 4
-- The query's longest word: every word of a match lies within one part of the error text
-- (a word never spans the spaces that join them), and JSON never escapes a-z 0-9, so a
-- record whose raw fields lack it cannot match (no JSON decoded for it).
local QTOK = nil
for t in string.gmatch(want_e, '[0-9a-z]+') do
  if not QTOK or #t > #QTOK then QTOK = t end
end
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
  local err = r[IE] or ''
  if want_et ~= '' and etype == nil and not sfind(err, '"type":"' .. want_et .. '"', 1, true)
      and not sfind(err, '"type": "' .. want_et .. '"', 1, true) then
    return 1
  end
  if want_e == '' then return 2 end
  if reason == nil or reason == '' then reason = r[IE + 1] or '' end
  if QTOK and not sfind(lower((etype or '') .. ' ' .. reason .. ' ' .. err), QTOK, 1, true)
  then
    return 1
  end
  if err_match(err_text(etype, reason, err), want_e) then return 2 end
  return 1
end
-- The next n dead letters with the word (or a word with the prefix), newest first, at or
-- before ARGV[3] and at or after ARGV[4]: their index positions, or nil when a prefix starts
-- more than 64 words.
local function e_positions()
  local mode, tok = ssub(ARGV[12], 1, 1), ssub(ARGV[12], 2)
  local hi = ew_pos(ARGV[3])
  local lo = ARGV[4] ~= '-' and ew_pos(ARGV[4]) or nil
  local wl = {}
  if mode == 'x' then
    wl[1] = tok
  else
    local from = '[' .. tok
    while true do
      local r = rcall('ZRANGEBYLEX', KEYS[1], from, '(' .. tok .. '\255', 'LIMIT', 0, 1)
      if not r[1] then break end
      if #wl == 64 then return nil end
      local w = ssub(r[1], 1, sfind(r[1], '\0', 1, true) - 1)
      wl[#wl + 1] = w
      from = '[' .. w .. '\1'
    end
  end
  local pos = {}
  for _, w in ipairs(wl) do
    local r = rcall('ZRANGEBYLEX', KEYS[1], '[' .. w .. '\0' .. hi,
      lo and ('[' .. w .. '\0' .. lo) or ('[' .. w .. '\1'), 'LIMIT', 0, n)
    for _, m in ipairs(r) do pos[#pos + 1] = ssub(m, #w + 2) end
  end
  if #wl > 1 then
    table.sort(pos)
    local u, prev = {}, nil
    for _, p in ipairs(pos) do
      if p ~= prev and #u < n then u[#u + 1] = p end
      prev = p
    end
    pos = u
  end
  return pos
end

-- Drop a stale dead letter (gone from its stream, or its record expired) from the index.
local function e_stale(p)
  local _, ms, head = ew_eid(p)
  for _, m in ipairs(rcall('ZRANGEBYSCORE', KEYS[3], ms, ms)) do
    if ssub(m, 1, #head) == head and (#m == #head or ssub(m, #head + 1, #head + 1) == ' ') then
      ew_drop(KEYS[1], KEYS[3], m)
    end
  end
end

local function dead_fields(f)
  local job, reason, etype = '', '', ''
  for j = 1, #f, 2 do
    local k = f[j]
    if k == 'job' or k == 'id' then job = f[j + 1]  -- (id: a ready stream's entry)
    elseif k == 'reason' then reason = f[j + 1]
    elseif k == 'etype' then etype = f[j + 1] end
  end
  return job, reason, etype
end

local out = {}
if kind == 'e' then
  local pos = e_positions()
  if not pos then return {'!broad'} end
  for _, p in ipairs(pos) do
    local eid = ew_eid(p)
    local e = rcall('XRANGE', KEYS[2], eid, eid)
    local job, reason, etype, code = '', '', '', 0
    if e[1] then
      job, reason, etype = dead_fields(e[1][2])
      code = job ~= '' and check(job, reason, etype) or 1
    end
    if code == 0 then e_stale(p) end
    out[#out + 1] = eid
    out[#out + 1] = job
    out[#out + 1] = code == 2 and reason or ''
    out[#out + 1] = code == 2 and etype or ''
    out[#out + 1] = code
  end
elseif kind == 'z' then
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
    local job, reason, etype = dead_fields(e[2])
    local code = job ~= '' and check(job, reason, etype) or 1
    out[#out + 1] = e[1]
    out[#out + 1] = job
    out[#out + 1] = code == 2 and reason or ''  -- (the texts only of a match: a short
    out[#out + 1] = code == 2 and etype or ''   -- reply when a rare error is looked for)
    out[#out + 1] = code
  end
end
return out
