"""The dashboard's first look tells the truth (#31): recent completions listed with the default
event kinds, done/min as a rolling 60-second rate, chart windows from 15 minutes with idle
buckets drawn as zero and readable axis labels, live workers by default, confirmation on
destructive row actions, attempts as numbers."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import redis
from dashboard_support import fill
from helpers import eventually, fast, started

from streamq import Keys, Queue, QueueConfig, Registry, Worker
from streamq._core.keys import GROUP, RECENT_KEEP
from streamq._core.scripts import SCRIPTS
from streamq.dashboard import DashboardConfig, create_app

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def c(url: str, qname: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(url, config=DashboardConfig(queues=(qname,), poll_interval_s=0.1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as cl:
        yield cl


def _finish_ok(r: redis.Redis, q: Queue, job_id: str, entry: str, token: str,
               recent: bool = True) -> list[bytes]:
    """finish.lua as today's worker calls it: group keys, marker and the recent list."""
    k = q.keys
    keys = [k.stream, k.delayed, k.dead, k.stats, k.events, k.job(job_id), *k.group_keys,
            k.finished("c1")] + ([k.recent] if recent else [])
    args: list[Any] = [GROUP, "0", 3600, 1000, "", 1, job_id, entry, token, "ok", b"42", 0, "",
                       QueueConfig().group_arg] + ([RECENT_KEEP] if recent else [])
    out: list[bytes] = SCRIPTS["finish"](r, keys, args)
    return out


def test_finish_notes_recent_completions_once_and_bounded(r: redis.Redis, url: str,
                                                          qname: str) -> None:
    q = Queue.from_url(url, qname)
    r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    entry, token = started(r, q, "j1")
    assert _finish_ok(r, q, "j1", entry, token) == [b"completed"]
    assert _finish_ok(r, q, "j1", entry, token) == [b"completed"]  # a repeat: reply lost
    items: Any = r.lrange(q.keys.recent, 0, -1)
    (item,) = items  # noted once
    at, _, jid = item.decode().partition(" ")
    assert jid == "j1" and at.isdigit()
    entry, token = started(r, q, "j2")  # an older worker (no list key): nothing noted
    assert _finish_ok(r, q, "j2", entry, token, recent=False) == [b"completed"]
    assert r.llen(q.keys.recent) == 1


async def test_completed_tab_lists_recent_completions_by_default(
        c: httpx.AsyncClient, url: str, qname: str, r: redis.Redis) -> None:
    q = Queue.from_url(url, qname)  # the default event kinds: no 'completed' events
    q.enqueue_many([{"type": "ok", "job_id": f"d{i}"} for i in range(150)])
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Any) -> int:
        return 1

    async with Worker(url, [qname], reg, fast()) as w:
        await eventually(lambda: w.stats.completed == 150, what="completed", timeout_s=30)
    assert 0 < r.llen(q.keys.recent) <= RECENT_KEEP
    page = (await c.get("/queue", params={"q": qname, "tab": "completed"})).text
    head: Any = r.lindex(q.keys.recent, 0)
    newest = head.decode().partition(" ")[2]
    assert f"id={newest}" in page and "Nothing here" not in page
    assert "event_kinds=ALL_EVENTS" in page  # how to keep the full history


async def test_done_per_minute_is_a_rolling_rate(c: httpx.AsyncClient, url: str, qname: str,
                                                 r: redis.Redis) -> None:
    Queue.from_url(url, qname).enqueue("ok", job_id="r0")  # the queue exists
    k = Keys(qname)
    minute = int(r.time()[0]) // 60
    # jobs completing now (this minute's bucket): non-zero at once
    r.hset(k.series_minutes, str(minute), json.dumps({"c": 90, "f": 3, "o": 0}))
    home = (await c.get("/")).text
    rate = re.search(rf'data-live="{re.escape(qname)}:completed_pm">([^<]*)<', home)
    assert rate and rate.group(1).isdigit() and int(rate.group(1)) > 0, rate and rate.group(1)
    # the worker stopped over a minute ago: 0, not the last minute it worked
    r.delete(k.series_minutes)
    r.hset(k.series_minutes, str(minute - 2), json.dumps({"c": 144721, "f": 0, "o": 0}))
    home = (await c.get("/")).text
    assert f'data-live="{qname}:completed_pm">0<' in home


