-- claim.lua: read new entries of the ready stream(s) into the caller's pending list and start
-- them, all in one script (the worker's fetch under a backlog: one round trip per batch, no
-- XREADGROUP + start.lua pair, no ownership check per entry). XREADGROUP without BLOCK is
-- allowed in a script; an idle worker waits with a blocking XREADGROUP outside (fetch.py).
-- Each level stream (in the order given) is read up to its share first; what the shares did
-- not fill is then read from the levels in the order given (priorities: docs/fairness.md).
-- Every entry read is started as start.lua starts one (_lib.lua's start_entry), with the
-- token '<token prefix><hex(first + k)>' for the k-th entry read (k = 0, 1, ..., counting
-- every entry read, a malformed one too: the worker computes each token from its row's place).
-- The queue-wide rate limit (_lib.lua's rate_*, GCRA) is checked before anything is read:
-- the claim reads at most as many entries as may start now, and a start that did not happen
-- (an entry skipped or dead-lettered) is not charged. None may start: nothing is read and the
-- reply says how long to wait.
-- While the queue is paused nothing is read. A malformed entry (no id field, or an id that is
-- not UTF-8) is dead-lettered.
-- Job records are named by the caller's prefix (ARGV[6], built by the key builder: it holds
-- the shard's hash tag, so every record is in the slot of KEYS; docs/key-layout.md).
-- Safe to repeat: a call whose reply was lost left its entries in the caller's pending list,
-- their jobs 'active' under tokens of the caller's prefix; the worker reads its own pending
-- entries again and start.lua answers each as the same start (no attempt counted). A
-- repeated claim reads new entries only.
-- KEYS[1]   dead STREAM
-- KEYS[2]   stats HASH
-- KEYS[3]   events STREAM
-- KEYS[4]   pause flag (STRING; exists while the queue is paused)
-- KEYS[5]   rate limiter STRING (its TAT; untouched without a limit)
-- KEYS[5+l] ready stream of level l (l = 1..L), in the order of reading
-- KEYS[6+L .. 16+L] the group keys (Keys.group_keys): grouped jobs start through their
--           group's gate (_lib.lua's start_entry, g_gate)
-- ARGV[1]   consumer group
-- ARGV[2]   consumer name
-- ARGV[3]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[4]   dead-letter retention in seconds
-- ARGV[5]   dead stream max length
-- ARGV[6]   job record key prefix (the record of job <id> is ARGV[6] .. <id>)
-- ARGV[7]   lease token prefix (the caller's worker)
-- ARGV[8]   first token number
-- ARGV[9]   N, at most this many entries in all
-- ARGV[10]  rate limit: emission interval in µs (0 = no limit)
-- ARGV[11]  rate limit: tolerance in µs
-- ARGV[11+l] level l's share of N
-- ARGV[12+L] group defaults (QueueConfig.group_arg)
-- Returns an array: status ('ok' | 'paused' | 'limited': the rate allows no start now),
--           levels without the consumer group (their numbers, comma separated; '' = none),
--           how many entries the rate allowed to read (N without a limit), ms until the
--           next start conforms (0 = now), then one array per read that got entries, in the
--           order read: its level l, then 4 values per entry read: stream entry id, job id
--           ('' for a malformed entry), the job's data (or the reason it did not start), and
--           t, which is
--             a number: it started, attempt 1, no deadline, t ms since it (re)entered the
--               stream and since it was created (the common start: one value, not four);
--             an array {attempt, deadline ms, ms since it (re)entered the stream, ms since
--               it was created}: it started (any other start);
--             a string: it did not start: 'skip' | 'dead' | 'paused' | 'limited' (the data
--               value is then the reason).
--           The k-th entry of the reply (k = 0, 1, ... over every array) started under the
--           token '<token prefix><hex(first + k)>'.
local group, consumer = ARGV[1], ARGV[2]
local c = {dead = KEYS[1], stats = KEYS[2], events = KEYS[3], group = group,
  consumer = consumer, events_maxlen = ARGV[3], dead_ttl = ARGV[4], dead_maxlen = ARGV[5],
  resume = '', now = now_ms(), paused = false,
  started = 0, reclaimed = 0, failed = 0, handed = 0, cancelled = 0, fresh = {}}
if rcall('EXISTS', KEYS[4]) == 1 then return {'paused', '', 0, 0} end
local prefix, tokens = ARGV[6], ARGV[7]
local next_token = tonumber(ARGV[8])
local n = tonumber(ARGV[9])
-- The limiter's and the groups' functions are made only when this call needs them (a
-- limit set; an entry of a group: start_entry makes the group context from c.gkeys, c.gat
-- and c.gspec on first need): making them is most of an empty claim's cost (callgrind).
local lim = {key = KEYS[5], interval = tonumber(ARGV[10]), tolerance = tonumber(ARGV[11])}
local RL = lim.interval > 0 and lib_rate()
if RL then
  c.rate = lim
  n = RL.rate_allowed(lim, n)
  if n == 0 then return {'limited', '', 0, RL.rate_wait_ms(lim)} end
end
local levels = #KEYS - 16
c.gkeys, c.gat, c.gspec = KEYS, 6 + levels, ARGV[12 + levels]
local out = {'ok', '', n, 0}
-- A job id must be UTF-8 (as the worker decodes ids of entries it reads itself)
local function utf8_ok(s)
  if sfind(s, '^[\1-\127%z]*$') then return true end  -- ASCII (one anchored pass)
  local i, n = 1, #s
  while i <= n do
    local b = sbyte(s, i)
    local len = 1
    if b >= 0xC2 and b <= 0xDF then len = 2
    elseif b >= 0xE0 and b <= 0xEF then len = 3
    elseif b >= 0xF0 and b <= 0xF4 then len = 4
    elseif b >= 0x80 then return false end
    if i + len - 1 > n then return false end
    for j = i + 1, i + len - 1 do
      local d = sbyte(s, j)
      if d < 0x80 or d > 0xBF then return false end
    end
    local b2 = sbyte(s, i + 1) or 0
    if (b == 0xE0 and b2 < 0xA0) or (b == 0xED and b2 > 0x9F)
        or (b == 0xF0 and b2 < 0x90) or (b == 0xF4 and b2 > 0x8F) then
      return false
    end
    i = i + len
  end
  return true
end
-- The token of the k-th entry: tokens .. hex(first + k), the hex of (first + k) / 16
-- formatted once per 16 tokens
local HEX = {'0', '1', '2', '3', '4', '5', '6', '7', '8', '9', 'a', 'b', 'c', 'd', 'e', 'f'}
local hi_n, hi_s = -1, ''
local function token_of(x)
  if x < 0 or x % 1 ~= 0 then return tokens .. string.format('%x', x) end
  local lo = x % 16
  local hi = (x - lo) / 16  -- (exact: x is a whole number)
  if hi ~= hi_n then
    hi_n = hi
    hi_s = hi > 0 and string.format('%x', hi) or ''
  end
  return tokens .. hi_s .. HEX[lo + 1]
end
local nogroup, drained = {}, {}
local got = 0
local function read(l, want)
  if want <= 0 or nogroup[l] or drained[l] then return end
  local stream = KEYS[5 + l]
  local reply = rpcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', want,
    'STREAMS', stream, '>')
  if type(reply) == 'table' and reply.err then
    if sfind(reply.err, 'NOGROUP', 1, true) then nogroup[l] = true; return end
    error(reply.err)
  end
  if not reply or not reply[1] then drained[l] = true; return end
  c.stream = stream
  if #reply[1][2] < want then drained[l] = true end
  local rows = {l}
  out[#out + 1] = rows
  local k = 1
  for _, e in ipairs(reply[1][2]) do
    local entry, fields = e[1], e[2]
    local id
    for j = 1, #fields, 2 do
      if fields[j] == 'id' then id = fields[j + 1] end
    end
    got = got + 1
    local token = token_of(next_token)  -- (one per entry read: the worker counts them)
    next_token = next_token + 1
    if not id or not utf8_ok(id) then
      ack_del(stream, group, entry)
      rcall('XADD', c.dead, 'MAXLEN', '~', c.dead_maxlen, '*', 'job', '', 'reason',
        'malformed stream entry', 'etype', 'MalformedEntry', 'type', '', 't', c.now,
        'entry', entry, 'raw', ssub(cjson.encode(fields), 1, 500))
      c.failed = c.failed + 1
      rows[k + 1] = entry; rows[k + 2] = ''; rows[k + 3] = 'malformed stream entry'
      rows[k + 4] = 'dead'
    else
      local code, _, attempt, data, deadline, wait, age = start_entry(c, prefix .. id, entry,
        id, token, true)
      -- (a run's token is this token: a fresh entry of this consumer was never started
      -- under another of its tokens)
      rows[k + 1] = entry; rows[k + 2] = id; rows[k + 3] = data
      if code ~= 'run' then
        rows[k + 4] = code
      elseif attempt == 1 and deadline == 0 and wait == age then
        rows[k + 4] = wait
      else
        rows[k + 4] = {attempt, deadline, wait, age}
      end
    end
    k = k + 4
  end
end
for l = 1, levels do
  read(l, math.min(tonumber(ARGV[11 + l]) or 0, n - got))
end
for l = 1, levels do
  read(l, n - got)
end
local missing = {}
for l = 1, levels do
  if nogroup[l] then missing[#missing + 1] = l end
end
out[2] = table.concat(missing, ',')
if RL then
  out[4] = RL.rate_wait_ms(lim)
  RL.rate_save(lim)
end
count_starts(c)
if V1_KEPT then lib_cold().v1_restore() end  -- (layout-1 records read: back in layout 1)
return out
