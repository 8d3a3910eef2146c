"""The dashboard's view of workflows (docs/dashboard.md#flows), over HTTP against a real
redis-server: a chain as a tree, a fan-in page by page, a batch's progress, a waiting job's
"blocked by", the job page's links to parents, children and flow, and ids that need escaping."""

from __future__ import annotations

import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from helpers import eventually, running, state

import streamq
from streamq import JobRef, JobSpec, Queue, Registry
from streamq.dashboard import DashboardConfig, create_app

pytestmark = pytest.mark.timeout(120)


def _reg() -> Registry:
    reg = Registry()

    @reg.handler("ok")
    def ok(job: streamq.Job) -> Any:
        return job.payload

    @reg.handler("bad")
    def bad(job: streamq.Job) -> Any:
        raise ValueError("no <b>good</b>")

    return reg


@pytest.fixture
async def c(url: str, qname: str) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(url, config=DashboardConfig(queues=(qname,), page_size=100))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as cl:
        yield cl


async def test_chain_as_a_tree_with_blocked_by_and_job_links(
        c: httpx.AsyncClient, q: Queue, qname: str) -> None:
    q.enqueue_flow(streamq.chain(JobSpec("ok", 1, job_id="render"),
                                 JobSpec("ok", 2, job_id="upload"),
                                 JobSpec("ok", 3, job_id="notify")))
    page = await c.get("/flow", params={"q": qname, "id": "notify"})
    assert page.status_code == 200, page.text
    html = page.text
    assert ">waiting</span>" in html
    # the tree: notify waits for upload (waiting), which waits for render (queued)
    assert re.findall(r'data-job="([^"]+)"', html.split('id="deps"')[1]) == ["upload", "render"]
    assert re.search(r'<p id="blocked-by">1 pending:\s*<a href="/job\?q='
                     + re.escape(qname) + r'&amp;id=upload">upload</a>', html)
    assert "No job waits for it." in html
    # from the middle: its parent above, its child below
    mid = (await c.get("/flow", params={"q": qname, "id": "upload"})).text
    assert re.findall(r'data-job="([^"]+)"', mid.split('class="tree parents"')[1]
                      .split("</ul>")[0]) == ["notify"]
    # the job page links the job to its dependencies, its dependents and its flow
    job = (await c.get("/job", params={"q": qname, "id": "upload"})).text
    children = job.split('id="flow-children"')[1].split("</table>")[0]
    parents = job.split('id="flow-parents"')[1].split("</table>")[0]
    assert f'href="/job?q={qname}&amp;id=render"' in children and "pending: blocking" in children
    assert f'href="/job?q={qname}&amp;id=notify"' in parents
    assert f'href="/flow?q={qname}&amp;id=upload" id="flow-link">flow view</a>' in job
    # a job outside any flow has no flow section; `waiting` shows in the overview and its tab
    q.enqueue("ok", 0, job_id="alone")
    assert 'id="flow-link"' not in (await c.get("/job", params={"q": qname, "id": "alone"})).text
    home = (await c.get("/")).text
    assert f'data-live="{qname}:waiting">2</td>' in home
    tab = (await c.get("/queue", params={"q": qname, "tab": "waiting"})).text
    assert ">upload</a>" in tab and ">notify</a>" in tab
    assert f'href="/flow?q={qname}&amp;id=upload">flow</a>' in tab