def _throughput(page: str) -> list[tuple[float, float]]:
    m = re.search(r'<polyline class="s1" points="([^"]*)"', page)
    assert m, "no throughput line"
    return [(float(x), float(y)) for x, y in (p.split(",") for p in m.group(1).split())]


async def test_chart_windows_labels_and_idle_buckets(c: httpx.AsyncClient, url: str,
                                                     qname: str, r: redis.Redis) -> None:
    Queue.from_url(url, qname).enqueue("ok", job_id="r0")  # the queue exists
    k = Keys(qname)
    minute = int(r.time()[0]) // 60
    r.hset(k.series_minutes, mapping={
        str(minute - 5): json.dumps({"c": 144721, "f": 0, "o": 0}),
        str(minute - 2): json.dumps({"c": 50000, "f": 0, "o": 0})})
    page = (await c.get("/queue", params={"q": qname, "tab": "charts"})).text
    # a new queue fills the shortest window that holds its data: 15 minutes, per minute
    assert re.search(r'data-range="15m" aria-current', page)
    ys = [y for _, y in _throughput(page)]
    assert len(ys) == 15 and ys.count(max(ys)) == 13  # idle minutes drawn at zero, not bridged
    assert ">200k<" in page and ">100k<" in page and "e+" not in page
    for rng, buckets in (("15m", 15), ("1h", 60), ("6h", 360), ("1d", 24), ("7d", 168),
                         ("30d", 720)):
        got = await c.get("/queue", params={"q": qname, "tab": "charts", "range": rng})
        assert got.status_code == 200
        assert len(_throughput(got.text)) == buckets, rng
    bad = await c.get("/queue", params={"q": qname, "tab": "charts", "range": "2y"})
    assert bad.status_code == 400


async def test_workers_tab_shows_live_workers_dead_behind_a_toggle(
        c: httpx.AsyncClient, url: str, qname: str, r: redis.Redis) -> None:
    Queue.from_url(url, qname).enqueue("ok", job_id="r0")
    k = Keys(qname)
    r.xgroup_create(k.stream, GROUP, id="0")
    r.xgroup_createconsumer(k.stream, GROUP, "ghost-1")
    r.zadd(k.workers, {"ghost-1": 0})  # a heartbeat long ago, no worker info
    # a worker that beat 10 s ago and then froze: its info (3 heartbeats' TTL) expired
    r.xgroup_createconsumer(k.stream, GROUP, "frozen-1")
    now_ms = int(r.time()[0]) * 1000
    r.zadd(k.workers, {"frozen-1": now_ms - 10_000})
    page = (await c.get("/queue", params={"q": qname, "tab": "workers"})).text
    assert "ghost-1" not in page and "frozen-1" not in page and "No live worker" in page
    assert "show 2 dead consumers" in page
    everyone = (await c.get("/queue", params={"q": qname, "tab": "workers",
                                              "dead": "1"})).text
    assert "ghost-1" in everyone and "unknown" in everyone  # no blank host cell
    await fill(url, qname)  # a worker ran (its heartbeat is recent; it pruned the ghost)
    page = (await c.get("/queue", params={"q": qname, "tab": "workers"})).text
    assert "<td>yes</td>" in page and "No live worker" not in page


async def test_destructive_row_actions_ask_first(c: httpx.AsyncClient, url: str,
                                                 qname: str) -> None:
    await fill(url, qname)
    ready = (await c.get("/queue", params={"q": qname, "tab": "ready"})).text
    assert 'hx-confirm="Cancel job r0? It will not run."' in ready
    scheduled = (await c.get("/queue", params={"q": qname, "tab": "scheduled"})).text
    assert scheduled.count("hx-confirm=") == scheduled.count('data-action="cancel"') > 0
    job = (await c.get("/job", params={"q": qname, "id": "r0"})).text
    assert 'hx-confirm="Cancel job r0?' in job


async def test_attempts_are_numbers(c: httpx.AsyncClient, url: str, qname: str) -> None:
    await fill(url, qname)
    x0 = (await c.get("/job", params={"q": qname, "id": "x0"})).text
    assert '<span data-live="job:attempts">2</span>' in x0
    r0 = (await c.get("/job", params={"q": qname, "id": "r0"})).text
    assert "the handler&#39;s default" not in r0
