-- timeseries.lua: add one worker's aggregated outcomes of a queue to its bounded time series
-- (minute buckets kept for ARGV[2] minutes, rolled up into hour buckets kept for ARGV[3]
-- hours). Each bucket is one HASH field, JSON: c (completed), f (failed), w and r (wait and
-- run time histograms: bucket index -> count, bounds in streamq/_core/timeseries.py), o (oldest
-- ready age seen, ms: read here, from the stream).
-- KEYS[1]   minute buckets HASH (field: epoch minute)
-- KEYS[2]   hour buckets HASH (field: epoch hour)
-- KEYS[3]   ready stream
-- ARGV[1]   consumer group
-- ARGV[2]   minutes to keep
-- ARGV[3]   hours to keep
-- ARGV[4]   completed
-- ARGV[5]   failed
-- ARGV[6]   wait histogram, 'index:count,index:count' ('' = none)
-- ARGV[7]   run histogram, same form
-- Returns the epoch minute written.
local minutes, hours, stream = KEYS[1], KEYS[2], KEYS[3]
local group, keep_m, keep_h = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local now = now_ms()
local minute, hour = math.floor(now / 60000), math.floor(now / 3600000)

-- the oldest ready (undelivered) entry's age
local oldest = 0
local ok, groups = pcall(redis.call, 'XINFO', 'GROUPS', stream)
if ok then
  for _, g in ipairs(groups) do
    local info = {}
    for i = 1, #g, 2 do info[g[i]] = g[i + 1] end
    if info['name'] == group then
      local first = rcall('XRANGE', stream, '(' .. info['last-delivered-id'], '+', 'COUNT', 1)
      if first[1] then
        local ms = tonumber(string.match(first[1][1], '^(%d+)'))
        if ms and now > ms then oldest = now - ms end
      end
    end
  end
end

local function parse_hist(text)
  local h = {}
  for idx, n in string.gmatch(text, '(%d+):(%d+)') do h[idx] = tonumber(n) end
  return h
end
local wait, run = parse_hist(ARGV[6]), parse_hist(ARGV[7])

local function merge(key, field)
  local raw = rcall('HGET', key, field)
  local b = {}
  if raw then
    local decoded_ok, decoded = pcall(cjson.decode, raw)
    if decoded_ok and type(decoded) == 'table' then b = decoded end
  end
  b.c = (tonumber(b.c) or 0) + tonumber(ARGV[4])
  b.f = (tonumber(b.f) or 0) + tonumber(ARGV[5])
  b.o = math.max(tonumber(b.o) or 0, oldest)
  for name, add in pairs({w = wait, r = run}) do
    local h = type(b[name]) == 'table' and b[name] or {}
    for idx, n in pairs(add) do h[idx] = (tonumber(h[idx]) or 0) + n end
    if next(h) then b[name] = h end
  end
  rcall('HSET', key, field, cjson.encode(b))
end

merge(minutes, minute)
merge(hours, hour)
-- bounded: drop what fell out of the window (all of it after a long pause: HLEN is checked)
rcall('HDEL', minutes, minute - keep_m)
rcall('HDEL', hours, hour - keep_h)
for _, pair in ipairs({{minutes, minute, keep_m}, {hours, hour, keep_h}}) do
  if rcall('HLEN', pair[1]) > pair[3] + 2 then
    for _, f in ipairs(rcall('HKEYS', pair[1])) do
      if tonumber(f) == nil or tonumber(f) <= pair[2] - pair[3] then
        rcall('HDEL', pair[1], f)
      end
    end
  end
end
return minute
