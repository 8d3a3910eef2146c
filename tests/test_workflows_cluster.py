"""Workflows across cluster slots (docs/workflows.md): an edge between queues on different
primaries is resolved through the child's outbox and the relay of a running worker."""

from __future__ import annotations

from typing import Any

import pytest
from helpers import eventually, fast

import streamq
from streamq import JobSpec, Keys, Queue, Registry, Worker, chain
from streamq._core.cluster_server import ClusterServer
from streamq._core.conn import sync_client

pytestmark = pytest.mark.cluster


def _queues_on_two_nodes(cluster: ClusterServer) -> tuple[str, str]:
    import uuid
    by_node: dict[int, str] = {}
    while len(by_node) < 2:
        name = f"wf-{uuid.uuid4().hex[:10]}"
        by_node.setdefault(cluster.owner(Keys(name).stream), name)
    a, b = by_node.values()
    return a, b


def _reg() -> Registry:
    reg = Registry()

    @reg.handler("add")
    def add(job: streamq.Job) -> Any:
        return (job.previous_result() or 0) + int(job.payload)

    @reg.handler("collect")
    def collect(job: streamq.Job) -> Any:
        return [(d.queue, d.state, d.result) for d in job.dependency_results()]

    return reg


async def test_an_edge_across_slots_goes_through_the_outbox(redis_cluster: ClusterServer
                                                            ) -> None:
    url = redis_cluster.url
    qa, qb = _queues_on_two_nodes(redis_cluster)
    a, b = Queue.from_url(url, qa), Queue.from_url(url, qb)
    client = sync_client(url)
    try:
        a.enqueue("add", 3, job_id="kid")
        b.enqueue("collect", job_id="p", depends_on=[(qa, "kid")])
        flow = chain(JobSpec("add", 1, queue=qa), JobSpec("add", 10, queue=qb),
                     JobSpec("add", 100, queue=qa))
        out = b.enqueue_flow(flow, flow_id="x")
        assert [(r.queue, r.job_id) for r in out.refs] == [(qa, "x.0"), (qb, "x.1"),
                                                           (qa, "x.2")]
        assert b.get("p").state == "waiting"  # type: ignore[union-attr]
        async with Worker(url, [qa, qb], _reg(), fast()):
            await eventually(lambda: (b.get("p").state == "completed"  # type: ignore[union-attr]
                                      and a.get("x.2").state == "completed"),  # type: ignore[union-attr]
                             timeout_s=30, what="both flows completed")
        assert b.result("p") == [[qa, "completed", 3]]
        assert a.result("x.2") == 111
        assert client.xlen(Keys(qa).outbox) == 0 and client.xlen(Keys(qb).outbox) == 0
        assert not client.exists(Keys(qb).deps("p"), Keys(qa).parents("kid"))
    finally:
        a.close()
        b.close()
        client.close()


def test_flow_view_and_cancel_cascade_across_nodes(redis_cluster: ClusterServer) -> None:
    from streamq.admin import Admin

    url = redis_cluster.url
    qa, qb = _queues_on_two_nodes(redis_cluster)
    a, b = Queue.from_url(url, qa), Queue.from_url(url, qb)
    admin = Admin.from_url(url)
    try:
        a.enqueue("add", 1, job_id="leaf", delay=3600)
        b.enqueue("collect", job_id="mid", depends_on=[(qa, "leaf")])
        a.enqueue("collect", job_id="top", depends_on=[(qb, "mid")])
        view = admin.flow(qb, "mid")
        assert [(c.queue, c.job_id, c.state) for c in view.blocked_by] == [
            (qa, "leaf", "scheduled")]
        assert [(p.queue, p.job_id, p.state) for p in view.parents] == [(qa, "top", "waiting")]
        assert a.cancel("top").cancelled
        assert b.get("mid").state == "cancelled"  # type: ignore[union-attr]
        assert a.get("leaf").state == "cancelled"  # type: ignore[union-attr]
    finally:
        admin.close()
        a.close()
        b.close()


async def test_a_batch_with_jobs_on_another_node(redis_cluster: ClusterServer) -> None:
    url = redis_cluster.url
    qa, qb = _queues_on_two_nodes(redis_cluster)
    a = Queue.from_url(url, qa)
    client = sync_client(url)
    try:
        batch = a.batch(on_complete=JobSpec("collect"), batch_id="bx")
        batch.add([JobSpec("add", 1, queue=qb, job_id="far"), JobSpec("add", 2, job_id="near")])
        assert batch.close() is True
        async with Worker(url, [qa, qb], _reg(), fast()):
            await eventually(lambda: a.get("bx.on_complete").state == "completed",  # type: ignore[union-attr]
                             timeout_s=30, what="the batch's callback ran")
        assert a.result("bx.on_complete") == [[qa, "completed", "bx"], [qb, "completed", 1],
                                              [qa, "completed", 2]]
        assert client.xlen(Keys(qb).outbox) == 0
        assert not client.exists(Keys(qa).deps("bx.on_complete"), Keys(qb).parents("far"))
    finally:
        a.close()
        client.close()
