"""Groups' cost in a drain: ``python -m benchmarks.groups_bench [--jobs 20000] [--reps 1]``.

The same number of pre-enqueued no-op jobs drained by one worker process (concurrency 100),
each run against a fresh private redis-server:

1. ungrouped (today's path);
2. spread over 1,000 groups (job i in group ``g<i % 1000>``) with a limit of 10 each
   (``QueueConfig.group_concurrency=10``): every admission, start and settle goes through the
   group scripts (docs/fairness.md#groups).

Prints jobs/s, worker and redis-server CPU per job, and the grouped / ungrouped rate ratio
(issue 17's target: at least 0.5) as Markdown.
"""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Sequence
from typing import Any

import redis

from streamq import Queue, QueueConfig
from streamq._core.server import RedisServer

from .workloads import REPO, _env, _jobs, _last_json, redis_cpu_s, worker_cmd

GROUPS = 1000
LIMIT = 10


def drain(n: int, grouped: bool) -> dict[str, float]:
    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url)
        cfg = QueueConfig(group_concurrency=LIMIT)
        jobs: list[dict[str, Any]] = _jobs(n)
        if grouped:
            for i, j in enumerate(jobs):
                j["group"] = f"g{i % GROUPS}"
        with Queue.from_url(srv.url, "gb", config=cfg) as q:
            q.enqueue_many(jobs)
        cpu0 = redis_cpu_s(client)
        extra = ["--group-concurrency", str(LIMIT)] if grouped else []
        proc = subprocess.run(worker_cmd(srv.url, "gb", "drain", "--jobs", str(n),
                                         "--concurrency", "100", *extra),
                              capture_output=True, text=True, cwd=REPO, env=_env(),
                              timeout=900, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"drain worker failed: {proc.stderr[-2000:]}")
        out = _last_json(proc.stdout)
        rcpu = redis_cpu_s(client) - cpu0
        left = int(client.zcard(q.keys.group_inflight)) + int(client.zcard(q.keys.group_wait))
        if left:
            raise SystemExit(f"{left} group members left after the drain")
        client.close()
        return {"rate": n / float(out["wall_s"]), "worker_us": float(out["cpu_s"]) / n * 1e6,
                "redis_us": rcpu / n * 1e6}


def report(n: int, reps: int) -> str:
    rows: dict[str, list[dict[str, float]]] = {"ungrouped": [], "grouped": []}
    for _ in range(reps):  # interleaved, so a busy spell of the machine hits both
        rows["ungrouped"].append(drain(n, False))
        rows["grouped"].append(drain(n, True))

    def best(name: str, key: str) -> float:
        vals = [r[key] for r in rows[name]]
        return max(vals) if key == "rate" else min(vals)

    lines = [f"# Groups drain: {n:,} no-op jobs, one worker process, concurrency 100,"
             f" best of {reps}", "",
             "| drain | jobs/s | worker CPU µs/job | redis-server CPU µs/job |",
             "|---|--:|--:|--:|"]
    for name, label in (("ungrouped", "ungrouped"),
                        ("grouped", f"{GROUPS:,} groups, limit {LIMIT}")):
        lines.append(f"| {label} | {best(name, 'rate'):,.0f} | {best(name, 'worker_us'):.1f}"
                     f" | {best(name, 'redis_us'):.1f} |")
    ratio = best("grouped", "rate") / best("ungrouped", "rate")
    lines += ["", f"grouped / ungrouped rate: {ratio:.2f} (target >= 0.5)"]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.groups_bench")
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--reps", type=int, default=1)
    args = p.parse_args(argv)
    print(report(args.jobs, args.reps))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
