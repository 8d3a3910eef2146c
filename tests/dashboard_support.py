"""Shared by the dashboard tests: a queue with jobs in every state, the app served by uvicorn
in a thread (for Server-Sent Events and the browser), CSRF tokens read from a page."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import uvicorn
from helpers import eventually, fast
from starlette.types import ASGIApp

from streamq import ALL_EVENTS, Fail, Job, Queue, QueueConfig, Registry, RetryPolicy, Worker
from streamq._core.server import free_port

EVERY = QueueConfig(event_kinds=ALL_EVENTS)
"""Every event kind: the dashboard's lists of recent jobs and its timelines read them."""

CSRF_RE = re.compile(r'name="csrf" value="([0-9a-f]{64})"')


def registry(gate: threading.Event | None = None) -> Registry:
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> dict[str, Any]:
        return {"echo": job.payload}

    @reg.handler("bad")
    async def bad(job: Job) -> None:
        if gate is not None and gate.is_set():
            return None
        raise Fail(f"bad <b>{job.payload}</b>")

    @reg.handler("boom", max_attempts=2, retry=RetryPolicy(base_s=0.05, cap_s=0.1))
    async def boom(job: Job) -> None:
        raise ValueError("<script>alert('tb')</script>")

    return reg


async def fill(url: str, qname: str, reg: Registry | None = None) -> Queue:
    """completed c0..c2, dead b0..b2 (Fail) and x0 (ValueError after 2 attempts), scheduled
    s0, s1, ready r0 (queued after the worker stopped)."""
    q = Queue.from_url(url, qname, EVERY)
    q.enqueue_many([{"type": "ok", "job_id": f"c{i}", "payload": {"n": i}} for i in range(3)]
                   + [{"type": "bad", "job_id": f"b{i}", "payload": i} for i in range(3)]
                   + [{"type": "boom", "job_id": "x0", "payload": {"html": "<i>x</i>"}}])
    q.enqueue("ok", {"later": True}, job_id="s0", delay=3600, headers={"tenant": "<acme>"})
    q.enqueue("ok", None, job_id="s1", delay=7200)
    async with Worker(url, [qname], reg or registry(), fast(), EVERY) as w:
        await eventually(lambda: w.stats.completed + w.stats.failed == 7, what="settle",
                         timeout_s=20)
    q.enqueue("ok", {"n": 99}, job_id="r0")
    return q


def csrf_of(html: str) -> str:
    m = CSRF_RE.search(html)
    assert m, "no CSRF token on the page"
    return m.group(1)


@contextmanager
def serve(app: ASGIApp, lifespan: Literal["on", "off"] = "off") -> Iterator[str]:
    """The app on a free loopback port in a thread; yields its base URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error",
                                           lifespan=lifespan))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


async def sleep_until(pred: Any, timeout_s: float = 10.0) -> None:
    await eventually(pred, timeout_s=timeout_s)
    await asyncio.sleep(0)
