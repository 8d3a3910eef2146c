"""Live updates: one poller per dashboard process feeds every open tab's Server-Sent Events.

Tabs subscribe to a *topic* (``overview [<after>]``, ``queue <name>``, ``job <queue> <id>``,
``task <id>``: a space separates the parts, as no queue name or job id holds one). The
poller runs only while someone listens: each round it reads what the subscribed topics need
once (the stats of the queues shown, the state of the jobs shown) and sends each tab a small
JSON map of cell values when they changed. A hundred tabs on the same
page cost Redis what one costs. Tabs close their stream while hidden (``dashboard.js``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import attrs

from ..admin import AsyncAdmin, QueueStats

log = logging.getLogger("streamq.dashboard")
T = TypeVar("T")
MAX_TOPICS = 1000
"""Distinct topics polled at once (each job topic is one HMGET a round)."""
CONCURRENCY = 16
"""Operations in flight at once for one page or poll round (redis-py's asyncio pool refuses
more than its max_connections)."""


async def gather_bounded(aws: Iterable[Awaitable[T]]) -> list[T | BaseException]:
    """``asyncio.gather(..., return_exceptions=True)`` with at most CONCURRENCY running."""
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(aw: Awaitable[T]) -> T:
        async with gate:
            return await aw

    return await asyncio.gather(*(one(aw) for aw in aws), return_exceptions=True)


@attrs.define
class BulkTask:
    """Progress of a re-drive of every dead job matching a filter (capped batches)."""

    id: str
    queue: str
    total: int
    done: int = 0
    outcome: dict[str, int] = attrs.Factory(dict)
    state: str = "running"
    error: str = ""


def _fmt_age(s: float | None) -> str:
    return "-" if s is None else f"{s:,.1f} s"


INFO_SUFFIXES = (":completed_pm", ":failed_pm", ":oldest", ":paused", ":workers")
"""Cells that change on every round (ages, rates) or say nothing about a list: shown, never a
reason to re-read one."""


def stats_cells(s: QueueStats, rate: tuple[float, float] | None) -> dict[str, str]:
    q = s.queue
    c = s.counters
    return {f"{q}:ready": f"{s.ready:,}", f"{q}:active": f"{s.pending:,}",
            f"{q}:scheduled": f"{s.scheduled:,}", f"{q}:retrying": f"{s.retrying:,}",
            f"{q}:dead": f"{s.dead:,}", f"{q}:completed": f"{c.get('completed', 0):,}",
            f"{q}:failed": f"{c.get('failed', 0):,}",
            f"{q}:completed_pm": "…" if rate is None else f"{rate[0]:,.0f}",
            f"{q}:failed_pm": "…" if rate is None else f"{rate[1]:,.0f}",
            f"{q}:oldest": _fmt_age(s.oldest_ready_age_s),
            f"{q}:workers": f"{s.workers_alive:,}",
            f"{q}:group_waiting": f"{s.group_waiting:,}",
            f"{q}:waiting": f"{s.waiting:,}",
            f"{q}:paused": "PAUSED" if s.paused else ""}


def message(cells: dict[str, str]) -> str:
    """One SSE frame: ``cells`` whose change makes a page's lists stale, ``info`` the rest."""
    info = {k: v for k, v in cells.items() if k.endswith(INFO_SUFFIXES)}
    return json.dumps({"cells": {k: v for k, v in cells.items() if k not in info},
                       "info": info}, sort_keys=True)


