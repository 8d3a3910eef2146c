"""Scheduler figures: due -> in-stream latency for delayed jobs, Redis commands/s when idle.

``python -m benchmarks.scheduler_bench [--jobs 10000] [--spread 5] [--idle 10]``. One
scheduler process (``streamq scheduler``) against a private redis-server; no workers, so the
latency measured is the scheduler's alone. Both ends are server times: the job's due time
(ZSET score) and the time promote.lua moved it (the record's ``enqueued`` field).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

import redis

from streamq import Queue
from streamq._core.model import entry_id
from streamq._core.server import RedisServer


def _pct(values: list[int], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def _commands(client: redis.Redis) -> int:
    stats: Any = client.info("stats")
    return int(stats["total_commands_processed"])


def run(jobs: int, spread_s: float, idle_s: float) -> dict[str, Any]:
    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url)
        q = Queue.from_url(srv.url, "sched-bench")
        proc = subprocess.Popen([sys.executable, "-m", "streamq", "scheduler", "--url", srv.url,
                                 "--queue", q.name, "--poll-interval", "30"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            before = _commands(client)
            time.sleep(idle_s)
            idle_rate = (_commands(client) - before - 2) / idle_s  # minus our own INFO calls
            q.enqueue_many([{"type": "t", "job_id": f"j{i}", "delay": 1.0 + spread_s * i / jobs}
                            for i in range(jobs)])
            deadline = time.monotonic() + spread_s + 30
            while client.zcard(q.keys.delayed) and time.monotonic() < deadline:
                time.sleep(0.1)
            pipe = client.pipeline(transaction=False)
            for i in range(jobs):
                pipe.hmget(q.keys.job(f"j{i}"), "due", "e")  # e: the entry, its ms = enqueued
            lat = [int(entry_id(e).partition("-")[0]) - int(d) for d, e in pipe.execute()
                   if d and e]
        finally:
            proc.terminate()
            proc.wait(10)
        info: Any = client.info("server")
        return {
            "jobs": jobs, "spread_s": spread_s, "promoted": len(lat),
            "fire_latency_ms": {"p50": statistics.median(lat), "p99": _pct(lat, 99),
                                "max": max(lat), "min": min(lat)},
            "idle_commands_per_s": round(idle_rate, 3),
            "redis_version": info["redis_version"],
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--spread", type=float, default=5.0, help="seconds over which jobs fall due")
    ap.add_argument("--idle", type=float, default=10.0, help="seconds of idle measurement")
    args = ap.parse_args(argv)
    result = run(args.jobs, args.spread, args.idle)
    print(json.dumps(result, indent=2))
    return 0 if result["promoted"] == args.jobs else 1


if __name__ == "__main__":
    raise SystemExit(main())
