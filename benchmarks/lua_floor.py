"""What a job lifecycle in Lua costs at the least: ``python -m benchmarks.lua_floor``.

Not streamq's scripts: three minimal scripts that make the same writes as streamq's common path
for a no-op job, and nothing else (no checks, no events, no fallbacks), measured with callgrind
in redis-server instructions per job (independent of the machine's load):

- enqueue, ``--batch`` jobs per call: one EXISTS over the batch's records, then per job XADD
  ``id <id>`` and HSET of the record (``s q b <body> e <entry id>``), one HINCRBY;
- claim, 75 entries per call: XREADGROUP, then per entry the start (steps G and S below) and a
  reply of 4 elements per entry;
- finish, 75 jobs per call: per job the fence check (M), the completion (F) and the result TTL
  (E), then one XACK and one XDEL for the batch, one HINCRBY.

The drain is measured once per step set, each adding one per-job command to the one before:
``x`` none (stream only: XREADGROUP, XACK, XDEL and the calls themselves), ``G`` HGETALL of the
record at the start, ``S`` HSET of the lease (6 fields, as start_entry writes), ``M`` HMGET of
``s k z`` at the finish, ``F`` HSET of ``s c f <now>``, ``E`` EXPIRE. ``GSMFE`` is the least
a lifecycle keeping a fenced record costs in Lua on that server: compare it with
``python -m benchmarks.floor --callgrind`` (streamq's own scripts) and with the issue's goal
(docs/performance.md, "The floor a fenced record sets").

Then the other contracts, each a step set of its own (enqueue measured per set):
``P`` the fence is the entry's place in the finishing consumer's pending list (one XPENDING
of the batch's count per finish call, instead of M's HMGET per job); ``R`` no EXPIRE: one
ZADD per finish call of every completed record's due time, for a reaper to delete (the
reaper's DELs are not counted, as the expiry of E's keys is not); ``B`` the body in the
stream entry (``id <id> b <body>``), the record without it, so the start reads no record.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from streamq._core.server import free_port

from .floor import _ctl, _dump_part, _total

ENQ = r"""
local n = (#ARGV - 1) / 2
local inline = ARGV[#ARGV]:find('B', 1, true)
redis.call('EXISTS', unpack(KEYS, 3, 2 + n))
for i = 1, n do
  if inline then  -- B: the body in the stream entry, not in the record
    local e = redis.call('XADD', KEYS[1], '*', 'id', ARGV[2 * i - 1], 'b', ARGV[2 * i])
    redis.call('HSET', KEYS[2 + i], 's', 'q', 'e', e)
  else
    local e = redis.call('XADD', KEYS[1], '*', 'id', ARGV[2 * i - 1])
    redis.call('HSET', KEYS[2 + i], 's', 'q', 'b', ARGV[2 * i], 'e', e)
  end
end
redis.call('HINCRBY', KEYS[2], 'enqueued', n)
return n
"""

CLAIM = r"""
local steps = ARGV[5]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local reply = redis.call('XREADGROUP', 'GROUP', 'g', ARGV[1], 'COUNT', ARGV[2],
  'STREAMS', KEYS[1], '>')
local out = {}
if not reply then return out end
local prefix, k = ARGV[3], 0
local get, set = steps:find('G', 1, true), steps:find('S', 1, true)
local inline = steps:find('B', 1, true)
for _, e in ipairs(reply[1][2]) do
  local id = e[2][2]
  local key = prefix .. id
  local body = 'x'
  if inline then body = e[2][4] end
  if get then
    local h = redis.call('HGETALL', key)
    for j = 1, #h, 2 do if h[j] == 'b' then body = h[j + 1] end end
  end
  k = k + 1
  local tok = ARGV[4] .. k
  if set then
    redis.call('HSET', key, 's', 'a', 'n', '1', 'k', tok, 'o', ARGV[1], 'a', now, 'z', '')
  end
  out[#out + 1] = e[1]; out[#out + 1] = id; out[#out + 1] = tok; out[#out + 1] = body
end
return out
"""

FINISH = r"""
local steps = KEYS[3]
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
local prefix = ARGV[1]
local check, done = steps:find('M', 1, true), steps:find('F', 1, true)
local ttl, reap = steps:find('E', 1, true), steps:find('R', 1, true)
local owned
if steps:find('P', 1, true) then  -- P: the fence is the entry's place in this consumer's PEL
  owned = {}
  local n = (#ARGV - 1) / 3
  for _, p in ipairs(redis.call('XPENDING', KEYS[1], 'g', '-', '+', n, KEYS[4])) do
    owned[p[1]] = true
  end
end
local ents, due = {}, {}
for i = 2, #ARGV, 3 do
  local key = prefix .. ARGV[i]
  local ok = true
  if check then ok = redis.call('HMGET', key, 's', 'k', 'z')[2] == ARGV[i + 1] end
  if owned then ok = owned[ARGV[i + 2]] end
  if ok then
    if done then redis.call('HSET', key, 's', 'c', 'f', now) end
    if ttl then redis.call('EXPIRE', key, 3600) end
    if reap then due[#due + 1] = now + 3600000; due[#due + 1] = key end
    ents[#ents + 1] = ARGV[i + 2]
  end
end
if reap and #due > 0 then  -- R: one ZADD of the batch's records for a reaper to delete
  redis.call('ZADD', KEYS[5], unpack(due))
end
redis.call('XACK', KEYS[1], 'g', unpack(ents))
redis.call('XDEL', KEYS[1], unpack(ents))
redis.call('HINCRBY', KEYS[2], 'completed', #ents)
return #ents
"""

STEPS = ("x", "G", "GS", "GSM", "GSMF", "GSMFE", "GPFE", "GSPFE", "GSMFR", "GPFR", "BPFE",
         "BPFR")
PREFIX, STREAM, STATS = "lf:{q}:job:", "lf:{q}:stream", "lf:{q}:stats"
REAP = "lf:{q}:reap"


class _Server:
    """redis-server under callgrind, instrumentation off until measure() switches it on."""

    def __init__(self, binary: str) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix="lua-floor-"))
        port = free_port()
        self.proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no",
             f"--callgrind-out-file={self.tmp}/cg.%p", binary, "--port", str(port),
             "--bind", "127.0.0.1", "--dir", str(self.tmp), "--save", "",
             "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.client = redis.Redis(host="127.0.0.1", port=port, protocol=2)
        deadline = time.monotonic() + 120
        while True:
            try:
                self.client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        self.dumps = 0

    def measure(self, fn: Callable[[], None]) -> int:
        self.dumps += 1
        name = f"m{self.dumps}"
        _ctl(self.proc.pid, "-i", "on")
        fn()
        _ctl(self.proc.pid, "-d", name)
        _ctl(self.proc.pid, "-i", "off")
        for path in self.tmp.glob("cg.*"):
            if _dump_part(path) == name:
                return _total(path)
        raise SystemExit(f"no callgrind dump {name}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=120)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _one(n: int, batch: int, binary: str, steps: str) -> tuple[float, float, str]:
    """(enqueue, drain) instructions per job of one step set, on a server of its own (a
    second enqueue measured on the same server read a wrapped, negative total)."""
    srv = _Server(binary)
    try:
        r = srv.client
        enq, claim, fin = (r.register_script(s) for s in (ENQ, CLAIM, FINISH))
        for script in (enq, claim, fin):  # loaded before anything is measured
            r.script_load(script.script)
        r.xgroup_create(STREAM, "g", id="0", mkstream=True)
        ids = [os.urandom(11).hex() for _ in range(n)]

        def do_enqueue() -> None:
            for i in range(0, n, batch):
                chunk = ids[i:i + batch]
                args: list[str] = []
                for j, x in enumerate(chunk):
                    args += [x, f'noop {{"n":{i + j}}}']
                enq(keys=[STREAM, STATS, *(PREFIX + x for x in chunk)], args=[*args, steps])

        def do_drain() -> None:
            while True:
                rep: list[bytes] = claim(keys=[STREAM], args=["c1", 75, PREFIX, "w1:", steps])
                if not rep:
                    return
                args: list[Any] = [PREFIX]
                for j in range(0, len(rep), 4):
                    args += [rep[j + 1], rep[j + 2], rep[j]]
                fin(keys=[STREAM, STATS, steps, "c1", REAP], args=args)

        enqueued = srv.measure(do_enqueue) / n
        drained = srv.measure(do_drain) / n
        if r.xlen(STREAM) != 0:
            raise SystemExit(f"{steps}: the stream was not drained")
        return enqueued, drained, str(r.info("server").get("redis_version"))
    finally:
        srv.close()


def run(n: int, batch: int, binary: str, steps: tuple[str, ...] = STEPS) -> dict[str, Any]:
    out: dict[str, Any] = {"jobs": n, "enqueue_batch": batch, "binary": binary}
    drains: dict[str, float] = {}
    enqueues: dict[str, float] = {}
    for s in steps:
        enqueues[s], drains[s], out["server"] = _one(n, batch, binary, s)
    out["enqueue_ir_per_job"] = round(enqueues[steps[0]])
    out["enqueue_ir_per_job_by_steps"] = {k: round(v) for k, v in enqueues.items()}
    out["drain_ir_per_job"] = {k: round(v) for k, v in drains.items()}
    out["lifecycle_ir_per_job"] = {k: round(v + enqueues[k]) for k, v in drains.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.lua_floor")
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=500, help="jobs per enqueue call")
    ap.add_argument("--binary", default=os.environ.get("STREAMQ_REDIS_SERVER", "redis-server"))
    ap.add_argument("--steps", default=",".join(STEPS), help="step sets, comma-separated")
    args = ap.parse_args(argv)
    print(json.dumps(run(args.jobs, args.batch, args.binary, tuple(args.steps.split(","))),
                     indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
