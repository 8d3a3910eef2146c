-- ticket.lua: an idle worker offers to take the next job straight from the producer's
-- enqueue (a hand-off ticket, docs/performance.md#hand-off), or withdraws that offer; and
-- collects what was handed to it since its last read.
-- A ticket is a member of the lane's tickets ZSET, scored with the server time (ms) until
-- which it holds. The member is fixed per worker and lane (a re-post refreshes it):
-- '<inbox key>|<consumer>|<token prefix>|<events arg>|<dead retention s>|<dead max length>'.
-- enqueue.lua takes one ticket per job it adds to the ready stream (ZREM), reads that stream
-- for the ticket's consumer (XREADGROUP: the entry lands in that worker's pending list, as a
-- claim's would), starts the job there (_lib.lua's start_entry) and writes the start to the
-- worker's inbox STREAM; the worker is blocked reading its inbox beside the ready stream, so
-- it wakes with a started job: no start round trip between the enqueue and the handler.
-- Safe to repeat: posting sets the same member's score again, withdrawing removes it again,
-- acknowledging an acknowledged entry does nothing. A repeat after a lost reply does not see
-- again the inbox entries the lost call read (they were read with '>'); their jobs are in the
-- worker's pending list of the ready stream under its token prefix, where the worker's read
-- of its own pending entries finds them (start.lua answers each as the same start).
-- KEYS[1]   tickets ZSET of the ready stream (Keys.tickets)
-- KEYS[2]   the caller's inbox STREAM (Keys.inbox), in the consumer group ARGV[3]
-- ARGV[1]   the caller's ticket member
-- ARGV[2]   ms the ticket holds for (0 = withdraw it)
-- ARGV[3]   consumer group
-- ARGV[4]   consumer name
-- ARGV[5..] inbox entries the caller has read (acknowledged and deleted)
-- Returns {1 if the ticket was still there before this call else 0, then 10 per inbox entry
--           not yet read: inbox entry id, then enqueue.lua's start of the job: stream entry
--           id, job id, code, token, attempt, data, deadline ms, ms in the stream, age ms}.
local tickets, inbox = KEYS[1], KEYS[2]
local member, hold, group, consumer = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4]
local now = now_ms()
if #ARGV > 4 then
  rcall('XACK', inbox, group, unpack(ARGV, 5))
  rcall('XDEL', inbox, unpack(ARGV, 5))
end
rcall('ZREMRANGEBYSCORE', tickets, '-inf', '(' .. now)  -- lapsed (their worker is gone)
local out = {0}  -- out[1]: whether the ticket was there, told by the ZADD or ZREM below
local reply = rpcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 100,
  'STREAMS', inbox, '>')
if type(reply) == 'table' and reply.err then
  if not sfind(reply.err, 'NOGROUP', 1, true) then error(reply.err) end
  if hold > 0 then
    -- no inbox yet (or it lapsed): made with its group at the start (it gets its TTL
    -- below), so that an entry a producer wrote meanwhile is read
    rcall('XGROUP', 'CREATE', inbox, group, '0', 'MKSTREAM')
    reply = rcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', 100,
      'STREAMS', inbox, '>')
  else
    reply = nil  -- withdrawing: no inbox is made (it would have no TTL); none was used
  end
end
if reply and reply[1] then
  for _, e in ipairs(reply[1][2]) do
    local f = e[2]
    local v = {}
    for j = 1, #f, 2 do v[f[j]] = f[j + 1] end
    local k = #out
    out[k + 1] = e[1]; out[k + 2] = v.e or ''; out[k + 3] = v.id or ''
    out[k + 4] = v.c or 'skip'; out[k + 5] = v.k or ''; out[k + 6] = v.n or 0
    out[k + 7] = v.d or ''; out[k + 8] = v.dl or 0; out[k + 9] = v.w or 0
    out[k + 10] = v.a or 0
  end
end
if hold > 0 then
  -- a worker that is gone leaves an inbox that lapses on its own
  rcall('EXPIRE', inbox, math.ceil(hold / 1000) + 60)
  -- last: a call that failed posted nothing (its reply: 0 when the member was there, unless
  -- it lapsed: removed above)
  if rcall('ZADD', tickets, now + hold, member) == 0 then out[1] = 1 end
  rcall('EXPIRE', tickets, math.ceil(hold / 1000) + 60)  -- gone once no worker posts
else
  out[1] = rcall('ZREM', tickets, member)
end
return out
