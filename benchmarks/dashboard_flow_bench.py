"""The dashboard's flow page on a 10,000 -> 1 fan-in: p50/p95/max per page.

``python -m benchmarks.dashboard_flow_bench [--children 10000] [--requests 30]``.
A private redis-server; ``children`` jobs enqueued with ``Queue.enqueue_many`` (no worker: all
of them pending), one job waiting for all of them (``depends_on``), and 50 of the children
made to wait on a job of their own (a few of those on a page are expanded); besides, a job
waiting for 20 jobs that each wait for 10: the worst case of the page's bounded expansion
(``MAX_EXPAND``, 20 reads). Each page is then requested ``requests``
times through the ASGI app in-process (httpx's ASGI transport: the app's time and Redis',
without a network hop). The result goes to stdout and
``benchmarks/results/dashboard_flow.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import httpx

from streamq import Queue
from streamq._core.server import RedisServer
from streamq.dashboard import DashboardConfig, create_app

RESULTS = Path(__file__).parent / "results" / "dashboard_flow.json"


def fill(url: str, children: int) -> float:
    t0 = time.perf_counter()
    q = Queue.from_url(url, "flows")
    for i in range(0, children, 5000):
        q.enqueue_many([{"type": "leaf", "payload": j, "job_id": f"c{j}"}
                        for j in range(i, min(i + 5000, children)) if j >= 50])
    for j in range(min(50, children)):  # these wait themselves: expanded in the tree
        q.enqueue("leaf", j, job_id=f"g{j}")
        q.enqueue("leaf", j, job_id=f"c{j}", depends_on=[f"g{j}"])
    q.enqueue("fan", None, job_id="fan", depends_on=[f"c{j}" for j in range(children)])
    for i in range(20):  # a tree whose page expands the most: 20 waiting nodes of 10 each
        q.enqueue_many([{"type": "leaf", "payload": k, "job_id": f"x{i}.{k}"} for k in range(10)])
        q.enqueue("mid", i, job_id=f"w{i}", depends_on=[f"x{i}.{k}" for k in range(10)])
    q.enqueue("top", None, job_id="tree", depends_on=[f"w{i}" for i in range(20)])
    q.close()
    return time.perf_counter() - t0


async def measure(url: str, requests: int) -> dict[str, dict[str, float]]:
    app = create_app(url, config=DashboardConfig(queues=("flows",)))
    out: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as c:
        first = await c.get("/flow", params={"q": "flows", "id": "fan"})
        assert first.status_code == 200, first.text[:500]
        later = first.text.split('rel="next"')[0].rsplit('href="', 1)[1].split('"')[0]
        pages = {"flow: fan, first page": "/flow?q=flows&id=fan",
                 "flow: fan, next page": "/flow" + later.replace("&amp;", "&"),
                 "flow: a leaf (its parent)": "/flow?q=flows&id=c9000",
                 "flow: 20 waiting x 10 (20 expanded)": "/flow?q=flows&id=tree",
                 "job: fan (flow panel)": "/job?q=flows&id=fan",
                 "job: a leaf (flow panel)": "/job?q=flows&id=c9000"}
        for name, path in pages.items():
            times = []
            for _ in range(requests):
                t0 = time.perf_counter()
                r = await c.get(path)
                times.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200, (name, r.text[:300])
            times.sort()
            out[name] = {"p50_ms": round(statistics.median(times), 1),
                         "p95_ms": round(times[int(len(times) * 0.95) - 1], 1),
                         "max_ms": round(times[-1], 1),
                         "nodes": float(r.text.count("data-job="))}
    await app.state.dashboard.aclose()
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--children", type=int, default=10_000)
    ap.add_argument("--requests", type=int, default=30)
    args = ap.parse_args()
    with RedisServer() as srv:
        fill_s = fill(srv.url, args.children)
        pages = asyncio.run(measure(srv.url, args.requests))
    result: dict[str, Any] = {"children": args.children, "requests": args.requests,
                              "fill_s": round(fill_s, 1), "pages": pages,
                              "python": platform.python_version(),
                              "machine": platform.machine()}
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