async def test_fan_in_is_paged_never_drawn_at_once(
        c: httpx.AsyncClient, q: Queue, qname: str) -> None:
    n = 260
    q.enqueue_many([{"type": "ok", "payload": i, "job_id": f"c{i}"} for i in range(n)])
    q.enqueue("ok", 0, job_id="fan", depends_on=[f"c{i}" for i in range(n)])
    seen: list[str] = []
    url: str | None = f"/flow?q={qname}&id=fan"
    pages = 0
    while url is not None:
        html = (await c.get(url)).text
        pages += 1
        got = re.findall(r'data-job="([^"]+)"', html.split('id="deps"')[1])
        assert 0 < len(got) <= 300  # page_size 100: SSCAN counts are hints, never 260 at once
        seen += got
        m = re.search(r'<a href="(\?[^"]+)" rel="next">next page</a>', html)
        url = "/flow" + m.group(1).replace("&amp;", "&") if m else None
    assert pages >= 2
    first = (await c.get("/flow", params={"q": qname, "id": "fan"})).text
    assert f'id="deps-total">{n}: {n} pending, 0 ended</span>' in first  # totals: SCARD, HLEN
    assert re.search(rf'id="blocked-by">{n} pending, \d+ of them on this page:', first)
    assert sorted(set(seen)) == sorted(f"c{i}" for i in range(n))
    # a leaf of it: its one parent, and the job page says more is in the flow view
    leaf = (await c.get("/job", params={"q": qname, "id": "c7"})).text
    assert f'href="/job?q={qname}&amp;id=fan"' in leaf.split('id="flow-parents"')[1]
    fan = (await c.get("/job", params={"q": qname, "id": "fan"})).text
    assert "More dependencies: see the flow view." in fan
    bad = await c.get("/flow", params={"q": qname, "id": "fan", "cursor": "zz:1"})
    assert bad.status_code == 400 and "invalid flow cursor" in bad.text


async def test_batch_progress_counts(c: httpx.AsyncClient, url: str, q: Queue,
                                     qname: str) -> None:
    b = q.batch(on_complete=JobSpec("ok"), on_death=JobSpec("ok"), batch_id="nightly")
    b.add([JobSpec("ok", i, job_id=f"t{i}") for i in range(3)]
          + [JobSpec("bad", 0, job_id="t-bad", max_attempts=1)])
    page = (await c.get("/flow", params={"q": qname, "id": "nightly"})).text
    counts = dict(re.findall(r'<dd data-count="(\w+)">([\d,]+)</dd>', page))
    assert counts == {"total": "4", "completed": "0", "dead": "0", "pending": "4"}
    assert 'id="batch-open">open<' in page
    async with running(url, qname, _reg()):
        await eventually(lambda: state(q, "t-bad") == "failed"
                         and all(state(q, f"t{i}") == "completed" for i in range(3)), 30)
        await eventually(lambda: state(q, "nightly.on_death") == "completed", 30)
    page = (await c.get("/flow", params={"q": qname, "id": "nightly"})).text
    counts = dict(re.findall(r'<dd data-count="(\w+)">([\d,]+)</dd>', page))
    assert counts == {"total": "4", "completed": "3", "dead": "1", "pending": "0"}
    assert 'id="batch-open">open<' in page
    cbs = page.split("<tbody>")[1].split("</tbody>")[0]
    assert "on_complete" in cbs and ">waiting</span>" in cbs and ">completed</span>" in cbs
    # a callback's own flow: blocked by the open batch itself
    cb = (await c.get("/flow", params={"q": qname, "id": "nightly.on_complete"})).text
    assert re.search(r'id="blocked-by">1 pending:\s*<a [^>]*>nightly</a>', cb)
    # a batch job's page links to its batch
    job = (await c.get("/job", params={"q": qname, "id": "t0"})).text
    assert 'id="batch-link">nightly</a>' in job and f'/flow?q={qname}&amp;id=nightly"' in job
    b.close()
    closed = (await c.get("/flow", params={"q": qname, "id": "nightly"})).text
    assert 'id="batch-open">closed<' in closed


