"""``streamq demo``: a self-contained tour. Starts a private redis-server when no URL is given."""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

from ._config import RetryPolicy, WorkerConfig
from ._errors import Fail, Retry
from ._model import Job
from ._queue import AsyncQueue
from ._registry import Registry
from ._server import RedisServer
from ._worker import Worker


def _registry() -> Registry:
    reg = Registry()

    @reg.handler("demo.instant")
    async def instant(job: Job) -> int:
        return int(job.payload["n"]) * 2

    @reg.handler("demo.flaky", max_attempts=4, retry=RetryPolicy(base_s=0.05, cap_s=0.2))
    async def flaky(job: Job) -> str:
        if job.attempt < 2:
            raise Retry("transient failure, trying again")
        return f"ok on attempt {job.attempt}"

    @reg.handler("demo.broken")
    async def broken(job: Job) -> None:
        raise Fail("this job can never succeed")

    @reg.handler("demo.slow")
    def slow(job: Job) -> str:
        time.sleep(0.2)  # sync handlers run in a thread pool
        return "slow done"

    return reg


async def _run(url: str, n: int) -> int:
    qname = f"demo-{random.randrange(1 << 30):x}"
    q = AsyncQueue.from_url(url, qname)
    jobs: list[dict[str, Any]] = [{"type": "demo.instant", "payload": {"n": i}} for i in range(n)]
    jobs += [{"type": "demo.instant", "payload": {"n": i}, "delay": 0.5} for i in range(n // 10)]
    jobs += [{"type": "demo.flaky"} for _ in range(n // 20)]
    jobs += [{"type": "demo.broken"} for _ in range(n // 50)]
    jobs += [{"type": "demo.slow"} for _ in range(n // 50)]
    t0 = time.perf_counter()
    results = await q.enqueue_many(jobs)
    print(f"enqueued {len(results)} jobs to queue {qname} in {time.perf_counter() - t0:.3f}s")
    cfg = WorkerConfig(concurrency=64, promote_interval_s=0.05)
    worker = Worker(url, [qname], _registry(), cfg)
    t0 = time.perf_counter()
    async with worker:
        while True:
            await asyncio.sleep(0.25)
            s = worker.stats
            done = s.completed + s.failed
            print(f"\r  completed {s.completed:6d}  retried {s.retried:4d}  dead {s.failed:4d}",
                  end="", flush=True)
            if done >= len(jobs) or time.perf_counter() - t0 > 50:
                break
    print()
    s = worker.stats
    expected_dead = n // 50
    print(f"summary: {s.completed} completed, {s.failed} dead-lettered, {s.retried} retries,"
          f" in {time.perf_counter() - t0:.2f}s")
    await q.close()
    ok = s.completed == len(jobs) - expected_dead and s.failed == expected_dead
    print("summary matches what was enqueued" if ok else "MISMATCH against what was enqueued")
    return 0 if ok else 1


def run_demo(url: str | None, n: int = 2000) -> int:
    if url:
        return asyncio.run(_run(url, n))
    try:
        server = RedisServer()
    except RuntimeError as exc:
        raise SystemExit(f"streamq demo: no --url given and {exc}") from None
    with server:
        print(f"started a private redis-server at {server.url} (stopped when the demo ends)")
        return asyncio.run(_run(server.url, n))
