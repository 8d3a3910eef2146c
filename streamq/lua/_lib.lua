-- _lib.lua: shared helpers, prepended by the script registry to every other script.
-- It defines functions only; it reads no KEYS and no ARGV of its own.
-- Conventions used by all scripts: times are milliseconds from the server's TIME;
-- an events/dead max length of 0 disables that stream; every key arrives in KEYS.

local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local function emit(events, maxlen, job_id, ev, now, detail)
  if tonumber(maxlen) > 0 then
    redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*',
      'job', job_id, 'ev', ev, 't', now, 'd', detail or '')
  end
end

local function ack_del(stream, group, entry)
  if entry and entry ~= '' then
    redis.call('XACK', stream, group, entry)
    redis.call('XDEL', stream, entry)
  end
end

local function notify(jobkey, job_id, state)
  local ch = redis.call('HGET', jobkey, 'notify')
  if ch and ch ~= '' then
    redis.call('PUBLISH', ch, state)
  end
end

-- Wake sleepers (scheduler, promoters) when a job becomes due sooner than anything else.
local function wake_if_sooner(delayed, channel, due)
  if channel == '' then return end
  local first = redis.call('ZRANGE', delayed, 0, 0, 'WITHSCORES')
  if first[2] == nil or tonumber(first[2]) >= due then
    redis.call('PUBLISH', channel, due)
  end
end

-- Dead-letter a job: terminal 'failed' state, dead index entry, retention TTL, waiters told.
local function bury(jobkey, dead, stats, events, job_id, reason, err, etype, now,
                    dead_ttl, dead_maxlen, events_maxlen)
  redis.call('HSET', jobkey, 'state', 'failed', 'finished', now, 'reason', reason)
  if err and err ~= '' then redis.call('HSET', jobkey, 'error', err) end
  local jtype = redis.call('HGET', jobkey, 'type') or ''
  if tonumber(dead_maxlen) > 0 then
    redis.call('XADD', dead, 'MAXLEN', '~', dead_maxlen, '*', 'job', job_id,
      'reason', reason, 'etype', etype or '', 'type', jtype, 't', now)
  end
  if tonumber(dead_ttl) > 0 and redis.call('EXISTS', jobkey) == 1 then
    redis.call('EXPIRE', jobkey, dead_ttl)
  end
  redis.call('HINCRBY', stats, 'failed', 1)
  emit(events, events_maxlen, job_id, 'failed', now, reason)
  notify(jobkey, job_id, 'failed')
end
