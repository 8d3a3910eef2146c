"""Priorities' cost and effect in a drain: ``python -m benchmarks.priority_bench [--jobs 20000]
[--reps 1]``.

The same number of pre-enqueued no-op jobs drained by one worker process (concurrency 100),
each run against a fresh private redis-server:

1. unprioritised (every job at the default level: one ready stream);
2. spread over the five levels (job i at priority ``i % 5``, enqueued in that order, so every
   level holds a fifth of the backlog from the start): the worker reads the five streams in
   weighted order (``QueueConfig.priority_weights``, default 1:2:4:8:16; docs/fairness.md).

Prints jobs/s, worker and redis-server CPU per job, the prioritised / unprioritised rate
ratio, and for the prioritised drain each level's median finish time as a share of the
drain's length (what the weights buy: the higher the level, the earlier its jobs finish).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
from collections.abc import Sequence
from typing import Any

import redis

from streamq import Queue
from streamq._core.keys import PRIORITIES
from streamq._core.server import RedisServer

from .workloads import REPO, _env, _jobs, _last_json, redis_cpu_s, worker_cmd


def drain(n: int, prioritised: bool) -> dict[str, Any]:
    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url)
        jobs: list[dict[str, Any]] = _jobs(n)
        if prioritised:
            for i, j in enumerate(jobs):
                j["priority"] = PRIORITIES[i % len(PRIORITIES)]
        with Queue.from_url(srv.url, "pb") as q:
            ids = [r.job_id for r in q.enqueue_many(jobs)]
            cpu0 = redis_cpu_s(client)
            proc = subprocess.run(worker_cmd(srv.url, "pb", "drain", "--jobs", str(n),
                                             "--concurrency", "100"),
                                  capture_output=True, text=True, cwd=REPO, env=_env(),
                                  timeout=900, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"drain worker failed: {proc.stderr[-2000:]}")
            out = _last_json(proc.stdout)
            rcpu = redis_cpu_s(client) - cpu0
            finished: dict[int, list[float]] = {p: [] for p in PRIORITIES}
            for i, jid in enumerate(ids):
                info = q.get(jid)
                if info is None or info.state != "completed" or info.finished_at is None:
                    raise SystemExit(f"job {jid} did not complete: {info}")
                level = PRIORITIES[i % len(PRIORITIES)] if prioritised else 2
                finished[level].append(info.finished_at.timestamp())
        client.close()
        first = min(min(v) for v in finished.values() if v)
        last = max(max(v) for v in finished.values() if v)
        span = max(last - first, 1e-9)
        return {"rate": n / float(out["wall_s"]), "worker_us": float(out["cpu_s"]) / n * 1e6,
                "redis_us": rcpu / n * 1e6,
                "finish_share": {p: statistics.median(v) - first for p, v in finished.items()
                                 if v} | {"span": span}}


def report(n: int, reps: int) -> str:
    rows: dict[str, list[dict[str, Any]]] = {"plain": [], "prioritised": []}
    for _ in range(reps):  # interleaved, so a busy spell of the machine hits both
        rows["plain"].append(drain(n, False))
        rows["prioritised"].append(drain(n, True))

    def best(name: str, key: str) -> float:
        vals = [float(r[key]) for r in rows[name]]
        return max(vals) if key == "rate" else min(vals)

    lines = [f"# Prioritised drain: {n:,} no-op jobs, one worker process, concurrency 100,"
             f" best of {reps}", "",
             "| drain | jobs/s | worker CPU µs/job | redis-server CPU µs/job |",
             "|---|--:|--:|--:|"]
    for name, label in (("plain", "unprioritised (one stream)"),
                        ("prioritised", "five levels, a fifth of the jobs each")):
        lines.append(f"| {label} | {best(name, 'rate'):,.0f} | {best(name, 'worker_us'):.1f}"
                     f" | {best(name, 'redis_us'):.1f} |")
    ratio = best("prioritised", "rate") / best("plain", "rate")
    lines += ["", f"prioritised / unprioritised rate: {ratio:.2f}", "",
              "Median finish time of each level's jobs, as a share of the prioritised drain"
              " (last run; weights 1:2:4:8:16):", "",
              "| priority | median finish |", "|--:|--:|"]
    shares = rows["prioritised"][-1]["finish_share"]
    for p in sorted(PRIORITIES, reverse=True):
        lines.append(f"| {p} | {shares[p] / shares['span']:.0%} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.priority_bench")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--reps", type=int, default=1)
    args = p.parse_args(argv)
    print(report(args.jobs, args.reps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
