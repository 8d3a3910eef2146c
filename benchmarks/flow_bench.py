"""Workflows' first numbers: ``python -m benchmarks.flow_bench [--fan 10000] [--chain 200]``.

Against a fresh private redis-server, one in-process worker (concurrency 100), no-op handlers:

1. a plain drain of ``fan`` pre-enqueued jobs (the reference rate);
2. a ``fan`` -> 1 fan-in: the same jobs with one job waiting for all of them (``depends_on``),
   timed until the waiting job completed: its rate as a share of the plain drain's;
3. a chain of ``chain`` steps in one queue (each step waits for the previous one): steps/s,
   i.e. the same-slot hand-off plus one fetch and one settle per step.

Prints Markdown. A rough first measure (one process for worker and clock); the issue's full
benchmarks (idle hand-off p50, peers side by side) come later.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import attrs

from streamq import JobSpec, Queue, Registry, Worker, WorkerConfig, chain
from streamq._core.server import RedisServer


def _registry() -> Registry:
    reg = Registry()

    @reg.handler("noop")
    async def noop(job: Any) -> int:
        return 1

    @reg.handler("sink")
    async def sink(job: Any) -> int:
        return len(job.dependency_results())

    return reg


async def _until(q: Queue, job_id: str, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        info = await asyncio.to_thread(q.get, job_id)
        if info is not None and info.finished:
            return
        await asyncio.sleep(0.005)
    raise TimeoutError(job_id)


async def _run(url: str, name: str, setup: Any, last: str) -> float:
    cfg = attrs.evolve(WorkerConfig(), concurrency=100, promote_interval_s=0.05)
    with Queue.from_url(url, name) as q:
        setup(q)
        t0 = time.perf_counter()
        async with Worker(url, [name], _registry(), cfg):
            await _until(q, last, 600)
            return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fan", type=int, default=10_000)
    ap.add_argument("--chain", type=int, default=200)
    a = ap.parse_args(argv)
    n = a.fan
    with RedisServer() as srv:
        jobs = [{"type": "noop", "job_id": f"j{i}"} for i in range(n)]
        plain = asyncio.run(_run(srv.url, "plain", lambda q: q.enqueue_many(jobs),
                                 f"j{n - 1}"))

        def fan_in(q: Queue) -> None:
            q.enqueue_many(jobs)
            q.enqueue("sink", job_id="sink", depends_on=[j["job_id"] for j in jobs])

        fan = asyncio.run(_run(srv.url, "fan", fan_in, "sink"))
        steps = a.chain
        flow = chain(*(JobSpec("noop") for _ in range(steps)))
        ch = asyncio.run(_run(srv.url, "chain", lambda q: q.enqueue_flow(flow, flow_id="c"),
                              f"c.{steps - 1}"))
    print(f"# Workflows, first numbers ({n:,}-job fan-in, {steps}-step chain)\n")
    print(f"- plain drain of {n:,}: {n / plain:,.0f} jobs/s")
    print(f"- {n:,} -> 1 fan-in, until the waiting job completed: {n / fan:,.0f} jobs/s"
          f" ({plain / fan:.0%} of the plain drain's rate)")
    print(f"- chain of {steps} steps in one queue: {steps / ch:,.0f} steps/s"
          f" ({ch / steps * 1000:.1f} ms per step)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
