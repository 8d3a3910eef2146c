-- progress.lua: write handlers' progress reports and log lines into their job records, fenced:
-- only while the job is 'active' under the reporting lease's token (a run whose lease was lost
-- writes nothing). Each report is also an event ('progress') and, for a job someone waits on,
-- a message on its notify channel ('progress'), so a waiter can follow it.
-- Safe to repeat: progress is a plain overwrite, and log lines carry a per-job sequence number
-- ('logseq' in the record holds the highest written), so a repeated call appends nothing.
-- KEYS[1]   events STREAM
-- KEYS[1+i] job record HASH of report i (i = 1..N)
-- ARGV[1]   events: max length and kinds (_lib.lua's emit; '0' = no events)
-- ARGV[2]   log lines kept per job (the oldest go first)
-- ARGV[3]   N, the number of reports
-- ARGV[4 + 4*(i-1) ..] per report i: job id, lease token, progress (JSON text, '' = none),
--           log lines (JSON array of {n = sequence, t = ms, m = text}, '' = none)
-- Returns per report: 1 written, 0 not (the lease is gone or the job finished)
local events, events_maxlen, keep = KEYS[1], ARGV[1], tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local now = now_ms()
local out = {}
for i = 1, n do
  local b = 4 + 4 * (i - 1)
  local id, token, progress, lines = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local jobkey = KEYS[1 + i]
  local r = rec(jobkey, false, 's', 'k', 'notify', 'logs', 'logseq')
  if r.err or r[1] ~= 'active' or r[2] ~= token then
    out[i] = 0
  else
    local detail = progress
    if progress ~= '' then rcall('HSET', jobkey, 'progress', progress) end
    if lines ~= '' then
      local kept = {}
      if r[4] then
        local ok, decoded = pcall(cjson.decode, r[4])
        if ok and type(decoded) == 'table' then kept = decoded end
      end
      local seq = tonumber(r[5]) or 0
      for _, line in ipairs(cjson.decode(lines)) do
        if tonumber(line.n) > seq then
          kept[#kept + 1] = line
          seq = tonumber(line.n)
          if detail == '' then detail = line.m end
        end
      end
      while #kept > keep do table.remove(kept, 1) end
      rcall('HSET', jobkey, 'logs', cjson.encode(kept), 'logseq', seq)
    end
    if detail ~= '' then
      emit(events, events_maxlen, id, 'progress', now, ssub(detail, 1, 200))
      notify(r[3], 'progress', id)
    end
    out[i] = 1
  end
end
v1_restore()  -- (layout-1 records read here: back in layout 1)
return out