class Hub:
    def __init__(self, admin: AsyncAdmin, queues: Callable[[str | None], Any], interval_s: float,
                 tasks: dict[str, BulkTask]) -> None:
        self.admin = admin
        self.queues = queues  # async (after) -> (names, next cursor, total): an overview page
        self.interval_s = interval_s
        self.tasks = tasks
        self.subs: dict[str, set[asyncio.Queue[str]]] = {}
        self.last: dict[str, str] = {}
        self.samples: dict[str, deque[tuple[float, int, int]]] = {}
        self.polls = 0
        self._task: asyncio.Task[None] | None = None

    # ------------------------------------------------------------- rates

    def record(self, s: QueueStats) -> None:
        d = self.samples.setdefault(s.queue, deque(maxlen=600))
        d.append((time.monotonic(), s.counters.get("completed", 0), s.counters.get("failed", 0)))

    def rate(self, queue: str) -> tuple[float, float] | None:
        """Completed and failed per minute over the last minute of samples (needs 5 s)."""
        d = self.samples.get(queue)
        if not d:
            return None
        t1, c1, f1 = d[-1]
        old = [x for x in d if t1 - x[0] <= 60.0]
        t0, c0, f0 = old[0]
        if t1 - t0 < 5.0:
            return None
        return ((c1 - c0) * 60 / (t1 - t0), (f1 - f0) * 60 / (t1 - t0))

    async def rates(self, queues: list[str]) -> dict[str, tuple[float, float] | None]:
        """Per minute over the last 60 s: from the workers' time series, else (no worker
        writes it) what this process sampled from the lifetime counters."""
        got = await gather_bounded(self.admin.per_minute(q) for q in queues)
        return {q: (float(g[0]), float(g[1])) if isinstance(g, tuple) else self.rate(q)
                for q, g in zip(queues, got, strict=True)}

    # ------------------------------------------------------------- subscriptions

    @contextlib.asynccontextmanager
    async def subscribe(self, topic: str) -> AsyncIterator[asyncio.Queue[str]]:
        if topic not in self.subs and len(self.subs) >= MAX_TOPICS:
            raise OverflowError("too many live topics")
        q: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self.subs.setdefault(topic, set()).add(q)
        if topic in self.last:
            q.put_nowait(self.last[topic])
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run())
        try:
            yield q
        finally:
            subs = self.subs.get(topic)
            if subs is not None:
                subs.discard(q)
                if not subs:
                    del self.subs[topic]
                    self.last.pop(topic, None)

    async def _run(self) -> None:
        while self.subs:
            try:
                await self.poll_once()
            except Exception as exc:  # noqa: BLE001 - Redis down, a bad topic: log, go on
                log.warning("dashboard poll failed: %s", exc)
            await asyncio.sleep(self.interval_s)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    # ------------------------------------------------------------- one round

    async def poll_once(self) -> None:
        topics = list(self.subs)
        self.polls += 1
        names: set[str] = set()
        for t in topics:
            if t == "overview" or t.startswith("overview "):
                names.update((await self.queues(t.partition(" ")[2] or None))[0])
        names.update(t.split(" ")[1] for t in topics if t.startswith("queue "))
        names.update(t.split(" ")[1] for t in topics if t.startswith("job "))
        ordered = sorted(names)
        got = await gather_bounded(self.admin.stats(n) for n in ordered)
        stats: dict[str, QueueStats] = {}
        for n, s in zip(ordered, got, strict=True):
            if isinstance(s, QueueStats):
                stats[n] = s
                self.record(s)
        rates = await self.rates(list(stats))
        cells_by_queue = {n: stats_cells(s, rates[n]) for n, s in stats.items()}
        jobs = [t for t in topics if t.startswith("job ")]
        states = await gather_bounded(self._job_cells(t) for t in jobs)
        for topic in topics:
            cells: dict[str, str] = {}
            if topic == "overview" or topic.startswith("overview "):
                shown = (await self.queues(topic.partition(" ")[2] or None))[0]
                for name in shown:
                    cells.update(cells_by_queue.get(name, {}))
            elif topic.startswith("queue "):
                cells = cells_by_queue.get(topic.split(" ")[1], {})
            elif topic.startswith("job "):
                st = states[jobs.index(topic)]
                cells = st if isinstance(st, dict) else {}
                cells.update(cells_by_queue.get(topic.split(" ")[1], {}))
            elif topic.startswith("task "):
                task = self.tasks.get(topic.split(" ")[1])
                if task is not None:
                    cells = {"task:done": f"{task.done:,}", "task:total": f"{task.total:,}",
                             "task:state": task.state,
                             "task:outcome": ", ".join(f"{k}: {v:,}" for k, v in
                                                       sorted(task.outcome.items()))}
            self.publish(topic, message(cells))

    async def _job_cells(self, topic: str) -> dict[str, str]:
        _, queue, job_id = topic.split(" ")
        info = await self.admin.job(queue, job_id)
        progress = "" if info.progress is None else json.dumps(info.progress)[:200]
        return {"job:state": info.state, "job:attempts": str(info.attempts),
                "job:owner": info.owner or "-", "job:progress": progress,
                "job:logs": str(len(info.logs))}

    def publish(self, topic: str, data: str) -> None:
        if self.last.get(topic) == data:
            return
        self.last[topic] = data
        for q in self.subs.get(topic, ()):
            if q.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    q.get_nowait()
            q.put_nowait(data)
