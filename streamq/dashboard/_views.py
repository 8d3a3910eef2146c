"""The pages (GET). Each reads what it shows through the admin API, one page at a time."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response, StreamingResponse

from .._core.driver import adrive
from .._core.errors import InvalidArgument
from .._core.keys import RECENT_KEEP, check_job_id, check_queue_name
from .._ops import operations as _ops
from .._ops.browse import now_ms, recent, recent_completed
from .._ops.operations import PAGE
from .._ops.shards import check_cursor
from ..admin import DeadFilter, ListFilter, QueueStats
from ._app import Dashboard
from ._charts import WINDOWS, auto_window, charts, window
from ._flowtree import panel
from ._live import gather_bounded, stats_cells

TABS = ("ready", "active", "waiting", "scheduled", "retrying", "dead", "completed", "cancelled",
        "workers", "cron", "charts")
KEEPALIVE_S = 15.0
SCAN = 5 * PAGE
"""Entries a filtered dead-letter or finished-jobs page reads at most (then: next page)."""


def param(request: Request, name: str, *, required: bool = False, max_len: int = 256
          ) -> str | None:
    v = request.query_params.get(name)
    if v is None or v == "":
        if required:
            raise InvalidArgument(f"missing parameter {name!r}")
        return None
    if len(v) > max_len:
        raise InvalidArgument(f"parameter {name!r} is longer than {max_len} characters")
    return v


def queue_param(request: Request) -> str:
    return check_queue_name(param(request, "q", required=True) or "")


def duration_s(text: str | None, name: str) -> float | None:
    """'90', '90s', '5m', '2h', '1d' -> seconds; InvalidArgument otherwise."""
    if text is None:
        return None
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        v = float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except ValueError:
        raise InvalidArgument(f"{name}: not a duration: {text!r} (e.g. 90s, 5m, 2h)") from None
    if not 0 <= v <= 10 * 365 * 86400:
        raise InvalidArgument(f"{name}: out of range: {text!r}")
    return v


async def overview(dash: Dashboard, request: Request) -> Response:
    if not await dash.can(request, "view", None):
        raise HTTPException(403, "not allowed to view the dashboard")
    after = param(request, "after", max_len=128)
    if after is not None:
        check_queue_name(after)
    page, next_after, total = await dash.queue_names(after)
    names = [n for n in page if await dash.can(request, "view", n)]
    got, rates = await asyncio.gather(gather_bounded(dash.admin.stats(n) for n in names),
                                      dash.hub.rates(names))
    rows: list[dict[str, Any]] = []
    for n, s in zip(names, got, strict=True):
        if isinstance(s, QueueStats):
            rows.append({"name": n, "s": s, "cells": stats_cells(s, rates[n])})
        elif isinstance(s, Exception):
            rows.append({"name": n, "s": None, "cells": {}, "error": str(s)})
    return dash.render(request, "overview.html", title="Queues", rows=rows, total=total,
                       after=after, next_url=f"?{urlencode({'after': next_after})}"
                       if next_after else None,
                       topic="overview" if after is None else f"overview {after}")


def _filters(request: Request, tab: str) -> tuple[dict[str, str], float | None, float | None]:
    shown = {k: v for k in ("type", "error", "newer", "older")
             if (v := param(request, k, max_len=200)) is not None}
    if "error" in shown and tab != "dead":
        raise InvalidArgument("the error filter applies to dead letters only")
    return shown, duration_s(shown.get("newer"), "newer"), duration_s(shown.get("older"), "older")


async def queue_page(dash: Dashboard, request: Request) -> Response:
    q = queue_param(request)
    if not await dash.can(request, "view", q):
        raise HTTPException(403, f"not allowed to view queue {q!r}")
    tab = param(request, "tab") or "ready"
    if tab not in TABS:
        raise InvalidArgument(f"unknown tab {tab!r}; tabs: {', '.join(TABS)}")
    cursor = param(request, "cursor", max_len=64)
    stats, rates = await asyncio.gather(dash.admin.stats(q), dash.hub.rates([q]))
    shown, newer_s, older_s = _filters(request, tab)
    timed = (newer_s is not None or older_s is not None) and tab != "dead"
    now = await adrive(await dash.admin.client_for(q), now_ms()) if timed else 0
    flt = ListFilter(type=shown.get("type"),
                     since_ms=int(now - newer_s * 1000) if newer_s is not None else None,
                     until_ms=int(now - older_s * 1000) if older_s is not None else None)
    size = dash.cfg.page_size
    a = dash.admin
    shards = max(a.config.shards, a.ops.layout(q).read)  # (old shards of a reshard too)
    items: list[Any] = []
    next_cursor: str | None = None
    extra: dict[str, Any] = {"recent_list": False}
    if tab == "ready":
        page = await a.ready(q, flt, limit=size, cursor=cursor)
    elif tab == "active":
        page = await a.pending(q, count=size, cursor=check_cursor(cursor, shards))
    elif tab in ("scheduled", "retrying", "waiting"):
        page = await a.delayed(q, tab, flt, limit=size, cursor=cursor)
    elif tab == "dead":
        dflt = DeadFilter(type=shown.get("type"), error_type=shown.get("error"),
                          older_than_s=older_s, newer_than_s=newer_s)
        page = await adrive(await a.client_for(q), a.ops.listing(  # every shard
            q, None, check_cursor(cursor, shards), size, lambda k, c, n: _ops.dead_list(
                k, dflt, limit=n, cursor=c, scan_pages=SCAN // PAGE)))
    elif tab == "completed" and cursor is None and not from_events(dash):
        page = None
        found = await adrive(await a.client_for(q), a.ops.concat(
            q, None, lambda k: recent_completed(k, flt, limit=size)))
        items = sorted(found, key=lambda j: -j.at_ms)[:size]
        extra["recent_list"] = True
        if not items and not shown:  # (older workers keep no list: the events stream)
            page = await _from_events(dash, q, tab, flt, cursor)
            extra["recent_list"] = False
    elif tab in ("completed", "cancelled"):
        page = await _from_events(dash, q, tab, flt, cursor)
    elif tab == "charts":
        page = None
        win = window(param(request, "range"))
        minutes, now = await asyncio.gather(a.series(q, False),
                                            adrive(await a.client_for(q), now_ms()))
        win = win or auto_window(minutes, now)
        points = await a.series(q, True) if win.hours else minutes
        items = charts(points, now, win)
        extra.update(window=win, windows=WINDOWS)
    elif tab == "workers":
        page = None
        everyone = await a.workers(q)
        show_dead = param(request, "dead") == "1"
        items = [w for w in everyone if show_dead or w.alive]
        extra.update(show_dead=show_dead, dead_count=sum(not w.alive for w in everyone))
        extra["shard_slots"] = await a.shard_slots(q)  # [] on one server
        extra["server"] = (await a.server()).describe() if extra["shard_slots"] else ""
    else:
        page = None
        items = list(await a.cron(q))
    if page is not None:
        items, next_cursor = page.items, page.cursor
    base = {"q": q, "tab": tab, **shown}
    acts = {n: await dash.can(request, n, q) for n in
            ("pause", "resume", "redrive", "redrive-all", "purge-dead", "run-now", "cancel",
             "requeue")}
    return dash.render(
        request, "queue.html", title=q, q=q, s=stats, cells=stats_cells(stats, rates[q]),
        tab=tab, tabs=TABS, items=items, shown=shown, cursor=cursor, acts=acts,
        next_url=f"?{urlencode({**base, 'cursor': next_cursor})}" if next_cursor else None,
        first_url=f"?{urlencode(base)}", topic=f"queue {q}",
        tab_url=lambda t, **kw: "?" + urlencode({"q": q, "tab": t, **kw}),
        completed_events=from_events(dash), recent_keep=RECENT_KEEP, **extra)


def from_events(dash: Dashboard) -> bool:
    """Whether the queue's config says its workers write ``completed`` events: then the
    completed tab pages through them (full history within ``events_maxlen``); otherwise it
    shows the capped recent completions list every worker keeps."""
    cfg = dash.cfg.queue_config
    return cfg.events_maxlen > 0 and "completed" in cfg.event_kinds


async def _from_events(dash: Dashboard, q: str, tab: str, flt: ListFilter,
                       cursor: str | None) -> Any:
    a = dash.admin
    return await adrive(await a.client_for(q), a.ops.listing(
        q, None, cursor, dash.cfg.page_size, lambda k, c, n: recent(
            k, tab, flt, limit=n, cursor=c, scan=SCAN)))


async def job_page(dash: Dashboard, request: Request) -> Response:
    q = queue_param(request)
    job_id = check_job_id(param(request, "id", required=True, max_len=200) or "")
    if not await dash.can(request, "view", q):
        raise HTTPException(403, f"not allowed to view queue {q!r}")
    info = await dash.admin.job(q, job_id)
    created = _ms(info.created_at)
    moments = [_ms(t) for t in (info.created_at, info.enqueued_at, info.started_at,
                                info.finished_at)]
    moments += [int(e["t"]) for e in info.errors if isinstance(e.get("t"), int)]
    timeline, lease, flow = await asyncio.gather(
        dash.admin.timeline(q, job_id, created, moments), dash.admin.lease(q, job_id),
        panel(dash, request, q, job_id))
    dead = None
    if info.state == "failed" and info.finished_at is not None:
        dead = await dash.admin.find_dead(q, job_id, int(info.finished_at.timestamp() * 1000))
    acts = {n: await dash.can(request, n, q) for n in ("redrive", "run-now", "cancel", "requeue")}
    return dash.render(request, "job.html", title=job_id, q=q, job=info, env=info.envelope,
                       timeline=timeline, lease=lease, dead=dead, acts=acts, flow=flow,
                       topic=f"job {q} {job_id}")


def _ms(t: Any) -> int:
    return int(t.timestamp() * 1000) if t is not None else 0


async def find(dash: Dashboard, request: Request) -> Response:
    """Lookup by exact job id (one HGETALL): straight to the job's page, or a 404 page."""
    q = queue_param(request)
    job_id = (param(request, "id", required=True, max_len=200) or "").strip()
    check_job_id(job_id)
    if not await dash.can(request, "view", q):
        raise HTTPException(403, f"not allowed to view queue {q!r}")
    await dash.admin.job(q, job_id)
    root = request.scope.get("root_path", "")
    return RedirectResponse(f"{root}/job?{urlencode({'q': q, 'id': job_id})}", status_code=303)


