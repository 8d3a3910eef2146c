"""The actions (POST only): CSRF-checked, refused in read-only mode or when ``authorize``
says no, and each recorded in the queue's events stream (``ev`` = ``admin``: who, what,
outcome; the time is the entry id)."""

from __future__ import annotations

import asyncio
import logging
import secrets
from typing import Any
from urllib.parse import urlencode

from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from .._core.errors import InvalidArgument
from .._core.keys import check_job_id, check_queue_name
from .._ops.browse import check_stream_id
from ..admin import DeadFilter
from ._app import Dashboard
from ._live import BulkTask
from ._views import duration_s

log = logging.getLogger("streamq.dashboard")
BATCH = 1000
MAX_BULK = 1_000_000
MAX_TASKS = 100


def _field(form: FormData, name: str, *, required: bool = False, max_len: int = 256
           ) -> str | None:
    v = form.get(name)
    if not isinstance(v, str) or v == "":
        if required:
            raise InvalidArgument(f"missing form field {name!r}")
        return None
    if len(v) > max_len:
        raise InvalidArgument(f"form field {name!r} is longer than {max_len} characters")
    return v


async def _checked(dash: Dashboard, request: Request, action: str) -> tuple[FormData, str, str]:
    """The form, queue and who of an allowed, CSRF-valid action; 403 otherwise."""
    if dash.cfg.read_only:
        raise HTTPException(403, "the dashboard is read-only")
    if int(request.headers.get("content-length") or 0) > 64 * 1024:
        raise InvalidArgument("form too large")
    form = await request.form(max_files=0, max_fields=20)
    if not dash.csrf.valid(request, _field(form, "csrf", max_len=128)):
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and try again")
    q = check_queue_name(_field(form, "q", required=True) or "")
    if not await dash.can(request, action, q):
        raise HTTPException(403, f"not allowed to {action} on queue {q!r}")
    return form, q, dash.identify(request)


def _done(dash: Dashboard, request: Request, q: str, message: str, back: str) -> Response:
    """htmx gets a flash fragment and an event that refreshes the live parts of the page;
    a plain form post gets a page with the outcome and a link back."""
    if request.headers.get("hx-request") == "true":
        resp = dash.render(request, "_flash.html", message=message)
        resp.headers["hx-trigger"] = "sq:changed"
        return resp
    return dash.render(request, "message.html", title="done", message=message, back=back)


def _job_url(request: Request, q: str, job_id: str) -> str:
    root = request.scope.get("root_path", "")
    return f"{root}/job?{urlencode({'q': q, 'id': job_id})}"


def _queue_url(request: Request, q: str, tab: str = "ready") -> str:
    root = request.scope.get("root_path", "")
    return f"{root}/queue?{urlencode({'q': q, 'tab': tab})}"


async def pause(dash: Dashboard, request: Request) -> Response:
    action = "pause" if request.url.path.endswith("/pause") else "resume"
    _, q, who = await _checked(dash, request, action)
    await dash.admin.stats(q)  # an unknown queue: 404, not a stray key
    await (dash.admin.pause(q) if action == "pause" else dash.admin.resume(q))
    await dash.admin.audit(q, action, who=who, outcome="paused" if action == "pause"
                           else "resumed")
    return _done(dash, request, q, f"{q}: {action}d", _queue_url(request, q))


async def job_action(dash: Dashboard, request: Request) -> Response:
    action = request.url.path.rsplit("/", 1)[1]
    form, q, who = await _checked(dash, request, action)
    job_id = check_job_id(_field(form, "id", required=True, max_len=200) or "")
    a = dash.admin
    if action == "run-now":
        message = await a.run_now(q, job_id, who=who)
    elif action == "cancel":
        res = await a.cancel(q, job_id, who=who)
        message = ("cancelled" if res.cancelled else "cancel requested: the job is running;"
                   " its worker stops it" if res.code == "cancel_requested"
                   else f"not cancelled: {res.reason}")
    elif action == "requeue":
        message = await a.requeue(q, job_id, who=who)
        await a.audit(q, action, job_id=job_id, who=who, outcome=message)
    else:  # redrive one
        info = await a.job(q, job_id)
        dead_id = _field(form, "dead_id", max_len=64)
        entry = None
        if dead_id is None and info.finished_at is not None:
            entry = await a.find_dead(q, job_id, int(info.finished_at.timestamp() * 1000))
        elif dead_id is not None:
            page = await a.dead(q, limit=1, cursor=_after(dead_id), oldest_first=True)
            entry = next((e for e in page.items if e.dead_id == dead_id
                          and e.job_id == job_id), None)
        if entry is None:
            message = f"not re-driven: job is {info.state}, no dead entry found"
        else:
            out = await a.redrive(q, [entry], who=who)
            message = ", ".join(f"{k}: {v}" for k, v in out.items())
        await a.audit(q, "redrive", job_id=job_id, who=who, outcome=message)
    return _done(dash, request, q, f"{job_id}: {message}", _job_url(request, q, job_id))