async def test_ids_that_need_escaping(c: httpx.AsyncClient, url: str, q: Queue,
                                      qname: str) -> None:
    other = Queue.from_url(url, f"{qname}-o")
    try:
        weird = "img+1/a=b#c"
        other.enqueue("ok", 1, job_id=weird)
        q.enqueue("ok", 2, job_id="p:1", depends_on=[JobRef(other.name, weird, "continue")])
        html = (await c.get("/flow", params={"q": qname, "id": "p:1"})).text
        enc = "img%2B1/a%3Db%23c"  # (jinja keeps "/": legal in a query)
        assert f'href="/job?q={other.name}&amp;id={enc}">{weird}</a>' in html
        assert f'href="/flow?q={other.name}&amp;id={enc}">flow</a>' in html
        assert f'<span class="muted">{other.name}</span>' in html  # another queue: named
        child = (await c.get("/flow", params={"q": other.name, "id": weird})).text
        assert f'href="/flow?q={qname}&amp;id=p%3A1">flow</a>' in child
        for hostile in ("<script>alert(1)</script>", 'x" onmouseover="1'):
            r = await c.get("/flow", params={"q": qname, "id": hostile})
            assert r.status_code == 400 and "<script>alert" not in r.text
            assert 'x" onmouseover' not in r.text
        missing = await c.get("/flow", params={"q": qname, "id": "nope"})
        assert missing.status_code == 404
    finally:
        other.close()


async def test_edges_into_queues_the_viewer_may_not_see_name_no_job(url: str, q: Queue,
                                                                    qname: str) -> None:
    secret = Queue.from_url(url, f"{qname}-secret")
    try:
        secret.enqueue("ok", 1, job_id="payroll-7")
        q.enqueue("ok", 0, job_id="pub")
        secret.enqueue("ok", 2, job_id="payroll-8", depends_on=[JobRef(qname, "pub")])
        q.enqueue("ok", 3, job_id="report", depends_on=[JobRef(secret.name, "payroll-7"), "pub"])

        def authorize(request: Any, action: str, queue: str | None) -> bool:
            return queue != secret.name

        app = create_app(url, authorize=authorize, config=DashboardConfig(queues=(qname,)))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://dash") as c:
            for path, job in [("/flow", "report"), ("/job", "report"), ("/flow", "pub"),
                              ("/job", "pub")]:
                html = (await c.get(path, params={"q": qname, "id": job})).text
                assert "a job of a queue you may not view" in html, (path, job)
                assert "payroll" not in html and secret.name not in html, (path, job)
            assert "pub</a>" in (await c.get("/flow", params={"q": qname, "id": "report"})).text
            denied = await c.get("/flow", params={"q": secret.name, "id": "payroll-7"})
            assert denied.status_code == 403
    finally:
        secret.close()


async def test_a_flow_across_cluster_nodes(redis_cluster: Any) -> None:
    """Edges whose jobs live on other nodes of a Redis Cluster: each read goes to its node."""
    from streamq import Keys

    url = redis_cluster.url
    by_node: dict[int, str] = {}
    while len(by_node) < 2:
        name = f"fv-{uuid.uuid4().hex[:10]}"
        by_node.setdefault(redis_cluster.owner(Keys(name).stream), name)
    qa, qb = by_node.values()
    a, b = Queue.from_url(url, qa), Queue.from_url(url, qb)
    try:
        a.enqueue("ok", 1, job_id="leaf", delay=3600)
        b.enqueue("ok", None, job_id="mid", depends_on=[(qa, "leaf")])
        a.enqueue("ok", None, job_id="top", depends_on=[(qb, "mid")])
        app = create_app(url, config=DashboardConfig(queues=(qa, qb)))
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://dash") as c:
            top = (await c.get("/flow", params={"q": qa, "id": "top"})).text
            assert re.findall(r'data-job="([^"]+)"', top.split('id="deps"')[1]) == [
                "mid", "leaf"]  # (mid on the other node, expanded: leaf back on this one)
            job = (await c.get("/job", params={"q": qb, "id": "mid"})).text
            assert f'href="/job?q={qa}&amp;id=leaf"' in job.split('id="flow-children"')[1]
            assert f'href="/job?q={qa}&amp;id=top"' in job.split('id="flow-parents"')[1]
        await app.state.dashboard.aclose()
    finally:
        a.close()
        b.close()