async def confirm(dash: Dashboard, request: Request) -> Response:
    """Before a bulk action: what it will touch, counted first."""
    q = queue_param(request)
    action = param(request, "action", required=True)
    if action not in ("redrive-all", "purge-dead"):
        raise InvalidArgument(f"nothing to confirm for {action!r}")
    if not await dash.can(request, action, q):
        raise HTTPException(403, f"not allowed to {action} on {q!r}")
    shown, newer_s, older_s = _filters(request, "dead")
    stats = await dash.admin.stats(q)
    if action == "purge-dead" or not shown:
        count, exact = stats.dead, True
    else:
        count, exact = await dash.admin.count_dead(q, DeadFilter(
            type=shown.get("type"), error_type=shown.get("error"), older_than_s=older_s,
            newer_than_s=newer_s))
    return dash.render(request, "confirm.html", title=f"{action} {q}", q=q, action=action,
                       count=count, exact=exact, shown=shown, topic=f"queue {q}")


async def task_page(dash: Dashboard, request: Request) -> Response:
    task = dash.tasks.get(param(request, "id", required=True, max_len=64) or "")
    if task is None:
        raise HTTPException(404, "no such task (tasks live in the dashboard process)")
    if not await dash.can(request, "view", task.queue):
        raise HTTPException(403, "not allowed")
    return dash.render(request, "task.html", title="re-drive", task=task, q=task.queue,
                       topic=f"task {task.id}")


