"""Redis CPU floor per job lifecycle: ``python -m benchmarks.floor [--jobs 20000] [--runs 3]``.

A fixed workload: N no-op jobs enqueued with ``enqueue_many``, then drained by one worker
process (``benchmarks.worker_proc``, concurrency 100), against a private redis-server.

``--callgrind``: redis-server runs under ``valgrind --tool=callgrind`` with instrumentation off;
instrumentation is switched on for the enqueue and dumped, then for the drain and dumped, so the
figures are redis-server instructions per job in each phase (which do not depend on the
machine's load), plus the inclusive instructions per job of the server functions named in
``FUNCS`` (where the time goes). Without it: ``INFO cpu`` per job in each phase, ``--runs``
times, medians (noisy on a busy machine: read them with the load average printed).
``worker_us`` is the worker process's CPU from before its start to its stop, per job;
``worker_run_us`` leaves out what it spent before its first handler started (imports done
lazily, script loads, connections, the group's creation): the steady cost per drained job.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from streamq import Queue
from streamq._core.server import RedisServer, free_port

from .workloads import REPO, _env, _jobs, _last_json, redis_cpu_s, worker_cmd

FUNCS = ("evalGenericCommand", "luaCallFunction", "luaRedisGenericCommand", "call",
         "hsetCommand", "hmgetCommand", "hgetallCommand", "xaddCommand", "xreadCommand",
         "xackCommand", "xclaimCommand", "expireCommand", "delCommand", "hincrbyCommand",
         "xtrimCommand", "xdelCommand", "readQueryFromClient", "writeToClient",
         "luaCreateArray", "lua_pushstring", "luaSetTableProtectedRecursively",
         "luaSetErrorMetatable", "redisProtocolToLuaType", "luaReplyToRedisReply",
         "lua_gc", "luaC_step", "luaV_execute", "luaD_precall", "luaH_new", "luaS_newlstr",
         "processCommand", "lookupCommand", "createStringObject")


def _drain(url: str, n: int) -> dict[str, Any]:
    cmd = worker_cmd(url, "floor", "drain", "--jobs", str(n), "--concurrency", "100")
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=_env(),
                          timeout=1800, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"drain worker failed: {proc.stderr[-2000:]}")
    return _last_json(proc.stdout)


def cpu_run(n: int) -> dict[str, float]:
    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url)
        with Queue.from_url(srv.url, "floor") as q:
            c0 = redis_cpu_s(client)
            q.enqueue_many(_jobs(n))
            c1 = redis_cpu_s(client)
        out = _drain(srv.url, n)
        c2 = redis_cpu_s(client)
        used = int(client.info("memory")["used_memory"])
    run_s = float(out["cpu_s"]) - float(out.get("cpu_start_s") or 0.0)
    return {"enqueue_us": (c1 - c0) / n * 1e6, "drain_us": (c2 - c1) / n * 1e6,
            "worker_us": float(out["cpu_s"]) / n * 1e6, "worker_run_us": run_s / n * 1e6,
            "used_memory_end": used}


def _calls(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {k.removeprefix("cmdstat_"): int(v["calls"]) for k, v in stats.items()}


def _ctl(pid: int, *args: str) -> None:
    subprocess.run(["callgrind_control", *args, str(pid)], check=True, capture_output=True)


def _total(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def _inclusive(path: Path) -> dict[str, int]:
    out = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                          str(path)], capture_output=True, text=True, check=True).stdout
    found: dict[str, int] = {}
    for line in out.splitlines():
        m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?\S*?:(\w+)\b", line)
        if m and m.group(2) in FUNCS and m.group(2) not in found:
            found[m.group(2)] = int(m.group(1).replace(",", ""))
    return found


def callgrind_run(n: int, binary: str, keep: Path | None = None) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="floor-cg-"))
    port = free_port()
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--instr-atstart=no",
         f"--callgrind-out-file={tmp}/cg.%p", binary, "--port", str(port),
         "--bind", "127.0.0.1", "--dir", str(tmp), "--save", "", "--appendonly", "no",
         "--daemonize", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        client = redis.Redis.from_url(url)
        deadline = time.monotonic() + 120
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        res: dict[str, Any] = {}
        with Queue.from_url(url, "warm") as w:  # scripts loaded before collection starts
            w.enqueue_many(_jobs(2))
        with Queue.from_url(url, "floor") as q:
            _ctl(proc.pid, "-i", "on")
            q.enqueue_many(_jobs(n))
            _ctl(proc.pid, "-d", "enqueue")
        s0 = _calls(client)
        _drain(url, n)
        _ctl(proc.pid, "-d", "drain")
        _ctl(proc.pid, "-i", "off")
        s1 = _calls(client)
        # script calls per drained job vary with the batches the worker made (timing): read
        # the drain's instructions per job together with them
        res["drain_calls_per_job"] = {k: round((v - s0.get(k, 0)) / n, 4)
                                      for k, v in s1.items() if v - s0.get(k, 0) >= n // 100}
        for phase in ("enqueue", "drain"):
            files = [p for p in tmp.glob("cg.*") if _dump_part(p) == phase]
            if len(files) != 1:
                raise SystemExit(f"dump for {phase}: {files}")
            res[phase] = {"ir_per_job": _total(files[0]) / n,
                          "funcs_per_job": {k: v / n for k, v in
                                            _inclusive(files[0]).items()}}
        return res
    finally:
        proc.terminate()
        proc.wait(timeout=120)
        if keep:
            keep.mkdir(parents=True, exist_ok=True)
            for p in tmp.glob("cg.*"):
                shutil.copy(p, keep / f"{_dump_part(p) or 'rest'}.callgrind")
        shutil.rmtree(tmp, ignore_errors=True)


def _dump_part(path: Path) -> str:
    with path.open(errors="replace") as f:
        for line in f:
            if line.startswith("desc: Trigger:"):
                return line.rsplit(" ", 1)[-1].strip().strip("'")
            if line.startswith("fn=") or line.startswith("summary"):
                break
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--keep", type=Path, default=None, help="callgrind: copy the dumps here")
    ap.add_argument("--binary", default=os.environ.get("STREAMQ_REDIS_SERVER", "redis-server"))
    args = ap.parse_args(argv)
    load = Path("/proc/loadavg").read_text().split()[:3]
    if args.callgrind:
        res = callgrind_run(args.jobs, args.binary, args.keep)
        res["jobs"] = args.jobs
        res["lifecycle_ir_per_job"] = res["enqueue"]["ir_per_job"] + res["drain"]["ir_per_job"]
    else:
        runs = [cpu_run(args.jobs) for _ in range(args.runs)]
        res = {"jobs": args.jobs, "runs": runs,
               **{f"median_{k}": statistics.median(r[k] for r in runs)
                  for k in ("enqueue_us", "drain_us", "worker_us", "worker_run_us")}}
        res["median_lifecycle_us"] = res["median_enqueue_us"] + res["median_drain_us"]
    res["loadavg_before"] = load
    res["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
