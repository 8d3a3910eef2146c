"""The demo panel of ``streamq demo --web``: enqueue batches, run and resize a worker pool with
latency, failure and hang rates, reclaim now. Its actions are POSTs with the dashboard's CSRF
token, like every other action."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from schedulers import Scheduler

from .._core.config import ALL_EVENTS, QueueConfig, SearchConfig
from .._core.errors import InvalidArgument
from .._producer.queue import AsyncQueue
from ..dashboard._actions import _done, _field
from ..dashboard._app import Dashboard, DashboardConfig, guarded
from ..dashboard._asgi import create_app
from .demo_seed import CRON, seed, settled
from .demo_web import KINDS, QUEUE, VISIBILITY_S, Pool, PoolSettings

MAX_BATCH = 20_000


def _number(form: Any, name: str, lo: float, hi: float) -> float:
    raw = _field(form, name, required=True, max_len=12) or ""
    try:
        v = float(raw)
    except ValueError:
        raise InvalidArgument(f"{name} must be a number") from None
    if not lo <= v <= hi:
        raise InvalidArgument(f"{name} must be {lo:g}-{hi:g}")
    return v


def demo_app(url: str, prefix: str = "streamq", on_ready: Callable[[], None] | None = None,
             seeded: bool = True) -> Starlette:
    """The demo: the dashboard of the demo queue and its panel. At startup the queue is
    seeded (``demo_seed``: history, jobs, cron entries a scheduler fires; not with
    ``seeded=False``, nor into a queue that has a time series already), two worker processes
    start, and ``on_ready`` is called once the seeded jobs ran."""
    cfg = DashboardConfig(queues=(QUEUE,), links=(("demo panel", "/demo"),),
                          title="streamq demo", poll_interval_s=0.5)
    dashboard = create_app(url, prefix=prefix, config=cfg)
    dash: Dashboard = dashboard.state.dashboard
    pool = Pool(url, prefix)
    # the demo shows every step: the completed list and full timelines need every event kind;
    # its jobs are indexed for the search box (docs/search.md)
    producer = AsyncQueue.from_url(url, QUEUE, attrs.evolve(
        dash.admin.config, event_kinds=ALL_EVENTS, search=SearchConfig()))

    async def checked(request: Request) -> Any:
        if dash.cfg.read_only:
            raise HTTPException(403, "the dashboard is read-only")
        form = await request.form(max_files=0, max_fields=20)
        if not dash.csrf.valid(request, _field(form, "csrf", max_len=128)):
            raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
        return form

    async def panel(d: Dashboard, request: Request) -> Response:
        return d.render(request, "demo.html", title="demo panel", q=QUEUE, kinds=KINDS,
                        pool=pool, visibility_s=VISIBILITY_S, topic=f"queue {QUEUE}")

    async def enqueue(d: Dashboard, request: Request) -> Response:
        form = await checked(request)
        kind = _field(form, "kind", required=True) or ""
        if kind not in (*KINDS, "mix"):
            raise InvalidArgument(f"unknown kind {kind!r}")
        n = int(_number(form, "count", 1, MAX_BATCH))
        kinds = KINDS if kind == "mix" else (kind,)
        await producer.enqueue_many([{"type": kinds[i % len(kinds)], "payload": {"n": i}}
                                     for i in range(n)])
        return _done(d, request, QUEUE, f"enqueued {n:,} {kind} jobs", "/demo")

    async def resize(d: Dashboard, request: Request) -> Response:
        form = await checked(request)
        settings = PoolSettings(size=int(_number(form, "size", 0, 16)),
                                latency_ms=int(_number(form, "latency_ms", 0, 60_000)),
                                failure=_number(form, "failure", 0, 100) / 100,
                                hang=_number(form, "hang", 0, 100) / 100)
        await pool.apply(settings)
        return _done(d, request, QUEUE, f"pool: {settings.size} worker processes", "/demo")

    async def reclaim(d: Dashboard, request: Request) -> Response:
        """Hand back every running job whose lease was not renewed for a third of the
        visibility timeout plus a second: their worker is hung or dead."""
        await checked(request)
        n = 0
        cursor = None
        for _ in range(100):
            page = await d.admin.pending(QUEUE, min_idle_s=VISIBILITY_S / 3 + 1, count=1000,
                                         cursor=cursor)
            for e in page.items:
                if e.job_id and (await d.admin.requeue(QUEUE, e.job_id, who="demo")) \
                        == "requeued":
                    n += 1
            if page.cursor is None:
                break
            cursor = page.cursor
        await d.admin.audit(QUEUE, "reclaim-now", who="demo", outcome=f"requeued {n}")
        return _done(d, request, QUEUE, f"reclaimed {n} jobs from hung workers", "/demo")

    scheduler = Scheduler.from_url(url, queues=[QUEUE], cron=CRON,
                                   queue_config=QueueConfig(key_prefix=prefix))

    async def announce(fresh: bool) -> None:
        if fresh:  # the seeded jobs' outcomes are on the first page
            await settled(dash.admin)
        if on_ready is not None:
            on_ready()

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        fresh = seeded and await seed(producer)
        if seeded:
            await scheduler.start()
        ready = None
        try:
            await pool.apply(PoolSettings(size=2))
            ready = asyncio.create_task(announce(fresh))
            yield
        finally:
            try:
                if ready is not None:
                    ready.cancel()
                await pool.close()
            finally:
                await scheduler.stop()
                await producer.close()
                await dash.aclose()

    app = Starlette(routes=[
        Route("/demo", guarded(dash, panel), methods=["GET"]),
        Route("/demo/enqueue", guarded(dash, enqueue), methods=["POST"]),
        Route("/demo/pool", guarded(dash, resize), methods=["POST"]),
        Route("/demo/reclaim", guarded(dash, reclaim), methods=["POST"]),
        Mount("/", app=dashboard),
    ], lifespan=lifespan)
    app.state.dashboard = dash
    app.state.pool = pool
    return app
