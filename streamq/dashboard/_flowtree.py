"""What the flow page and the job page's flow panel show of a workflow, read through
``AsyncAdmin.flow`` (docs/dashboard.md#flows): the dependency tree below one page of a job's
dependencies, within a fixed budget of reads, and the job page's first few edges."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

import attrs
from starlette.requests import Request

from .._core.errors import JobNotFound
from .._ops.flows import FlowEdge, FlowView
from ._app import Dashboard

EXPAND_STATES = frozenset({"waiting", "failed"})
"""Nodes whose own dependencies the tree shows (others either never had any or no longer
keep them: a completed or cancelled job's pending SET and results go when it ends)."""
MAX_DEPTH = 4
"""Levels of the tree below the page's own dependencies."""
MAX_EXPAND = 20
"""Nodes expanded a page (one ``Admin.flow`` read each, 8 at a time)."""
SUB_LIMIT = 10
"""Dependencies shown under an expanded node (then: 'more: open its flow')."""
PARENTS_LIMIT = 50
PANEL_LIMIT = 10
"""Dependencies and parents the job page lists."""


@attrs.define
class Node:
    """One dependency in the tree: the edge, and (when expanded) its own dependencies."""

    edge: FlowEdge
    children: list[Node] = attrs.field(factory=list)
    expanded: bool = False
    more: bool = False
    """Expanded, and it has more dependencies than shown."""


class Viewable:
    """The queues this request may view (``authorize(request, "view", queue)``, asked once per
    queue): an edge into another queue is shown, and expanded, only when that one is too."""

    def __init__(self, dash: Dashboard, request: Request) -> None:
        self.dash, self.request = dash, request
        self.known: dict[str, bool] = {}

    async def learn(self, queues: Iterable[str]) -> None:
        for q in sorted(set(queues) - self.known.keys()):
            self.known[q] = await self.dash.can(self.request, "view", q)

    def __call__(self, queue: str) -> bool:
        return self.known.get(queue, False)


async def expand(dash: Dashboard, roots: list[Node], viewable: Viewable) -> int:
    """Breadth first below ``roots``, at most ``MAX_EXPAND`` reads; how many were made."""
    level, reads = roots, 0
    sem = asyncio.Semaphore(8)

    async def one(n: Node) -> None:
        async with sem:
            try:
                v = await dash.admin.flow(n.edge.queue, n.edge.job_id, limit=SUB_LIMIT)
            except JobNotFound:  # (ended and expired between the two reads)
                return
        n.expanded = True
        n.children = [Node(e) for e in v.children]
        n.more = bool(v.cursor) and not v.cursor.startswith("p:")

    for _ in range(MAX_DEPTH):
        await viewable.learn(n.edge.queue for n in level)
        todo = [n for n in level if n.edge.state in EXPAND_STATES
                and viewable(n.edge.queue)][:MAX_EXPAND - reads]
        if not todo:
            break
        await asyncio.gather(*(one(n) for n in todo))
        reads += len(todo)
        level = [c for n in todo for c in n.children]
    await viewable.learn(n.edge.queue for n in level)
    return reads


def children_cursor(view: FlowView) -> str | None:
    """The cursor of the next page of dependencies (None: this was the last)."""
    return view.cursor if view.cursor and not view.cursor.startswith("p:") else None


def callbacks(view: FlowView) -> list[tuple[str, str, str]]:
    """A batch's callbacks as (kind, job id, state)."""
    if view.batch is None:
        return []
    out = []
    for kind, text in sorted(view.batch.callbacks.items()):
        cid, _, state = text.rpartition(" ")
        out.append((kind, cid, state))
    return out


@attrs.frozen
class Panel:
    """The job page's flow panel: the first dependencies and parents, whether there are more."""

    state: str
    children: list[FlowEdge]
    parents: list[FlowEdge]
    more_children: bool
    more_parents: bool
    batch: bool
    pending_total: int
    ended_total: int
    parents_total: int
    viewable: frozenset[str]
    """The queues of these edges the request may view (the others' jobs are not named)."""

    @property
    def empty(self) -> bool:
        return not (self.children or self.parents or self.batch or self.state == "waiting")


async def panel(dash: Dashboard, request: Request, q: str, job_id: str) -> Panel | None:
    """The flow panel of a job page (None when the job's record is gone meanwhile)."""
    try:
        view = await dash.admin.flow(q, job_id, limit=PANEL_LIMIT)
        parents, more_p = view.parents, False
        if view.cursor:
            pv = await dash.admin.flow(q, job_id, cursor="p:0", limit=PANEL_LIMIT)
            parents, more_p = pv.parents, bool(pv.cursor)
    except JobNotFound:
        return None
    viewable = Viewable(dash, request)
    await viewable.learn(e.queue for e in [*view.children, *parents])
    return Panel(view.state, view.children, parents[:PANEL_LIMIT],
                 children_cursor(view) is not None, more_p or len(parents) > PANEL_LIMIT,
                 view.batch is not None, view.pending_total, view.ended_total,
                 view.parents_total, frozenset(k for k, v in viewable.known.items() if v))

