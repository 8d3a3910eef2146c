"""Cancelling a flow (docs/workflows.md#cancelling-a-flow): a cancelled waiting job cancels its
unstarted dependencies that no other job waits for, down the flow."""

from __future__ import annotations

import redis
from helpers import field, started, state

from streamq import JobRef, JobSpec, Queue, chain
from streamq._core.driver import drive
from streamq._core.flow_cancel import cascade
from streamq._core.keys import GROUP
from streamq.admin import Admin


def test_cancelling_the_end_of_a_chain_cancels_every_unstarted_step(q: Queue,
                                                                    r: redis.Redis) -> None:
    out = q.enqueue_flow(chain(JobSpec("x", 1), JobSpec("x", 2), JobSpec("x", 3)), flow_id="c")
    assert [state(q, i) for i in out.job_ids] == ["queued", "waiting", "waiting"]
    assert q.cancel("c.2").cancelled
    assert [state(q, i) for i in out.job_ids] == ["cancelled"] * 3
    assert r.xlen(q.keys.stream) == 0  # the queued first step left its stream
    for i in out.job_ids:
        assert not r.exists(q.keys.deps(i), q.keys.dep_results(i), q.keys.parents(i))
    assert r.zcard(q.keys.waiting) == 0
    # a repeat (a retried call) changes nothing
    assert drive(r, cascade(q.keys, q.config, "c.2")) == []


def test_a_dependency_another_job_waits_for_is_kept(q: Queue, r: redis.Redis) -> None:
    q.enqueue("x", job_id="shared")
    q.enqueue("x", job_id="own")
    q.enqueue("x", job_id="p1", depends_on=["shared", "own"])
    q.enqueue("x", job_id="p2", depends_on=[JobRef(q.name, "shared", "continue")])
    assert q.cancel("p1").cancelled
    assert state(q, "own") == "cancelled"
    assert state(q, "shared") == "queued"  # p2 still waits for it
    assert r.smembers(q.keys.parents("shared")) == {f"c0 {q.keys.job('p2')} p2".encode()}
    assert q.cancel("p2").cancelled
    assert state(q, "shared") == "cancelled"


def test_a_running_dependency_is_left_alone(q: Queue, r: redis.Redis) -> None:
    r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    started(r, q, "kid")
    q.enqueue("x", job_id="p", depends_on=["kid"])
    assert q.cancel("p").cancelled
    assert state(q, "kid") == "active"
    assert field(r, q.keys.job("kid"), "cx") is None  # no cancel request sent to its worker
    assert not r.exists(q.keys.parents("kid"))  # nobody waits for it any more


def test_the_admin_cancel_cascades_across_queues(url: str, q: Queue, qname: str,
                                                 r: redis.Redis) -> None:
    other = Queue.from_url(url, f"{qname}-o")
    try:
        other.enqueue("x", job_id="far", delay=3600)
        other.enqueue("x", job_id="mid", depends_on=["far"])
        q.enqueue("x", job_id="top", depends_on=[(other.name, "mid")])
        admin = Admin.from_url(url)
        assert admin.cancel(qname, "top").cancelled
        admin.close()
        assert state(other, "mid") == "cancelled" and state(other, "far") == "cancelled"
        assert r.zcard(other.keys.delayed) == 0
    finally:
        other.close()


async def test_the_async_cancel_cascades(url: str, q: Queue, qname: str) -> None:
    from streamq import AsyncQueue

    q.enqueue("x", job_id="kid")
    q.enqueue("x", job_id="p", depends_on=["kid"])
    async with AsyncQueue.from_url(url, qname) as aq:
        assert (await aq.cancel("p")).cancelled
    assert state(q, "kid") == "cancelled"


def test_the_cascade_crosses_the_shards_of_a_sharded_queue(url: str, qname: str) -> None:
    from streamq import QueueConfig

    sq = Queue.from_url(url, qname, QueueConfig(shards=4))
    try:
        kids = [f"k{i}" for i in range(8)]
        for k in kids:
            sq.enqueue("x", job_id=k)
        sq.enqueue("x", job_id="fan", depends_on=kids)
        assert sq.cancel("fan").cancelled
        assert [sq.get(k).state for k in kids] == ["cancelled"] * 8  # type: ignore[union-attr]
    finally:
        sq.close()
