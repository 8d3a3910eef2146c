"""Dashboard page times on a big queue: p50/p95/max per page with 1,000,000 retained jobs and
100,000 dead letters in one queue.

``python -m benchmarks.dashboard_bench [--jobs 1000000] [--dead 100000] [--requests 50]``.
Fill (a private redis-server): ``dead`` jobs enqueued with ``Queue.enqueue_many`` and failed
by a real worker (``Fail``), then the rest enqueued the same way: 80 % ready, 10 % scheduled a
day ahead, 10 % completed by a worker. Each page is then requested ``requests`` times through
the ASGI app in-process (httpx's ASGI transport: the time is the app's and Redis', without a
network hop). The confirmation before a filtered bulk re-drive counts the matches, reading up
to 100,000 dead entries: it is reported apart from the pages. The result goes to stdout and
``benchmarks/results/dashboard.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from streamq import ALL_EVENTS, Fail, Job, Queue, QueueConfig, Registry, Worker, WorkerConfig
from streamq._core.server import RedisServer
from streamq.dashboard import DashboardConfig, create_app

RESULTS = Path(__file__).parent / "results" / "dashboard.json"
BATCH = 10_000


def _registry() -> Registry:
    reg = Registry()

    @reg.handler("bench.ok")
    async def ok(job: Job) -> None:
        return None

    @reg.handler("bench.bad")
    async def bad(job: Job) -> None:
        raise Fail("bench failure")

    return reg


def _enqueue(q: Queue, jobs: list[dict[str, Any]]) -> None:
    for i in range(0, len(jobs), BATCH):
        q.enqueue_many(jobs[i:i + BATCH])


async def _drain(url: str, queue: str, until: int) -> None:
    cfg = WorkerConfig(concurrency=256, fetch_batch=512)
    # every event kind: the completed tab lists completed events
    async with Worker(url, [queue], _registry(), cfg, QueueConfig(event_kinds=ALL_EVENTS)) as w:
        while w.stats.completed + w.stats.failed < until:  # noqa: ASYNC110 - polls counters
            await asyncio.sleep(0.2)


async def fill(url: str, queue: str, jobs: int, dead: int) -> dict[str, float]:
    q = Queue.from_url(url, queue)
    t0 = time.perf_counter()
    done = (jobs - dead) // 10
    _enqueue(q, [{"type": "bench.bad", "job_id": f"dead-{i}", "payload": {"n": i}}
                 for i in range(dead)])
    _enqueue(q, [{"type": "bench.ok", "job_id": f"done-{i}", "payload": {"n": i}}
                 for i in range(done)])
    await _drain(url, queue, dead + done)
    t_run = time.perf_counter()
    rest = jobs - dead - done
    scheduled = rest // 9
    _enqueue(q, [{"type": "bench.ok", "job_id": f"later-{i}", "payload": {"n": i},
                  "delay": 86_400} for i in range(scheduled)])
    _enqueue(q, [{"type": "bench.ok", "job_id": f"ready-{i}", "payload": {"n": i}}
                 for i in range(rest - scheduled)])
    q.close()
    return {"fill_s": round(time.perf_counter() - t0, 1), "worker_s": round(t_run - t0, 1)}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


async def measure(url: str, queue: str, requests: int) -> dict[str, dict[str, float]]:
    app = create_app(url, config=DashboardConfig(queues=(queue,)))
    pages = {
        "overview": "/",
        "queue: ready": f"/queue?q={queue}&tab=ready",
        "queue: ready, page 50": None,
        "queue: active": f"/queue?q={queue}&tab=active",
        "queue: scheduled": f"/queue?q={queue}&tab=scheduled",
        "queue: dead": f"/queue?q={queue}&tab=dead",
        "queue: dead, type filter": f"/queue?q={queue}&tab=dead&type=bench.bad",
        "queue: dead, error filter (no match)": f"/queue?q={queue}&tab=dead&error=Nope",
        "queue: completed (events)": f"/queue?q={queue}&tab=completed",
        "queue: workers": f"/queue?q={queue}&tab=workers",
        "job: dead": f"/job?q={queue}&id=dead-77",
        "job: completed": f"/job?q={queue}&id=done-5",
        "find by id": f"/find?q={queue}&id=ready-123",
        "confirm purge (count)": f"/confirm?q={queue}&action=purge-dead",
        "confirm re-drive, filtered": f"/confirm?q={queue}&action=redrive-all&error=Fail",
    }
    out: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://bench") as c:
        cursor_page = f"/queue?q={queue}&tab=ready"
        for _ in range(49):  # follow 'next page' 49 times: page 50 of the ready list
            text = (await c.get(cursor_page)).text
            nxt = text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
            cursor_page = f"/queue{nxt.replace('&amp;', '&')}"
        pages["queue: ready, page 50"] = cursor_page
        for name, path in pages.items():
            assert path is not None
            times = []
            for i in range(requests + 2):
                t0 = time.perf_counter()
                r = await c.get(path)
                dt = (time.perf_counter() - t0) * 1000
                if r.status_code not in (200, 303):
                    raise RuntimeError(f"{name}: HTTP {r.status_code}")
                if i >= 2:  # the first two warm connections and templates
                    times.append(dt)
            out[name] = {"p50_ms": round(statistics.median(times), 1),
                         "p95_ms": round(pct(times, 95), 1), "max_ms": round(max(times), 1)}
            print(f"{name:48s} p50 {out[name]['p50_ms']:7.1f} ms  p95 "
                  f"{out[name]['p95_ms']:7.1f} ms", file=sys.stderr)
    await app.state.dashboard.aclose()
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=1_000_000)
    ap.add_argument("--dead", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    with RedisServer() as srv:
        filled = asyncio.run(fill(srv.url, "bench", args.jobs, args.dead))
        print(f"filled in {filled['fill_s']} s", file=sys.stderr)
        pages = asyncio.run(measure(srv.url, "bench", args.requests))
        import redis

        info: Any = redis.Redis.from_url(srv.url).info("memory")
    counted = "confirm re-drive, filtered"  # counts every match: reads all 100,000 entries
    result = {"jobs": args.jobs, "dead": args.dead, "requests_per_page": args.requests,
              "redis_used_memory_mb": round(info["used_memory"] / 2**20),
              "machine": f"{platform.machine()}, {platform.python_version()}",
              **filled, "pages": pages,
              "worst_p95_ms": max(p["p95_ms"] for n, p in pages.items() if n != counted),
              "count_before_bulk_redrive_p95_ms": pages[counted]["p95_ms"]}
    print(json.dumps(result, indent=2))
    if not args.no_save:
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
