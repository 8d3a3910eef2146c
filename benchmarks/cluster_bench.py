"""Redis Cluster figures next to one server: bulk enqueue, drain, enqueue -> start latency,
and how the Redis CPU of a drain splits over the primaries.

The cluster table of issue 32 (one server; cluster unsharded and sharded; with and without
replicas; native CPU and callgrind instructions) comes from ``benchmarks.shard_bench``, one
harness for every setup; this one adds bulk enqueue and enqueue -> start latency over three
unsharded queues, and is kept for them.

``python -m benchmarks.cluster_bench [--jobs 20000] [--concurrency 100] [--repeat 3] [--json]
[--out FILE]``. A private 3-primary loopback cluster (no replicas: they would only add load on a
small machine) and a private redis-server; three queues whose slots live on the three
primaries; one worker in this process (no-op handler). The drain's worker CPU is this
process's CPU time while only the worker runs (``time.process_time``); Redis CPU is each
server's ``INFO cpu``; script calls per job come from ``INFO commandstats`` (EVALSHA). Every
figure is the median of ``--repeat`` runs. On a machine with fewer cores than primaries the
cluster cannot be faster than one server: read the per-node CPU split as the scaling signal
(each primary does about a third of the work, so N machines give about N times the Redis
capacity for traffic spread over queues).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from streamq import Job, Keys, Queue, Registry, Worker, WorkerConfig
from streamq._core.cluster_server import ClusterServer
from streamq._core.conn import sync_client
from streamq._core.server import RedisServer


def _queues(client: Any, n: int) -> list[str]:
    """``n`` queue names on ``n`` different nodes (any names on one server)."""
    if not hasattr(client, "get_node_from_key"):
        return [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(n)]
    by_node: dict[str, str] = {}
    while len(by_node) < n:
        name = f"bench-{uuid.uuid4().hex[:8]}"
        by_node.setdefault(client.get_node_from_key(Keys(name).stream).name, name)
    return list(by_node.values())


def _cpu(ports: list[int]) -> dict[int, float]:
    out = {}
    for port in ports:
        with redis.Redis(port=port, protocol=2) as c:
            info: Any = c.info("cpu")
            out[port] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return out


def _script_calls(ports: list[int]) -> int:
    total = 0
    for port in ports:
        with redis.Redis(port=port, protocol=2) as c:
            stats: Any = c.info("commandstats")
            total += int(stats.get("cmdstat_evalsha", {}).get("calls", 0))
    return total


async def _drain(url: str, names: list[str], ports: list[int], per_queue: int,
                 concurrency: int) -> dict[str, Any]:
    for name in names:
        with Queue.from_url(url, name) as q:
            q.enqueue_many([{"type": "noop"} for _ in range(per_queue)])
    reg = Registry()
    n = per_queue * len(names)
    done = [0]
    finished = asyncio.Event()

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        done[0] += 1
        if done[0] == n:
            finished.set()

    cfg = WorkerConfig(concurrency=concurrency, block_ms=200)
    before, calls0 = _cpu(ports), _script_calls(ports)
    start, own0 = time.perf_counter(), time.process_time()
    async with Worker(url, names, reg, cfg):
        await finished.wait()
        elapsed = time.perf_counter() - start
    own = time.process_time() - own0
    after, calls = _cpu(ports), _script_calls(ports) - calls0
    cpu = {p: (after[p] - before[p]) * 1e6 / n for p in ports}
    return {"drain_jobs_s": n / elapsed, "worker_cpu_us_per_job": own * 1e6 / n,
            "redis_cpu_us_total": sum(cpu.values()), "jobs_per_script_call": n / max(1, calls),
            "redis_cpu_us_per_job": cpu}


def _bulk(url: str, names: list[str], per_queue: int) -> float:
    start = time.perf_counter()
    for name in names:
        with Queue.from_url(url, name) as q:
            q.enqueue_many([{"type": "noop", "payload": {"i": i}} for i in range(per_queue)])
    return per_queue * len(names) / (time.perf_counter() - start)


async def _latency(url: str, name: str, n: int) -> list[float]:
    """Enqueue -> handler start, ms (client clock on both ends: one process)."""
    reg = Registry()
    seen: list[float] = []
    all_seen = asyncio.Event()

    @reg.handler("stamp")
    async def stamp(job: Job) -> None:
        seen.append((time.time() - float(job.payload["t"])) * 1000)
        if len(seen) == n:
            all_seen.set()

    async with Worker(url, [name], reg, WorkerConfig(concurrency=8, block_ms=1000)):
        await asyncio.sleep(0.5)  # the fetch loop is blocked in XREADGROUP: an idle worker
        q = Queue.from_url(url, name)
        try:
            for _ in range(n):
                await asyncio.to_thread(q.enqueue, "stamp", {"t": time.time()})
                await asyncio.sleep(0.01)
            await asyncio.wait_for(all_seen.wait(), 60)
        finally:
            q.close()
    return seen


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def _fresh(url: str, n: int) -> list[str]:
    client = sync_client(url)
    try:
        return _queues(client, n)
    finally:
        client.close()


def run_one(url: str, ports: list[int], jobs: int, concurrency: int) -> dict[str, Any]:
    per_queue = jobs // 3
    bulk = _bulk(url, _fresh(url, 3), per_queue)
    drain = asyncio.run(_drain(url, _fresh(url, 3), ports, per_queue, concurrency))
    lat = asyncio.run(_latency(url, _fresh(url, 1)[0], 200))
    return {"bulk_enqueue_jobs_s": bulk, **drain,
            "latency_p50_ms": _pct(lat, 50), "latency_p99_ms": _pct(lat, 99)}


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, dict):
            out[key] = {p: statistics.median(r[key][p] for r in runs) for p in first}
        else:
            out[key] = statistics.median(r[key] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20000, help="jobs per run, over 3 queues")
    ap.add_argument("--concurrency", type=int, default=100, help="the worker's concurrency")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="also write the JSON results to this file")
    a = ap.parse_args()
    results: dict[str, Any] = {"settings": {
        "jobs": a.jobs, "concurrency": a.concurrency, "repeat": a.repeat,
        "commit": _commit(), "servers": "3-primary loopback cluster, no replicas, persistence"
        " off; one redis-server; one worker in the harness process, no-op handler"}}
    with RedisServer() as srv:
        results["standalone"] = _median([run_one(srv.url, [srv.port], a.jobs, a.concurrency)
                                         for _ in range(a.repeat)])
    with ClusterServer(primaries=3, replicas=0) as cl:
        ports = cl.primary_ports()
        results["cluster"] = _median([run_one(cl.url, ports, a.jobs, a.concurrency)
                                      for _ in range(a.repeat)])
    one, many = results["standalone"], results["cluster"]
    results["cluster_over_one_server"] = {
        k: many[k] / one[k] for k in ("drain_jobs_s", "worker_cpu_us_per_job",
                                       "redis_cpu_us_total", "latency_p50_ms")}
    if a.out:
        Path(a.out).write_text(json.dumps(results, indent=2) + "\n")
    if a.json:
        print(json.dumps(results, indent=2))
        return
    print("| setup | bulk enqueue jobs/s | drain jobs/s | worker CPU µs/job | Redis CPU µs/job"
          " (per node) | jobs per script call | enqueue->start p50 ms | p99 ms |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for label in ("standalone", "cluster"):
        r = results[label]
        cpu = ", ".join(f"{v:.1f}" for v in r["redis_cpu_us_per_job"].values())
        print(f"| {label} | {r['bulk_enqueue_jobs_s']:,.0f} | {r['drain_jobs_s']:,.0f} |"
              f" {r['worker_cpu_us_per_job']:.1f} | {r['redis_cpu_us_total']:.1f} ({cpu}) |"
              f" {r['jobs_per_script_call']:.1f} | {r['latency_p50_ms']:.2f} |"
              f" {r['latency_p99_ms']:.2f} |")
    ratio = results["cluster_over_one_server"]
    print("cluster / one server: " + ", ".join(f"{k} {v:.2f}" for k, v in ratio.items()))


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(__file__).parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


if __name__ == "__main__":
    main()