def live(dash: Dashboard) -> Callable[[Request], Awaitable[Response]]:
    """``/live?topic=...``: Server-Sent Events of cell values for one page."""

    async def handler(request: Request) -> Response:
        topic = param(request, "topic", max_len=400) or ""
        parts = topic.split(" ")
        try:
            if parts[0] == "overview" and len(parts) <= 2:
                queue = None
                if len(parts) == 2:
                    check_queue_name(parts[1])
            elif parts[0] in ("queue", "job") and len(parts) == (2 if parts[0] == "queue" else 3):
                queue = check_queue_name(parts[1])
                if parts[0] == "job":
                    check_job_id(parts[2])
            elif parts[0] == "task" and len(parts) == 2 and parts[1] in dash.tasks:
                queue = dash.tasks[parts[1]].queue
            else:
                raise InvalidArgument(f"unknown live topic {topic!r}")
        except InvalidArgument as exc:
            return dash.error(request, 400, str(exc))
        if not await dash.can(request, "view", queue):
            return dash.error(request, 403, "not allowed")

        visible: dict[str, bool] = {}

        async def only_visible(data: str) -> str:
            """The overview is one topic for everyone: drop the cells of queues this
            request may not view (CPU only; Redis is read once for all tabs)."""
            frame = json.loads(data)
            for part in frame.values():
                for key in list(part):
                    name = key.rsplit(":", 1)[0]
                    if name not in visible:
                        visible[name] = await dash.can(request, "view", name)
                    if not visible[name]:
                        del part[key]
            return json.dumps(frame, sort_keys=True)

        async def stream() -> AsyncIterator[str]:
            try:
                async with dash.hub.subscribe(topic) as inbox:
                    yield "retry: 2000\n\n"
                    while True:
                        try:
                            data = await asyncio.wait_for(inbox.get(), KEEPALIVE_S)
                        except TimeoutError:
                            yield ": keepalive\n\n"
                            continue
                        if queue is None and dash.cfg.authorize is not None:
                            data = await only_visible(data)
                        yield f"data: {data}\n\n"
            except OverflowError:
                yield "event: error\ndata: busy\n\n"

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-store", "x-accel-buffering": "no"})

    return handler


ROUTES: list[tuple[str, str, Any]] = [
    ("/", "GET", overview), ("/queue", "GET", queue_page), ("/job", "GET", job_page),
    ("/find", "GET", find), ("/confirm", "GET", confirm), ("/task", "GET", task_page),
]
