"""The flow page (``/flow?q=Q&id=ID``): a job's place in a workflow, read through
``AsyncAdmin.flow`` (docs/dashboard.md#flows).

The page shows the jobs waiting for this one (its parents), a batch's progress counts, and its
dependencies as an indented tree: one page of direct dependencies (``page_size``, with a cursor
for the next: a 10,000 -> 1 fan-in is never drawn at once), and below each one that still
waits or was dead-lettered its own dependencies, a few levels down, within a fixed budget of
reads. Every node links to its job page and to its own flow page.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from .._core.errors import InvalidArgument
from .._core.keys import check_job_id
from ._app import Dashboard
from ._flowtree import MAX_DEPTH, PARENTS_LIMIT, Node, Viewable, callbacks, children_cursor, expand
from ._views import param, queue_param


async def flow_page(dash: Dashboard, request: Request) -> Response:
    q = queue_param(request)
    job_id = check_job_id(param(request, "id", required=True, max_len=200) or "")
    if not await dash.can(request, "view", q):
        raise HTTPException(403, f"not allowed to view queue {q!r}")
    cursor = param(request, "cursor", max_len=64)
    pcursor = param(request, "pcursor", max_len=64)
    if cursor is not None and cursor.startswith("p:"):
        raise InvalidArgument("cursor: pass back the one a page gave (parents page with pcursor)")
    if pcursor is not None and not pcursor.startswith("p:"):
        raise InvalidArgument("pcursor: pass back the one a page gave")
    a = dash.admin
    view = await a.flow(q, job_id, cursor=cursor, limit=dash.cfg.page_size)
    if cursor is None and pcursor is None and view.cursor == "":
        parents, next_p = view.parents, None  # (all on this one page)
    else:
        pv = await a.flow(q, job_id, cursor=pcursor or "p:0", limit=PARENTS_LIMIT)
        parents, next_p = pv.parents, pv.cursor or None
    nodes = [Node(e) for e in view.children]
    viewable = Viewable(dash, request)
    await viewable.learn(e.queue for e in parents)
    await expand(dash, nodes, viewable)
    next_c = children_cursor(view)
    base = {"q": q, "id": job_id}
    return dash.render(
        request, "flow.html", title=f"flow {job_id}", q=q, job_id=job_id, view=view,
        nodes=nodes, parents=parents, blocked=view.blocked_by, cursor=cursor, pcursor=pcursor,
        callbacks=callbacks(view), first_url="?" + urlencode(base),
        next_url="?" + urlencode({**base, "cursor": next_c}) if next_c else None,
        next_parents_url="?" + urlencode({**base, "pcursor": next_p}) if next_p else None,
        max_depth=MAX_DEPTH, viewable=viewable, topic=f"job {q} {job_id}")


ROUTES: list[tuple[str, str, Any]] = [("/flow", "GET", flow_page)]
