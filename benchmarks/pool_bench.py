"""Process pool figures (issue 30): CPU-bound jobs/s with threads against a pool of 1 and 2
children, and the per-job cost of process isolation against a thread on a no-op.

``python -m benchmarks.pool_bench [--jobs 400] [--calls 2000]``. A private redis-server.

* ``drain``: ``--jobs`` CPU-bound jobs (about 5 ms of pure-Python work each, calibrated
  here) are enqueued, then one Worker (concurrency 4: a leased job waits for each busy child)
  drains them: sync handlers in threads (``pool="thread"``), then ``pool="process"`` with 1
  and 2 children. jobs/s from the worker's
  start to its last completion (the pool's start is excluded: children are started first).
  The no-op drain with concurrency 1 gives the end-to-end cost per job.
* ``direct``: ``--calls`` sequential calls of a no-op sync handler through the thread runner
  (``SyncRunner.run``) and through the pool (``ProcessPool.run``, one child), without Redis:
  the isolation's own cost per job (µs), the pipe round trip and the serde both ways; as
  wall time, and as CPU time (the parent's, and the child's from /proc), which a busy
  machine distorts less. ``direct_cpu``: 100 CPU-bound jobs, two at a time, through two
  threads and through two children.

Prints JSON. Run it on a quiet machine; figures from a shared one are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from typing import Any

from streamq import Job, Queue, Registry, Worker, WorkerConfig
from streamq._core.model import CancelFlag
from streamq._core.serde import JsonSerde
from streamq._core.server import RedisServer
from streamq._worker.invoke import SyncRunner
from streamq._worker.pool import ProcessPool

registry = Registry()
SPEC = "benchmarks.pool_bench:registry"


@registry.handler("cpu")
def cpu(job: Job) -> int:
    n = 0
    for i in range(int(job.payload["n"])):
        n += i * i % 7
    return n


@registry.handler("noop")
def noop(job: Job) -> None:
    return None


def calibrate(target_s: float = 0.005) -> int:
    """The loop count of ``cpu`` that takes about ``target_s`` here (best of 5)."""
    n = 20_000
    job = Job("c", "cpu", {"n": n}, 1, 1, "q")
    best = min(_timed(lambda: cpu(job)) for _ in range(5))
    return max(1000, int(n * target_s / best))


def _timed(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


async def drain(url: str, queue: str, jtype: str, payload: Any, jobs: int, pool: str,
                size: int, concurrency: int) -> dict[str, Any]:
    q = Queue.from_url(url, queue)
    q.enqueue_many([{"type": jtype, "payload": payload} for _ in range(jobs)])
    cfg = WorkerConfig(concurrency=concurrency, pool=pool, pool_size=size, pool_registry=SPEC,
                       block_ms=200, sync_threads=concurrency)
    w = Worker(url, [queue], registry, cfg)
    await w.start()  # (the pool's children are started and ready before it returns)
    t0 = time.perf_counter()
    try:
        while w.stats.completed < jobs:  # noqa: ASYNC110 - a counter, polled
            await asyncio.sleep(0.005)
        wall = time.perf_counter() - t0
    finally:
        await w.stop()
    return {"pool": pool, "children": size if pool == "process" else 0,
            "concurrency": concurrency, "jobs": jobs, "seconds": round(wall, 3),
            "jobs_per_s": round(jobs / wall, 1), "us_per_job": round(wall / jobs * 1e6)}


async def direct(calls: int) -> dict[str, Any]:
    job = Job("j", "noop", None, 1, 1, "q")
    runner = SyncRunner(1, 1, logging.getLogger("bench"))
    for _ in range(100):
        await runner.run(noop, job, None)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(calls):
        await runner.run(noop, job, None)
    thread_us = (time.perf_counter() - t0) / calls * 1e6
    thread_cpu_us = (time.process_time() - c0) / calls * 1e6
    runner.shutdown()
    pool = ProcessPool(1, SPEC, JsonSerde(), names=["noop"])
    await pool.start()
    try:
        flag = CancelFlag()
        for _ in range(100):
            await pool.run(job, None, flag)
        child = pool.pids()[0]
        t0, c0, k0 = time.perf_counter(), time.process_time(), _cpu_of(child)
        for _ in range(calls):
            await pool.run(job, None, flag)
        pool_us = (time.perf_counter() - t0) / calls * 1e6
        parent_cpu_us = (time.process_time() - c0) / calls * 1e6
        child_cpu_us = (_cpu_of(child) - k0) / calls * 1e6
    finally:
        await pool.close()
    return {"calls": calls, "thread_us_per_job": round(thread_us, 1),
            "pool_us_per_job": round(pool_us, 1),
            "isolation_overhead_us": round(pool_us - thread_us, 1),
            "thread_cpu_us_per_job": round(thread_cpu_us, 1),
            "pool_cpu_us_per_job": {"parent": round(parent_cpu_us, 1),
                                    "child": round(child_cpu_us, 1)}}


def _cpu_of(pid: int) -> float:
    """CPU seconds (user + system) a live process used so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def direct_cpu(n: int, jobs: int) -> dict[str, Any]:
    """``jobs`` CPU-bound jobs called directly, two at a time: two threads (one core, the
    GIL) against two pool children (two cores). Milliseconds per job."""
    job = Job("j", "cpu", {"n": n}, 1, 1, "q")
    runner = SyncRunner(2, 2, logging.getLogger("bench"))
    t0 = time.perf_counter()
    await asyncio.gather(*(runner.run(cpu, job, None) for _ in range(jobs)))
    threads_ms = (time.perf_counter() - t0) / jobs * 1000
    runner.shutdown()
    pool = ProcessPool(2, SPEC, JsonSerde(), names=["cpu"])
    await pool.start()
    try:
        flag = CancelFlag()
        t0 = time.perf_counter()
        await asyncio.gather(*(pool.run(job, None, flag) for _ in range(jobs)))
        pool_ms = (time.perf_counter() - t0) / jobs * 1000
    finally:
        await pool.close()
    return {"jobs": jobs, "two_threads_ms_per_job": round(threads_ms, 2),
            "two_children_ms_per_job": round(pool_ms, 2)}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    n = calibrate()
    one = Job("c", "cpu", {"n": n}, 1, 1, "q")
    out: dict[str, Any] = {"cpu_loop": n, "cpu_job_ms": round(
        min(_timed(lambda: cpu(one)) for _ in range(5)) * 1000, 2), "cpus": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0], "direct": await direct(args.calls),
        "direct_cpu": await direct_cpu(n, 100)}
    server = RedisServer().start()
    try:
        runs = []
        for i, (pool, size) in enumerate([("thread", 0), ("process", 1), ("process", 2)]):
            runs.append(await drain(server.url, f"cpu-{i}", "cpu", {"n": n}, args.jobs, pool,
                                    max(size, 1), 4))
        out["cpu_drain"] = runs
        out["noop_drain"] = [
            await drain(server.url, "noop-t", "noop", None, args.jobs, "thread", 1, 1),
            await drain(server.url, "noop-p", "noop", None, args.jobs, "process", 1, 1)]
    finally:
        server.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--jobs", type=int, default=400)
    p.add_argument("--calls", type=int, default=2000)
    args = p.parse_args()
    print(json.dumps(asyncio.run(main_async(args)), indent=1))


if __name__ == "__main__":
    main()
