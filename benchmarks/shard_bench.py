"""One queue with 1, 3 and 6 shards on a 3-primary loopback cluster: bulk enqueue, drain, and
how the Redis CPU per job splits over the primaries.

``python -m benchmarks.shard_bench [--jobs 6000] [--repeat 3] [--json] [--out FILE]``. A
private 3-primary loopback cluster (no replicas); for each shard count a fresh queue whose
shards are spread evenly over the primaries; bulk enqueue is one ``enqueue_many``
call of ``--jobs`` no-op jobs (split by shard, pipelined per node); the drain is one worker
in this process (concurrency 64, no-op handler). Redis CPU is each primary's ``INFO cpu``
(user + sys) delta over the drain, in µs per job of the whole queue. Every figure is the
median of ``--repeat`` runs.

On a machine with fewer cores than primaries the cluster cannot go faster in wall time: read
the per-node CPU split as the scaling signal. An unsharded queue puts all of its Redis work on
one primary; N shards spread it over the primaries that own their slots, so the busiest
node's share is what bounds throughput on real machines (one core per primary).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

import redis

from streamq import Job, Queue, QueueConfig, Registry, Worker, WorkerConfig
from streamq._core.cluster_server import ClusterServer
from streamq._core.keys import shard_keys

SHARDS = (1, 3, 6)


def _cpu(ports: list[int]) -> dict[int, float]:
    out = {}
    for port in ports:
        with redis.Redis(port=port, protocol=2) as c:
            info: Any = c.info("cpu")
            out[port] = float(info["used_cpu_sys"]) + float(info["used_cpu_user"])
    return out


def _queue(cl: ClusterServer, shards: int) -> str:
    """A fresh queue name whose shards are spread as evenly as can be over the 3 primaries
    (6 shards: 2 on each), so the figures show the layout and not a lopsided draw."""
    while True:
        name = f"shb-{uuid.uuid4().hex[:8]}"
        per: dict[int, int] = {}
        for k in shard_keys(name, shards):
            per[cl.owner(k.stream)] = per.get(cl.owner(k.stream), 0) + 1
        if len(per) == min(shards, 3) and max(per.values()) - min(per.values()) <= 1:
            return name


def _bulk(url: str, name: str, cfg: QueueConfig, jobs: int, ports: list[int]
          ) -> dict[str, Any]:
    specs = [{"type": "noop", "payload": {"i": i}} for i in range(jobs)]
    with Queue.from_url(url, name, cfg) as q:
        q.enqueue("noop", job_id="warm-up")  # the shard count check and the connections
        before = _cpu(ports)
        start = time.perf_counter()
        res = q.enqueue_many(specs)
        elapsed = time.perf_counter() - start
        after = _cpu(ports)
    assert all(r.status == "queued" for r in res)
    return {"bulk_jobs_s": jobs / elapsed,
            "bulk_cpu_us_per_job": {p: (after[p] - before[p]) * 1e6 / jobs for p in ports}}


async def _drain(url: str, name: str, cfg: QueueConfig, n: int, ports: list[int]
                 ) -> dict[str, Any]:
    reg = Registry()
    done = [0]
    finished = asyncio.Event()

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        done[0] += 1
        if done[0] == n:
            finished.set()

    before = _cpu(ports)
    start = time.perf_counter()
    async with Worker(url, [name], reg, WorkerConfig(concurrency=64, block_ms=200), cfg):
        await finished.wait()
        elapsed = time.perf_counter() - start
    after = _cpu(ports)
    return {"drain_jobs_s": n / elapsed,
            "drain_cpu_us_per_job": {p: (after[p] - before[p]) * 1e6 / n for p in ports}}


def run_one(cl: ClusterServer, shards: int, jobs: int) -> dict[str, Any]:
    ports = cl.primary_ports()
    cfg = QueueConfig(shards=shards)
    name = _queue(cl, shards)
    out = _bulk(cl.url, name, cfg, jobs, ports)
    out.update(asyncio.run(_drain(cl.url, name, cfg, jobs + 1, ports)))
    return out


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, dict):  # per node: sorted busiest first, so runs line up
            ordered = [sorted(r[key].values(), reverse=True) for r in runs]
            out[key] = [statistics.median(col) for col in zip(*ordered, strict=True)]
        else:
            out[key] = statistics.median(r[key] for r in runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--jobs", type=int, default=6000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the JSON figures here")
    a = ap.parse_args()
    results: dict[str, Any] = {}
    with ClusterServer(primaries=3, replicas=0) as cl:
        for shards in SHARDS:
            results[str(shards)] = _median([run_one(cl, shards, a.jobs)
                                            for _ in range(a.repeat)])
    doc = {"jobs": a.jobs, "repeat": a.repeat, "primaries": 3, "by_shards": results}
    if a.out is not None:
        a.out.write_text(json.dumps(doc, indent=2) + "\n")
    if a.json:
        print(json.dumps(doc, indent=2))
        return
    print("| shards | bulk enqueue jobs/s | drain jobs/s | drain Redis CPU µs/job per node"
          " (busiest first) | total | busiest node's share |")
    print("|---|---|---|---|---|---|")
    for label, r in results.items():
        cpu = r["drain_cpu_us_per_job"]
        total = sum(cpu)
        print(f"| {label} | {r['bulk_jobs_s']:,.0f} | {r['drain_jobs_s']:,.0f} |"
              f" {', '.join(f'{v:.0f}' for v in cpu)} | {total:.0f} |"
              f" {cpu[0] / total:.0%} |")


if __name__ == "__main__":
    main()
