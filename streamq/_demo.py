"""``streamq demo``: a self-contained tour. Starts a private redis-server when no URL is given."""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import redis

from ._config import RetryPolicy, WorkerConfig
from ._errors import Fail, Retry
from ._model import Job
from ._queue import AsyncQueue
from ._registry import Registry
from ._worker import Worker


@contextmanager
def embedded_redis() -> Iterator[str]:
    """A throwaway redis-server on a free port in a temp dir, stopped on exit."""
    binary = os.environ.get("STREAMQ_REDIS_SERVER", "redis-server")
    if shutil.which(binary) is None:
        raise SystemExit(f"streamq demo: no --url given and {binary!r} is not on PATH;"
                         " install Redis (apt-get install redis-server) or pass --url")
    workdir = tempfile.mkdtemp(prefix="streamq-demo-")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir,
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(port=port, socket_connect_timeout=0.2)
        for _ in range(200):
            try:
                if client.ping():
                    break
            except redis.ConnectionError:
                time.sleep(0.025)
        client.close()
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


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
    jobs = [{"type": "demo.instant", "payload": {"n": i}} for i in range(n)]
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
    with embedded_redis() as embedded:
        print(f"started a private redis-server at {embedded}")
        return asyncio.run(_run(embedded, n))