def _after(dead_id: str) -> str:
    """The cursor just before ``dead_id`` for an oldest-first listing."""
    check_stream_id(dead_id)
    ms, _, seq = dead_id.partition("-")
    if int(seq) > 0:
        return f"{ms}-{int(seq) - 1}"
    return f"{int(ms) - 1}-{2**63 - 1}" if int(ms) > 0 else "0-0"


async def purge_dead(dash: Dashboard, request: Request) -> Response:
    _, q, who = await _checked(dash, request, "purge-dead")
    await dash.admin.stats(q)
    n = await dash.admin.purge(q, "failed", max_jobs=MAX_BULK)
    await dash.admin.audit(q, "purge-dead", who=who, outcome=f"purged {n}")
    return _done(dash, request, q, f"purged {n:,} dead jobs", _queue_url(request, q, "dead"))


async def redrive_all(dash: Dashboard, request: Request) -> Response:
    """Start re-driving every dead job matching the filter, at most the confirmed count,
    oldest first, in batches of 1,000; the task page shows progress live."""
    form, q, who = await _checked(dash, request, "redrive-all")
    try:
        total = int(_field(form, "count", required=True, max_len=12) or "")
    except ValueError:
        raise InvalidArgument("count must be a number") from None
    if not 0 < total <= MAX_BULK:
        raise InvalidArgument(f"count must be 1-{MAX_BULK:,}")
    flt = DeadFilter(type=_field(form, "type", max_len=200),
                     error_type=_field(form, "error", max_len=200),
                     newer_than_s=duration_s(_field(form, "newer"), "newer"),
                     older_than_s=duration_s(_field(form, "older"), "older"))
    if sum(t.state == "running" for t in dash.tasks.values()) >= 4:
        raise HTTPException(429, "four bulk re-drives are running already; wait for one")
    while len(dash.tasks) >= MAX_TASKS:
        dash.tasks.pop(next(iter(dash.tasks)))
    task = BulkTask(secrets.token_hex(8), q, total)
    dash.tasks[task.id] = task
    bg = asyncio.create_task(_run_bulk(dash, task, flt, who))
    _BACKGROUND.add(bg)
    bg.add_done_callback(_BACKGROUND.discard)
    root = request.scope.get("root_path", "")
    url = f"{root}/task?{urlencode({'id': task.id})}"
    if request.headers.get("hx-request") == "true":
        resp = Response(status_code=204)
        resp.headers["hx-redirect"] = url
        return resp
    return Response(status_code=303, headers={"location": url})


_BACKGROUND: set[asyncio.Task[Any]] = set()


async def _run_bulk(dash: Dashboard, task: BulkTask, flt: DeadFilter, who: str) -> None:
    a = dash.admin
    cursor: str | None = None
    try:
        await a.audit(task.queue, "redrive-all", who=who, outcome=f"started, up to {task.total}")
        while task.done < task.total:
            page = await a.dead(task.queue, flt, limit=min(BATCH, task.total - task.done),
                                cursor=cursor, oldest_first=True)
            if page.items:
                for k, v in (await a.redrive(task.queue, page.items, who=who)).items():
                    task.outcome[k] = task.outcome.get(k, 0) + v
                task.done += len(page.items)
            if page.cursor is None:
                break
            cursor = page.cursor
            await asyncio.sleep(0)
        task.state = "done"
    except Exception as exc:  # noqa: BLE001 - shown on the task page and in the audit
        task.state, task.error = "failed", str(exc)
        log.warning("dashboard: bulk re-drive of %s failed: %s", task.queue, exc)
    outcome = ", ".join(f"{k} {v}" for k, v in sorted(task.outcome.items())) or "nothing"
    try:
        await a.audit(task.queue, "redrive-all", who=who, outcome=f"{task.state}: {outcome}")
    except Exception as exc:  # noqa: BLE001 - Redis gone: nothing more to record
        log.warning("dashboard: audit failed: %s", exc)


ROUTES: list[tuple[str, str, Any]] = [
    ("/action/pause", "POST", pause), ("/action/resume", "POST", pause),
    ("/action/run-now", "POST", job_action), ("/action/cancel", "POST", job_action),
    ("/action/requeue", "POST", job_action), ("/action/redrive", "POST", job_action),
    ("/action/purge-dead", "POST", purge_dead), ("/action/redrive-all", "POST", redrive_all),
]
