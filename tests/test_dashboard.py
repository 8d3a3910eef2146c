"""The dashboard over HTTP, the ASGI app in-process against a real redis-server: every page and
every action, read-only mode, CSRF, authorize, bad input, hostile data, paging, live updates."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio as aredis
from dashboard_support import csrf_of, fill, serve
from helpers import eventually
from starlette.requests import Request

from streamq import Keys, Queue
from streamq._core.server import free_port
from streamq._core.timeseries import SeriesRecorder
from streamq.dashboard import DashboardConfig, create_app

pytestmark = pytest.mark.timeout(120)


def client(url: str, qname: str, **kwargs: Any) -> httpx.AsyncClient:
    kwargs.setdefault("config", DashboardConfig(queues=(qname,), poll_interval_s=0.1))
    app = create_app(url, **kwargs)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://dash")


@pytest.fixture
async def filled(url: str, qname: str) -> Queue:
    return await fill(url, qname)


@pytest.fixture
async def c(url: str, qname: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client(url, qname) as cl:
        yield cl


def audits(r: redis.Redis, q: Queue) -> list[str]:
    events: Any = r.xrange(q.keys.events)
    return [f[b"d"].decode() for _, f in events if f[b"ev"] == b"admin"]


async def post(c: httpx.AsyncClient, action: str, page: str, **fields: str) -> httpx.Response:
    token = csrf_of((await c.get(page)).text)
    return await c.post(f"/action/{action}", data={"csrf": token, **fields})


async def test_every_page_renders(filled: Queue, c: httpx.AsyncClient, qname: str) -> None:
    home = await c.get("/")
    assert home.status_code == 200 and qname in home.text
    csp = home.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "unsafe-inline" not in csp
    assert home.headers["x-frame-options"] == "DENY"
    cookie = home.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    expect = {"ready": "r0", "scheduled": "s0", "dead": "b1", "completed": "c2",
              "active": "Nothing here", "retrying": "Nothing here", "cancelled": "Nothing here",
              "workers": ":", "cron": "Nothing here"}
    for tab, needle in expect.items():
        page = await c.get("/queue", params={"q": qname, "tab": tab})
        assert page.status_code == 200, (tab, page.text)
        assert needle in page.text, tab
    for job_id, state in [("c0", "completed"), ("b0", "failed"), ("s0", "scheduled"),
                          ("r0", "queued"), ("x0", "failed")]:
        page = await c.get("/job", params={"q": qname, "id": job_id})
        assert page.status_code == 200 and f">{state}</span>" in page.text, job_id
    x0 = (await c.get("/job", params={"q": qname, "id": "x0"})).text
    assert "ValueError" in x0 and "Failed attempts" in x0 and "Timeline" in x0
    assert "&lt;script&gt;alert(&#39;tb&#39;)&lt;/script&gt;" in x0
    assert "<script>alert" not in x0
    s0 = (await c.get("/job", params={"q": qname, "id": "s0"})).text
    assert "tenant" in s0 and "&lt;acme&gt;" in s0
    c0 = (await c.get("/job", params={"q": qname, "id": "c0"})).text
    assert "Result" in c0 and "&#34;echo&#34;" in c0
    found = await c.get("/find", params={"q": qname, "id": "b2"})
    assert found.status_code == 303 and found.headers["location"].endswith("id=b2")
    conf = await c.get("/confirm", params={"q": qname, "action": "redrive-all", "type": "bad"})
    assert conf.status_code == 200 and "3 dead jobs match" in " ".join(conf.text.split())
    for path in ("/static/htmx.min.js", "/static/dashboard.js", "/static/dashboard.css"):
        assert (await c.get(path)).status_code == 200


async def test_actions_change_state_and_are_audited(filled: Queue, c: httpx.AsyncClient,
                                                    qname: str, r: redis.Redis) -> None:
    page = f"/queue?q={qname}"
    resp = await post(c, "pause", page, q=qname)
    assert resp.status_code == 200 and "paused" in resp.text
    assert "PAUSED" in (await c.get(page)).text
    assert (await post(c, "resume", page, q=qname)).status_code == 200
    assert "PAUSED" not in (await c.get(page)).text
    resp = await post(c, "run-now", page, q=qname, id="s0")
    assert "due now" in resp.text and r.zscore(filled.keys.delayed, "s0") == 0
    resp = await post(c, "cancel", page, q=qname, id="s1")
    assert "cancelled" in resp.text and filled.get("s1").state == "cancelled"  # type: ignore
    resp = await post(c, "requeue", page, q=qname, id="r0")
    assert "requeued" in resp.text
    resp = await post(c, "redrive", page, q=qname, id="b0")
    assert "redriven: 1" in resp.text and filled.get("b0").state == "queued"  # type: ignore
    resp = await post(c, "redrive", page, q=qname, id="b0")
    assert "not re-driven" in resp.text
    # htmx gets a fragment and an event that refreshes the live regions
    token = csrf_of((await c.get(page)).text)
    frag = await c.post("/action/pause", data={"csrf": token, "q": qname},
                        headers={"HX-Request": "true"})
    assert frag.headers["hx-trigger"] == "sq:changed" and "<html" not in frag.text
    # re-drive all matching: counted first, then a task in batches
    resp = await post(c, "redrive-all", page, q=qname, type="bad", count="2")
    assert resp.status_code == 303
    task_url = resp.headers["location"]
    await eventually(lambda: _task_done(c, task_url), what="bulk re-drive")
    assert filled.get("b1").state == "queued" and filled.get("b2").state == "queued"  # type: ignore
    assert (await post(c, "purge-dead", page, q=qname)).status_code == 200
    assert r.xlen(filled.keys.dead) == 0
    log = audits(r, filled)
    who = "dashboard@127.0.0.1"
    for expected in (f"pause by {who}: paused", f"resume by {who}: resumed",
                     f"run-now by {who}: due now", f"cancel by {who}: cancelled",
                     f"requeue by {who}: requeued", f"redrive by {who}: redriven: 1",
                     f"redrive-all by {who}: done: redriven 2", f"purge-dead by {who}: purged 1"):
        assert expected in log, (expected, log)


async def _task_done(c: httpx.AsyncClient, url: str) -> bool:
    text = (await c.get(url)).text
    return ">done</span>" in text


async def test_read_only_hides_and_refuses(filled: Queue, url: str, qname: str) -> None:
    async with client(url, qname, read_only=True) as c:
        for path in ("/", f"/queue?q={qname}&tab=dead", f"/job?q={qname}&id=b0",
                     f"/queue?q={qname}&tab=scheduled"):
            page = await c.get(path)
            assert page.status_code == 200 and "/action/" not in page.text, path
            assert "read-only" in page.text
        assert 'name="csrf"' not in (await c.get(f"/queue?q={qname}&tab=dead")).text
        resp = await c.post("/action/pause", data={"q": qname})
        assert resp.status_code == 403 and "read-only" in resp.text
        assert (await c.get(f"/confirm?q={qname}&action=purge-dead")).status_code == 403
    assert filled.get("b0").state == "failed"  # type: ignore[union-attr]


async def test_csrf_missing_or_wrong_is_refused(filled: Queue, c: httpx.AsyncClient, url: str,
                                                qname: str, r: redis.Redis) -> None:
    await c.get("/")  # the cookie
    for data in ({"q": qname}, {"q": qname, "csrf": "0" * 64}, {"q": qname, "csrf": "x"}):
        resp = await c.post("/action/pause", data=data)
        assert resp.status_code == 403 and "CSRF" in resp.text
    # a token from another browser (another cookie) does not fit this one
    async with client(url, qname) as other:
        foreign = csrf_of((await other.get("/")).text)
    resp = await c.post("/action/pause", data={"q": qname, "csrf": foreign})
    assert resp.status_code == 403
    c.cookies.clear()
    good = csrf_of((await c.get("/")).text)
    c.cookies.clear()
    assert (await c.post("/action/pause", data={"q": qname, "csrf": good})).status_code == 403
    assert not r.exists(filled.keys.paused) and audits(r, filled) == []
    assert (await c.get("/action/pause")).status_code == 405  # actions are POST only


async def test_authorize_can_deny_views_and_actions(filled: Queue, url: str, qname: str,
                                                    r: redis.Redis) -> None:
    calls: list[tuple[str, str | None]] = []

    async def authorize(request: Request, action: str, queue: str | None) -> bool:
        calls.append((action, queue))
        if request.headers.get("x-user") == "ops":
            return True
        return action == "view" and not (queue or "").startswith("secret")

    hidden = f"secret-{qname}"
    Queue.from_url(url, hidden).enqueue("t")
    async with client(url, qname, authorize=authorize,
                      config=DashboardConfig(queues=(qname, hidden))) as c:
        home = await c.get("/")
        assert qname in home.text and hidden not in home.text
        assert (await c.get(f"/find?q={hidden}&id=x")).status_code == 403
        page = await c.get(f"/queue?q={qname}&tab=dead")
        assert page.status_code == 200 and "/action/" not in page.text  # read-only for them
        assert (await c.get("/queue?q=secret")).status_code == 403
        ops = await c.get(f"/queue?q={qname}&tab=dead", headers={"x-user": "ops"})
        assert "/action/redrive" in ops.text
        token = csrf_of(ops.text)  # the same browser: a valid token, and still not allowed
        resp = await c.post("/action/pause", data={"q": qname, "csrf": token})
        assert resp.status_code == 403 and "not allowed" in resp.text
        resp = await c.post("/action/pause", data={"q": qname, "csrf": token},
                            headers={"x-user": "ops"})
        assert resp.status_code == 200 and r.exists(filled.keys.paused)
    assert ("pause", qname) in calls and ("view", "secret") in calls
    # the live overview is one stream for everyone: each tab gets only the queues it may view
    app = create_app(url, authorize=authorize,
                     config=DashboardConfig(queues=(qname, hidden), poll_interval_s=0.1))
    with serve(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as h, \
                h.stream("GET", "/live", params={"topic": "overview"}) as s:
            frame = await _next_data(s.aiter_lines())
    keys = [*frame["cells"], *frame["info"]]
    assert f"{qname}:dead" in frame["cells"] and not any(k.startswith(hidden) for k in keys)


async def test_bad_params_and_unknown_ids_get_4xx_pages(filled: Queue, c: httpx.AsyncClient,
                                                        qname: str) -> None:
    cases = {
        "/queue": 400, f"/queue?q={qname}&tab=nope": 400, f"/queue?q={qname}&cursor=abc": 400,
        f"/queue?q={qname}&tab=scheduled&cursor=1:x": 400,
        f"/queue?q={qname}&tab=dead&cursor=1-2-3": 400, "/queue?q=bad%20name": 400,
        "/queue?q=%ff%fe": 400, f"/job?q={qname}&id=%3Cscript%3E": 400,
        f"/job?q={qname}&id=" + "a" * 300: 400, f"/queue?q={qname}&newer=soon": 400,
        f"/queue?q={qname}&error=X": 400, f"/confirm?q={qname}&action=drop": 400,
        "/queue?q=no-such-queue": 404, f"/job?q={qname}&id=no-such-job": 404,
        f"/find?q={qname}&id=missing": 404, "/task?id=nope": 404, "/nope": 404,
        "/live?topic=bogus": 400, "/live?topic=job%20a": 400,
    }
    for path, code in cases.items():
        resp = await c.get(path)
        assert resp.status_code == code, (path, resp.status_code, resp.text[:300])
        assert "Traceback" not in resp.text and "<title>" in resp.text
    token = csrf_of((await c.get("/")).text)
    for data in ({"q": qname, "csrf": token, "id": "../../x y"},
                 {"q": "{evil}", "csrf": token, "id": "a"},
                 {"q": qname, "csrf": token}):
        resp = await c.post("/action/cancel", data=data)
        assert resp.status_code == 400, resp.text
    resp = await c.post("/action/cancel", data={"q": qname, "csrf": token, "id": "nope"})
    assert resp.status_code == 200 and "not cancelled" in resp.text
    resp = await c.post("/action/redrive", data={"q": qname, "csrf": token, "id": "nope"})
    assert resp.status_code == 404
    for dead_id in ("9" * 40 + "-0", "x-1", "0-0"):
        resp = await c.post("/action/redrive", data={"q": qname, "csrf": token, "id": "b1",
                                                     "dead_id": dead_id})
        assert resp.status_code in (200, 400), (dead_id, resp.text)
        assert "redriven: 1" not in resp.text
    resp = await c.post("/action/redrive-all", data={"q": qname, "csrf": token, "count": "-1"})
    assert resp.status_code == 400


async def test_hostile_and_huge_data_is_escaped(url: str, qname: str, c: httpx.AsyncClient,
                                                r: redis.Redis) -> None:
    q = Queue.from_url(url, qname)
    evil = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    q.enqueue("t", {"html": evil, "big": "x" * 200_000}, job_id="evil",
              headers={"h": evil})
    r.hset(q.keys.job("evil"), mapping={"owner": evil.encode(), "reason": b"\xff\xfe" + b"<i>"})
    r.hset(q.keys.job("bytes"), mapping={"type": b"\xff\xfe<script>", "state": b"failed",
                                         "env": b"\xff\x00not json", "error": b"\x80<script>"})
    r.xadd(q.keys.dead, {"job": "bytes", "reason": "\xff<script>x".encode(errors="replace"),
                         "etype": "<svg onload=1>", "type": "t", "t": 0})
    r.xadd(q.keys.events, {"job": "evil", "ev": "<script>", "d": b"\xff"})
    r.hset(q.keys.job("evil"), mapping={
        "progress": json.dumps({"step": evil}),
        "logs": json.dumps([{"n": 1, "t": "soon<script>", "m": evil}, {"n": 2, "t": 0}]),
        "errors": json.dumps([{"attempt": "<b>", "type": evil, "t": "x"}])})
    for path in (f"/job?q={qname}&id=evil", f"/job?q={qname}&id=bytes", "/",
                 f"/queue?q={qname}&tab=dead", f"/queue?q={qname}"):
        page = await c.get(path)
        assert page.status_code == 200, (path, page.text[:500])
        assert "<script>alert" not in page.text and "<img src=x" not in page.text
        assert "<svg" not in page.text and "<script>x" not in page.text
    big = (await c.get(f"/job?q={qname}&id=evil")).text
    assert "more characters not shown" in big and len(big) < 120_000
    assert "could not be decoded" in (await c.get(f"/job?q={qname}&id=bytes")).text


async def test_the_overview_pages_through_many_queues(url: str, qname: str,
                                                      c: httpx.AsyncClient) -> None:
    client = redis.Redis.from_url(url, protocol=2)
    mine = [f"{qname}-p{i:03d}" for i in range(120)]
    for name in mine:
        Queue(client, name).enqueue("t")
    seen: list[str] = []
    path: str | None = "/"
    first = True
    while path:
        page = (await c.get(path)).text
        names = re.findall(r'<th scope="row"><a href="/queue\?q=([^"]+)">', page)
        assert len(names) <= 101
        if first:
            assert names[0] == qname  # configured queues come first
            total = int(re.search(r'<span class="muted">([\d,]+)</span>', page)
                        .group(1).replace(",", ""))  # type: ignore[union-attr]
            assert total >= 121
            first = False
        seen += names
        m = re.search(r'href="(\?after=[^"]+)" rel="next"', page)
        path = f"/{m.group(1)}" if m else None
    assert set(mine) <= set(seen) and len(seen) == len(set(seen))
    client.close()


async def test_paging_through_and_past_the_end(url: str, qname: str,
                                               c: httpx.AsyncClient) -> None:
    q = Queue.from_url(url, qname)
    q.enqueue_many([{"type": "t", "job_id": f"j{i:03d}"} for i in range(120)])
    seen: list[str] = []
    path: str | None = f"/queue?q={qname}&tab=ready"
    while path:
        page = (await c.get(path)).text
        seen += re.findall(r"id=(j\d{3})\">", page)
        m = re.search(r'href="(\?[^"]+)" rel="next"', page)
        path = f"/queue{m.group(1).replace('&amp;', '&')}" if m else None
    assert seen == [f"j{i:03d}" for i in range(120)]
    past = await c.get(f"/queue?q={qname}&tab=ready&cursor=99999999999999-0")
    assert past.status_code == 200 and "No more entries" in past.text
    past = await c.get(f"/queue?q={qname}&tab=completed&cursor=1-0")
    assert past.status_code == 200
    only = await c.get(f"/queue?q={qname}&tab=ready&type=none")
    assert "Nothing here" in only.text


@pytest.mark.slow
async def test_a_queue_with_100k_dead_letters(url: str, qname: str, c: httpx.AsyncClient,
                                              r: redis.Redis) -> None:
    q = Queue.from_url(url, qname)
    q.enqueue("t", job_id="seed")
    pipe = r.pipeline(transaction=False)
    for i in range(100_000):
        pipe.xadd(q.keys.dead, {"job": f"d{i}", "reason": "attempts exhausted",
                                "etype": "TimeoutError" if i % 10 else "Fail", "type": "t",
                                "t": 0})
        if i % 5000 == 4999:
            pipe.execute()
    pipe.execute()
    assert r.xlen(q.keys.dead) == 100_000
    for path in (f"/queue?q={qname}&tab=dead", f"/queue?q={qname}&tab=dead&error=Fail",
                 "/", f"/confirm?q={qname}&action=purge-dead",
                 f"/confirm?q={qname}&action=redrive-all&error=Fail"):
        page = await c.get(path)
        assert page.status_code == 200, path
    assert "100,000" in (await c.get("/")).text
    conf = " ".join((await c.get(f"/confirm?q={qname}&action=redrive-all&error=Fail")).text
                    .split())
    assert "10,000 dead jobs match" in conf


async def test_live_updates_share_one_poller(filled: Queue, url: str, qname: str) -> None:
    app = create_app(url, config=DashboardConfig(queues=(qname,), poll_interval_s=0.1))
    hub = app.state.dashboard.hub
    with serve(app) as base:
        async with httpx.AsyncClient(base_url=base, timeout=10) as h:
            topic = {"topic": f"job {qname} b0"}
            async with h.stream("GET", "/live", params=topic) as s1, \
                    h.stream("GET", "/live", params=topic) as s2:
                assert s1.headers["content-type"].startswith("text/event-stream")
                lines1, lines2 = s1.aiter_lines(), s2.aiter_lines()
                first = await _next_data(lines1)
                assert first["cells"]["job:state"] == "failed"
                assert first["cells"][f"{qname}:dead"] == "4"
                await _next_data(lines2)
                polls = hub.polls
                await asyncio.sleep(1.0)
                assert hub.polls - polls <= 12  # one poller for both tabs, ~10 rounds a second
                assert list(hub.subs) == [f"job {qname} b0"]
                token = csrf_of((await h.get("/")).text)  # a change shows up without reload
                await h.post("/action/redrive", data={"q": qname, "id": "b0", "csrf": token})
                for _ in range(50):
                    later = await asyncio.wait_for(_next_data(lines1), 5)
                    if later["cells"]["job:state"] == "queued":
                        break
                assert later["cells"]["job:state"] == "queued"
    await eventually(lambda: not hub.subs, what="unsubscribed")


async def _next_data(lines: Any) -> dict[str, Any]:
    async for line in lines:
        if line.startswith("data: "):
            data: dict[str, Any] = json.loads(line[6:])
            return data
    raise AssertionError("stream ended")


async def test_charts_from_the_workers_time_series(filled: Queue, c: httpx.AsyncClient,
                                                   url: str, qname: str,
                                                   r: redis.Redis) -> None:
    # what the fixture's worker recorded is dropped first: it may have spanned two minute
    # buckets (a line already), which made this check fail at a minute boundary
    r.delete(Keys(qname).series_minutes, Keys(qname).series_hours)
    empty = await c.get(f"/queue?q={qname}&tab=charts")
    assert empty.status_code == 200 and empty.text.count("<svg") == 4  # (drawn at zero)
    rec = SeriesRecorder()
    for i in range(20):
        rec.observe(qname, completed=i % 4 != 0, wait_ms=i, run_ms=10 * i)
    client = aredis.Redis.from_url(url)
    try:
        await rec.flush(client, Keys)
    finally:
        await client.aclose()
    # (the overview's done/min: tests/test_dashboard_truth.py)
    for rng in ("", "&range=30d"):
        page = await c.get(f"/queue?q={qname}&tab=charts{rng}")
        assert page.status_code == 200
        assert page.text.count("<svg") == 4 and "Throughput per" in page.text
        assert "<circle" in page.text or "<polyline" in page.text


async def test_mounts_under_a_prefix_in_fastapi(filled: Queue, url: str, qname: str) -> None:
    from fastapi import FastAPI

    api = FastAPI()
    api.mount("/ops/queues", create_app(url, config=DashboardConfig(queues=(qname,))))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=api),
                                 base_url="http://api") as c:
        home = await c.get("/ops/queues/")
        assert home.status_code == 200
        assert f'href="/ops/queues/queue?q={qname}"' in home.text
        assert 'src="/ops/queues/static/htmx.min.js' in home.text
        assert (await c.get("/ops/queues/static/dashboard.css")).status_code == 200
        assert "Path=/ops/queues" in home.headers["set-cookie"]
        page = await c.get(f"/ops/queues/queue?q={qname}&tab=dead")
        token = csrf_of(page.text)
        assert 'action="/ops/queues/action/redrive"' in page.text
        resp = await c.post("/ops/queues/action/pause", data={"q": qname, "csrf": token})
        assert resp.status_code == 200


def test_streamq_dashboard_command_serves_on_loopback(url: str, qname: str) -> None:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "streamq", "dashboard", "--url", url,
                             "--port", str(port), "--queue", qname, "--read-only"],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert f"http://127.0.0.1:{port}/" in line
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=5) as h:
            resp = None
            for _ in range(100):
                try:
                    resp = h.get("/")
                    break
                except httpx.ConnectError:
                    time.sleep(0.1)
            assert resp is not None and resp.status_code == 200 and "read-only" in resp.text
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture
def sentinel_port(redis_server: Any, tmp_path: Any) -> Iterator[int]:
    """A Sentinel (the same server binary, in sentinel mode) watching the test server."""
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    conf.write_text(f"port {port}\nbind 127.0.0.1\ndir {tmp_path}\n"
                    f"sentinel monitor main 127.0.0.1 {redis_server.port} 1\n")
    binary = os.environ.get("STREAMQ_REDIS_SERVER", "redis-server")
    proc = subprocess.Popen([binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        yield port
    finally:
        proc.terminate()
        proc.wait(10)


async def test_through_sentinel(url: str, qname: str, sentinel_port: int) -> None:
    """Any client the admin API takes works: here the master a Sentinel names."""
    from redis.asyncio.sentinel import Sentinel

    from streamq.admin import AsyncAdmin

    sentinel = Sentinel([("127.0.0.1", sentinel_port)], socket_timeout=2)  # type: ignore[no-untyped-call]
    for _ in range(100):
        try:
            await sentinel.discover_master("main")
            break
        except Exception:  # noqa: BLE001 - not up yet
            await asyncio.sleep(0.1)
    master = sentinel.master_for("main", protocol=2, decode_responses=False)
    Queue.from_url(url, qname).enqueue("t", job_id="via-sentinel")
    app = create_app(admin=AsyncAdmin(master), config=DashboardConfig(queues=(qname,)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as c:
        assert qname in (await c.get("/")).text
        page = await c.get(f"/job?q={qname}&id=via-sentinel")
        assert page.status_code == 200 and ">queued</span>" in page.text
        resp = await c.post("/action/cancel", data={"q": qname, "id": "via-sentinel",
                                                    "csrf": csrf_of(page.text)})
        assert "cancelled" in resp.text
    await master.aclose()


async def test_on_a_redis_cluster(qname: str, tmp_path: Any) -> None:
    """cluster=True: each queue's reads and actions go to the node holding its slot."""
    from helpers import wait_until

    from streamq._core.server import RedisServer

    server = RedisServer(directory=str(tmp_path), extra=(
        "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf")).start()
    try:
        plain: Any = redis.Redis(port=server.port)
        plain.execute_command("CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        wait_until(lambda: b"cluster_state:ok" in plain.execute_command("CLUSTER", "INFO"),
                   what="the one-node cluster")
        q = Queue.from_url(server.url, qname)
        q.enqueue("t", job_id="on-cluster", delay=600)
        app = create_app(server.url, cluster=True, config=DashboardConfig(queues=(qname,)))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://dash") as c:
            assert qname in (await c.get("/")).text
            for tab in ("scheduled", "dead", "completed", "workers", "charts"):
                assert (await c.get(f"/queue?q={qname}&tab={tab}")).status_code == 200, tab
            page = await c.get(f"/job?q={qname}&id=on-cluster")
            assert page.status_code == 200 and ">scheduled</span>" in page.text
            resp = await c.post("/action/run-now", data={"q": qname, "id": "on-cluster",
                                                         "csrf": csrf_of(page.text)})
            assert "due now" in resp.text
            resp = await c.post("/action/pause", data={"q": qname, "csrf": csrf_of(page.text)})
            assert resp.status_code == 200 and plain.exists(q.keys.paused)
        await app.state.dashboard.aclose()
        plain.close()
    finally:
        server.close()
