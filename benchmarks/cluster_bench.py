"""Redis Cluster figures next to one server: bulk enqueue, drain, enqueue -> start latency,
and how the Redis CPU of a drain splits over the primaries.

``python -m benchmarks.cluster_bench [--jobs 6000] [--repeat 3] [--json]``. A private
3-primary loopback cluster (no replicas: they would only add load on a small machine) and a
private redis-server; three queues whose slots live on the three primaries; one worker process
in this process (concurrency 64, no-op handler). Every figure is the median of ``--repeat``
runs. On a machine with fewer cores than primaries the cluster cannot be faster than one
server: read the per-node CPU split as the scaling signal (each primary does about a third of
the work, so N machines give about N times the Redis capacity for traffic spread over queues).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
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


async def _drain(url: str, names: list[str], ports: list[int], per_queue: int
                 ) -> dict[str, Any]:
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

    cfg = WorkerConfig(concurrency=64, block_ms=200)
    before = _cpu(ports)
    start = time.perf_counter()
    async with Worker(url, names, reg, cfg):
        await finished.wait()
        elapsed = time.perf_counter() - start
    after = _cpu(ports)
    cpu = {p: (after[p] - before[p]) * 1e6 / n for p in ports}
    return {"drain_jobs_s": n / elapsed, "redis_cpu_us_per_job": cpu}


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


def run_one(url: str, ports: list[int], jobs: int) -> dict[str, Any]:
    per_queue = jobs // 3
    bulk = _bulk(url, _fresh(url, 3), per_queue)
    drain = asyncio.run(_drain(url, _fresh(url, 3), ports, per_queue))
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
    ap.add_argument("--jobs", type=int, default=6000, help="jobs per run, over 3 queues")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    results: dict[str, Any] = {}
    with RedisServer() as srv:
        results["standalone"] = _median([run_one(srv.url, [srv.port], a.jobs)
                                         for _ in range(a.repeat)])
    with ClusterServer(primaries=3, replicas=0) as cl:
        ports = cl.primary_ports()
        results["cluster"] = _median([run_one(cl.url, ports, a.jobs) for _ in range(a.repeat)])
    if a.json:
        print(json.dumps(results, indent=2))
        return
    print("| setup | bulk enqueue jobs/s | drain jobs/s | enqueue->start p50 ms | p99 ms |"
          " Redis CPU µs/job per node |")
    print("|---|---|---|---|---|---|")
    for label, r in results.items():
        cpu = ", ".join(f"{v:.0f}" for v in r["redis_cpu_us_per_job"].values())
        print(f"| {label} | {r['bulk_enqueue_jobs_s']:,.0f} | {r['drain_jobs_s']:,.0f} |"
              f" {r['latency_p50_ms']:.1f} | {r['latency_p99_ms']:.1f} | {cpu} |")


if __name__ == "__main__":
    main()
