"""What ``QueueConfig.min_replicas=1`` costs: enqueue latency and throughput, and a worker's
drain rate, with WAIT (1 replica) and without, on a loopback primary + replica.

``python -m benchmarks.durability_bench [--jobs 3000] [--drain 20000] [--reps 3] [--cluster]``.
The primary, its replica and three sentinels are private processes (``SentinelSet``); the
clients connect to the primary through the sentinel URL, as a user would. With ``--cluster``:
a loopback Redis Cluster of 3 primaries + 3 replicas (``ClusterServer``) instead, reached
through its ``redis+cluster://`` URL (each node's pipeline ends with its own WAIT). Per
repetition and setting:

- ``single``: one thread, ``enqueue`` one job after another: latency p50/p99 and jobs/s;
- ``threads``: 16 threads enqueueing at once (calls gather into auto-batches): jobs/s;
- ``many``: ``enqueue_many`` in batches of 100: jobs/s;
- ``drain``: one worker (concurrency 64) drains ``--drain`` no-op jobs: jobs/s (its settled
  batches WAIT too).

Results go to ``benchmarks/results/durability.json`` (``durability_cluster.json``); the
median of the repetitions is printed as a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import threading
import time
from pathlib import Path
from typing import Any

from streamq import Job, Queue, QueueConfig, Registry, Worker, WorkerConfig
from streamq._core.cluster_server import ClusterServer
from streamq._core.sentinels import SentinelSet

OUT = Path(__file__).parent / "results" / "durability.json"
OUT_CLUSTER = Path(__file__).parent / "results" / "durability_cluster.json"


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def _single(url: str, cfg: QueueConfig, jobs: int, tag: str) -> dict[str, float]:
    q = Queue.from_url(url, f"dur-single-{tag}", cfg)
    try:
        q.enqueue("t", job_id="warm-up")
        lat: list[float] = []
        t0 = time.perf_counter()
        for i in range(jobs):
            t = time.perf_counter()
            q.enqueue("t", {"i": i})
            lat.append((time.perf_counter() - t) * 1000)
        wall = time.perf_counter() - t0
    finally:
        q.close()
    return {"p50_ms": _pct(lat, 50), "p99_ms": _pct(lat, 99), "jobs_per_s": jobs / wall}


def _threads(url: str, cfg: QueueConfig, jobs: int, tag: str, n: int = 16) -> float:
    q = Queue.from_url(url, f"dur-threads-{tag}", cfg)
    per = jobs // n

    def work() -> None:
        for i in range(per):
            q.enqueue("t", {"i": i})

    try:
        ts = [threading.Thread(target=work) for _ in range(n)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return per * n / (time.perf_counter() - t0)
    finally:
        q.close()


def _many(url: str, cfg: QueueConfig, jobs: int, tag: str) -> float:
    q = Queue.from_url(url, f"dur-many-{tag}", cfg)
    try:
        t0 = time.perf_counter()
        for start in range(0, jobs, 100):
            q.enqueue_many([{"type": "t", "payload": {"i": i}} for i in range(start, start + 100)])
        return jobs / (time.perf_counter() - t0)
    finally:
        q.close()


def _drain(url: str, cfg: QueueConfig, jobs: int, tag: str) -> float:
    name = f"dur-drain-{tag}"
    q = Queue.from_url(url, name)  # filled without WAIT: only the worker's cost is measured
    try:
        for start in range(0, jobs, 1000):
            q.enqueue_many([{"type": "noop"} for _ in range(start, min(jobs, start + 1000))])
    finally:
        q.close()
    reg = Registry()

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        return None

    async def run() -> float:
        worker = Worker(url, [name], reg, WorkerConfig(concurrency=64, block_ms=100), cfg)
        async with worker:  # timed from the first completion (start-up is not the drain)
            t0, c0 = 0.0, 0
            while True:  # polled: a 10 ms tick is noise against the whole drain
                done = worker.stats.completed
                if not c0 and done:
                    t0, c0 = time.perf_counter(), done
                if done >= jobs:
                    break
                await asyncio.sleep(0.01)
            return (jobs - c0) / (time.perf_counter() - t0)

    return asyncio.run(run())


def measure(url: str, replicas: int, jobs: int, drain: int, tag: str) -> dict[str, Any]:
    cfg = QueueConfig(min_replicas=replicas, min_replicas_timeout_ms=5000)
    single = _single(url, cfg, jobs, tag)
    return {"min_replicas": replicas, **single,
            "threads_jobs_per_s": _threads(url, cfg, jobs, tag),
            "many_jobs_per_s": _many(url, cfg, jobs * 5, tag),
            "drain_jobs_per_s": _drain(url, cfg, drain, tag)}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--drain", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cluster", action="store_true",
                    help="a loopback Redis Cluster (3 primaries + 3 replicas)")
    args = ap.parse_args(argv)
    runs: list[dict[str, Any]] = []
    servers: SentinelSet | ClusterServer = (ClusterServer(primaries=3, replicas=1)
                                            if args.cluster else SentinelSet())
    with servers as s:
        url = s.url if isinstance(s, ClusterServer) else s.url()
        for rep in range(args.reps):
            for replicas in (0, 1):  # alternate, so drift hits both settings alike
                r = measure(url, replicas, args.jobs, args.drain, f"{rep}-{replicas}")
                r["rep"] = rep
                runs.append(r)
                print(json.dumps(r), flush=True)
        binary = s.binary
    out = OUT_CLUSTER if args.cluster else OUT
    keys = ("p50_ms", "p99_ms", "jobs_per_s", "threads_jobs_per_s", "many_jobs_per_s",
            "drain_jobs_per_s")
    median = {str(n): {k: statistics.median(r[k] for r in runs if r["min_replicas"] == n)
                       for k in keys} for n in (0, 1)}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "machine": f"{platform.machine()}, {platform.python_version()}",
                               "server": binary, "cluster": args.cluster,
                               "jobs": args.jobs, "drain": args.drain,
                               "runs": runs, "median": median}, indent=1) + "\n")
    print("\n| min_replicas | enqueue p50 | enqueue p99 | 1 thread | 16 threads |"
          " enqueue_many (100) | worker drain |")
    print("|---|---|---|---|---|---|---|")
    for n in ("0", "1"):
        m = median[n]
        print(f"| {n} | {m['p50_ms']:.3f} ms | {m['p99_ms']:.3f} ms | {m['jobs_per_s']:,.0f}/s"
              f" | {m['threads_jobs_per_s']:,.0f}/s | {m['many_jobs_per_s']:,.0f}/s"
              f" | {m['drain_jobs_per_s']:,.0f}/s |")


if __name__ == "__main__":
    main()
