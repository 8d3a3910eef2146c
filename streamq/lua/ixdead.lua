-- ixdead.lua: bring a queue shard's error-word index (docs/search.md#error-text) up to its
-- dead-letter stream. First the entries of dead letters the stream no longer holds (older
-- than its first entry: trimmed by length or by age, or all of them when it is empty) leave
-- the index, at most ARGV[3] dead letters' worth. Then, when the queue has search on (its
-- time index exists), the dead letters after the newest one indexed are indexed, oldest
-- first, at most ARGV[2]: each one's distinct words (_lib.lua's err_text: at most 16, each
-- cut to 32 bytes) as members '<word>\0<position>' of KEYS[3] (ew_pos: newest first per
-- word), and one member '<ms>-<seq, 8 digits> <word> ...' of KEYS[4] scored by its ms (what
-- to remove with it; the newest one is where the next call resumes). Both keys take the time
-- index's TTL (a queue whose index lapsed keeps no error index either). Safe to repeat: a
-- dead letter is indexed once (reading resumes after the newest indexed), and the same ZADD
-- or ZREM again changes nothing.
-- KEYS[1]   the dead-letter STREAM of the shard
-- KEYS[2]   the shard's time index ZSET (Keys.ix_all): it exists = the queue has search on
-- KEYS[3]   the error-word index ZSET (Keys.ix_ew)
-- KEYS[4]   the indexed dead letters ZSET (Keys.ix_ewl)
-- ARGV[1]   the shard's job record key prefix (Keys.job(''), from the key builder: the
--           record of id <id> is it .. <id>, in KEYS[1]'s slot)
-- ARGV[2]   dead letters to index at most
-- ARGV[3]   dead letters to drop at most
-- Returns {indexed, dropped, the newest indexed dead letter's entry id ('' = none indexed:
--          no index, a search scans the stream), 1 when more dead letters wait, else 0}
local dead, all, ew, ewl = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local prefix, n, nd = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local first = rcall('XRANGE', dead, '-', '+', 'COUNT', 1)
local old
if first[1] then
  local ms = string.match(first[1][1], '^(%d+)')
  old = rcall('ZRANGEBYSCORE', ewl, '-inf', '(' .. ms, 'LIMIT', 0, nd)
else
  old = rcall('ZRANGE', ewl, 0, nd - 1)
end
for _, m in ipairs(old) do ew_drop(ew, ewl, m) end
local mark = ''
local last = rcall('ZRANGE', ewl, -1, -1)  -- (ZRANGE: in the tenant ACL rule)
if last[1] then
  local ms, seq = string.match(last[1], '^(%d+)%-(%d+)')
  mark = string.format('%.0f-%.0f', tonumber(ms), tonumber(seq))
end
if rcall('EXISTS', all) == 0 then return {0, #old, mark, 0} end
local got = rcall('XRANGE', dead, mark == '' and '-' or '(' .. mark, '+', 'COUNT', n)
for _, e in ipairs(got) do
  local f, job, reason, etype = e[2], '', '', ''
  for j = 1, #f, 2 do
    local k = f[j]
    if k == 'job' then job = f[j + 1]
    elseif k == 'reason' then reason = f[j + 1]
    elseif k == 'etype' then etype = f[j + 1] end
  end
  local hm = job ~= '' and rpcall('HMGET', prefix .. job, 'error', 'reason') or {}
  if type(hm) ~= 'table' or hm.err then hm = {} end
  if reason == '' then reason = hm[2] or '' end
  local _, wl = err_text(etype, reason, hm[1] or nil)
  local pos = ew_pos(e[1])
  local _, ms, head = ew_eid(pos)
  local z = {}
  for i, w in ipairs(wl) do
    wl[i] = ssub(w, 1, 32)
    z[#z + 1] = 0
    z[#z + 1] = wl[i] .. '\0' .. pos
  end
  if z[1] then rcall('ZADD', ew, unpack(z)) end
  rcall('ZADD', ewl, ms, wl[1] and (head .. ' ' .. table.concat(wl, ' ')) or head)
  mark = e[1]
end
if got[1] then
  local ttl = rcall('PTTL', all)
  if ttl > 0 then
    rcall('PEXPIRE', ew, ttl)
    rcall('PEXPIRE', ewl, ttl)
  end
end
return {#got, #old, mark, #got == n and 1 or 0}
