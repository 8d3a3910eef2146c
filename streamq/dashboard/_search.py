"""The search box (overview and queue pages) and its results page: ``/search?s=...``.

The box takes one line of terms (docs/search.md#dashboard): ``type:email.send state:failed
customer_id:42 error:"card declined" since:2h id:abc*``; a bare word is a job id (or a prefix
ending in ``*``); any other ``name:value`` is a declared payload field. The page reads one
page of ``Admin.find`` and links the next one with its cursor."""

from __future__ import annotations

import datetime as dt
import shlex
from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from .._core.driver import adrive
from .._core.errors import InvalidSearch
from .._core.keys import check_queue_name
from .._ops.browse import now_ms
from ._app import Dashboard

KEYS = ("id", "type", "state", "group", "error", "etype", "since", "until", "queue")
SCAN_MAX = 10_000


def _when(text: str, now: int, name: str) -> int:
    t = text.strip()
    if t.isdigit() and len(t) >= 10:
        return int(t)
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if t and t[-1] in units:
        try:
            return now - int(float(t[:-1]) * units[t[-1]] * 1000)
        except ValueError:
            pass
    try:
        d = dt.datetime.fromisoformat(t)
    except ValueError:
        raise InvalidSearch(f"{name}: not a time: {text!r} (2h, 1d, 2026-11-29T07:00 or epoch"
                            " ms)") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.UTC)
    return int(d.timestamp() * 1000)


def parse(text: str, now: int) -> dict[str, Any]:
    """The box's terms -> ``Admin.find`` keyword arguments. Raises InvalidSearch."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise InvalidSearch(f"search: {exc} (quote text with spaces: error:\"timed out\")"
                            ) from None
    out: dict[str, Any] = {}
    fields: dict[str, str] = {}
    for w in words:
        name, colon, value = w.partition(":")
        if not colon:
            name, value = "id", w
        if not value:
            raise InvalidSearch(f"search: {w!r} has no value")
        if name == "id":
            if value.endswith("*"):
                out["id_prefix"] = value.rstrip("*")
            else:
                out["id"] = value
        elif name in ("type", "state", "group", "error"):
            out[name] = value
        elif name == "etype":
            out["error_type"] = value
        elif name in ("since", "until"):
            out[f"{name}_ms"] = _when(value, now, name)
        elif name == "queue":
            out["queue"] = check_queue_name(value)
        else:
            fields[name] = value
    if fields:
        out["fields"] = fields
    return out


async def search_page(dash: Dashboard, request: Request) -> Response:
    text = (request.query_params.get("s") or "").strip()
    if len(text) > 500:
        raise InvalidSearch("search: longer than 500 characters")
    scope = request.query_params.get("q") or None  # the queue page's box: that queue
    if scope is not None:
        check_queue_name(scope)
    if not await dash.can(request, "view", scope):
        raise HTTPException(403, "not allowed to view this queue" if scope else
                            "not allowed to view the dashboard")
    cursor = request.query_params.get("cursor") or None
    a = dash.admin
    page = None
    hits: list[Any] = []
    if text:
        now = await adrive(await a.client_for(scope or ""), now_ms())
        kw = parse(text, now)
        if scope is not None:
            kw["queue"] = scope
        page = await a.find(limit=dash.cfg.page_size, cursor=cursor, max_scan=SCAN_MAX, **kw)
        hits = [h for h in page.items if await dash.can(request, "view", h.queue)]
        if set(kw) <= {"id", "queue"} and len(hits) == 1 and cursor is None:  # a bare id
            root = request.scope.get("root_path", "")
            where = urlencode({"q": hits[0].queue, "id": hits[0].job_id})
            return RedirectResponse(f"{root}/job?{where}", status_code=303)
    base = {"s": text, **({"q": scope} if scope else {})}
    unindexed = sorted(n for n, s in (page.index_since_ms if page else {}).items() if s is None)
    ctx: dict[str, Any] = {"q": scope} if scope else {}
    return dash.render(
        request, "search.html", title=f"search {text}" if text else "search", text=text,
        scope=scope, page=page, hits=hits, unindexed=unindexed,
        next_url=f"?{urlencode({**base, 'cursor': page.cursor})}" if page and page.cursor
        else None, **ctx)


ROUTES: list[tuple[str, str, Any]] = [("/search", "GET", search_page)]
