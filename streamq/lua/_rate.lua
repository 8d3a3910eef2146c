-- _rate.lua: the queue-wide rate limiter, appended by the script registry after _lib.lua and
-- _groups.lua and before every script. Functions only: no KEYS, no ARGV of its own. They are
-- made by lib_rate() (declared in _lib.lua, whose start_entry calls it) when a script call
-- first needs one, and returned in a table (as _lib.lua's lib_cold); the script registry
-- gives every script that names one a local of that name first (scripts.py cold_first).
-- The queue-wide rate limiter (docs/fairness.md#queue-wide-rate-limit): GCRA over the
-- theoretical arrival time (TAT, µs) kept in a STRING. A start at now conforms when
-- now >= TAT - tolerance; it moves TAT to max(TAT, now) + interval. At most limit starts
-- in any window of the period follow from interval = period / (limit - burst + 1) and
-- tolerance = (burst - 1) * interval. lim: {key, interval, tolerance} (interval 0: no
-- limit); its state is read once per script (rate_read) and written back once (rate_save).
local RATE = nil
function lib_rate()
  if RATE then return RATE end
  local now_us, rate_read, rate_allowed, rate_take, rate_wait_ms, rate_save
  function now_us()
    local t = rcall('TIME')
    return tonumber(t[1]) * 1000000 + tonumber(t[2])
  end

  function rate_read(lim)
    if lim.tat then return end
    lim.now = now_us()
    local tat = tonumber(rcall('GET', lim.key) or '') or 0
    if tat < lim.now then tat = lim.now end
    lim.tat, lim.tat0 = tat, tat
  end

  -- How many starts conform now (at most want).
  function rate_allowed(lim, want)
    if lim.interval <= 0 then return want end
    rate_read(lim)
    local room = lim.now + lim.tolerance - lim.tat
    if room < 0 then return 0 end
    return math.min(want, math.floor(room / lim.interval) + 1)
  end

  -- Take one start if it conforms (true), else false.
  function rate_take(lim)
    if lim.interval <= 0 then return true end
    if rate_allowed(lim, 1) < 1 then return false end
    lim.tat = lim.tat + lim.interval
    return true
  end

  -- ms until the next start conforms (0: now).
  function rate_wait_ms(lim)
    if lim.interval <= 0 or not lim.tat then return 0 end
    local w = lim.tat - lim.tolerance - lim.now
    if w <= 0 then return 0 end
    return math.ceil(w / 1000)
  end

  function rate_save(lim)
    if lim.interval <= 0 or not lim.tat or lim.tat == lim.tat0 then return end
    rcall('SET', lim.key, string.format('%.0f', lim.tat), 'PX',
      math.ceil((lim.tat - lim.now) / 1000) + 1000)
  end
  RATE = {now_us = now_us, rate_read = rate_read, rate_allowed = rate_allowed,
    rate_take = rate_take, rate_wait_ms = rate_wait_ms, rate_save = rate_save}
  return RATE
end
