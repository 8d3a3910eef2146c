"""Workflows (docs/workflows.md): jobs that wait for others, on one server."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from helpers import eventually, running, state

import streamq
from streamq import JobRef, JobSpec, Queue, Registry, chain, chord, group
from streamq._core.driver import drive
from streamq._core.flow import repair
from streamq._core.scripts import SCRIPTS


def _reg(log: list[Any] | None = None) -> Registry:
    reg = Registry()

    @reg.handler("add")
    def add(job: streamq.Job) -> Any:
        prev = job.previous_result() or 0
        if log is not None:
            log.append((job.id, [d.job_id for d in job.dependency_results()]))
        return prev + int(job.payload)

    @reg.handler("collect")
    def collect(job: streamq.Job) -> Any:
        return [(d.state, d.result) for d in job.dependency_results()]

    @reg.handler("boom")
    def boom(job: streamq.Job) -> Any:
        raise streamq.Fail("boom")

    return reg


async def test_chain_of_three_passes_results(url: str, q: Queue, qname: str) -> None:
    flow = chain(JobSpec("add", 1), JobSpec("add", 10), JobSpec("add", 100))
    out = q.enqueue_flow(flow, flow_id="c3")
    assert out.job_ids == ["c3.0", "c3.1", "c3.2"]
    assert [state(q, i) for i in out.job_ids] == ["queued", "waiting", "waiting"]
    async with running(url, qname, _reg()):
        await eventually(lambda: state(q, "c3.2") == "completed", 30)
    assert q.result("c3.2") == 111


async def test_a_chain_across_slots_does_not_wait_for_the_relay_interval(
        url: str, q: Queue, qname: str) -> None:
    # steps alternate between two queues (two hash tags): every hand-off goes through the
    # finishing step's outbox; the relay's interval is a minute, yet the chain runs (the relay
    # is woken by the new outbox entry, not by its interval)
    from helpers import fast

    other = f"{qname}-x"
    flow = chain(*(JobSpec("add", 1, queue=other if i % 2 else None) for i in range(5)))
    out = q.enqueue_flow(flow, flow_id="x")
    async with streamq.Worker(url, [qname, other], _reg(), fast(promote_interval_s=60.0)):
        await eventually(lambda: state(q, out.last.job_id) == "completed", 20,
                         "the chain across two queues completed long before the interval")
    assert q.result(out.last.job_id) == 5
    with Queue.from_url(url, other) as o:
        assert o.client.xlen(o.keys.outbox) == 0 and q.client.xlen(q.keys.outbox) == 0


async def test_chord_callback_gets_every_result_in_order(url: str, q: Queue, qname: str) -> None:
    n = 20
    out = q.enqueue_flow(chord(group([JobSpec("add", i) for i in range(n)]),
                               JobSpec("collect")), flow_id="ch")
    assert len(out.job_ids) == n + 1 and out.last.job_id == f"ch.{n}"
    async with running(url, qname, _reg()):
        await eventually(lambda: state(q, out.last.job_id) == "completed", 30)
    assert q.result(out.last.job_id) == [["completed", i] for i in range(n)]
    cur, page = q.dependency_results(out.last.job_id, count=5)
    assert page == [] and cur == 0  # the callback completed: its dependency results are gone


async def test_a_repeated_enqueue_flow_writes_nothing_new(q: Queue, r: redis.Redis) -> None:
    flow = chain(JobSpec("add", 1), group([JobSpec("add", 2), JobSpec("add", 3)]),
                 JobSpec("collect"))
    first = q.enqueue_flow(flow, flow_id="rep")
    again = q.enqueue_flow(flow, flow_id="rep")
    assert first.job_ids == again.job_ids == ["rep.0", "rep.1", "rep.2", "rep.3"]
    assert [x.status for x in first.results] == ["queued", "waiting", "waiting", "waiting"]
    assert r.xlen(q.keys.stream) == 1
    assert r.smembers(q.keys.deps("rep.3")) == {b"f0 %s rep.1" % q.name.encode(),
                                                b"f1 %s rep.2" % q.name.encode()}


async def test_a_dag_with_two_parents_and_a_shared_child(url: str, q: Queue, qname: str) -> None:
    q.enqueue("add", 1, job_id="a")
    q.enqueue("add", 2, job_id="b")
    q.enqueue("collect", job_id="p1", depends_on=["a"])
    q.enqueue("collect", job_id="p2", depends_on=["b", "a"])
    q.enqueue("collect", job_id="top", depends_on=["p1", "p2"])
    assert [state(q, i) for i in ("p1", "p2", "top")] == ["waiting"] * 3
    async with running(url, qname, _reg()):
        await eventually(lambda: state(q, "top") == "completed", 30)
    assert q.result("p1") == [["completed", 1]]
    assert q.result("p2") == [["completed", 2], ["completed", 1]]
    assert q.result("top") == [["completed", [["completed", 1]]],
                               ["completed", [["completed", 2], ["completed", 1]]]]


async def test_failure_policies(url: str, q: Queue, qname: str) -> None:
    q.enqueue("boom", job_id="bad")
    q.enqueue("add", 5, job_id="good")
    q.enqueue("collect", job_id="p-fail", depends_on=["good", "bad"])
    q.enqueue("collect", job_id="p-cont", depends_on=["good", JobRef(qname, "bad", "continue")])
    q.enqueue("collect", job_id="p-ign", depends_on=[JobRef(qname, "bad", "ignore")])
    async with running(url, qname, _reg()):
        await eventually(lambda: state(q, "p-fail") == "failed"
                         and state(q, "p-cont") == "completed"
                         and state(q, "p-ign") == "completed", 30)
    info = q.get("p-fail")
    assert info is not None and info.reason == f"dependency {qname} bad failed"
    assert q.result("p-cont") == [["completed", 5], ["failed", None]]
    assert q.result("p-ign") == [["failed", None]]
    _, deps = q.dependency_results("p-fail")  # kept with the dead record, for a re-drive
    assert ("bad", "failed", "boom") in [(d.job_id, d.state, d.reason) for d in deps]


async def test_a_child_that_ended_before_its_parent_was_enqueued(
        url: str, q: Queue, qname: str, r: redis.Redis) -> None:
    q.enqueue("add", 7, job_id="early")
    async with running(url, qname, _reg()):
        await eventually(lambda: state(q, "early") == "completed", 30)
        res = q.enqueue("add", 1, job_id="late", depends_on=["early"])
        assert res.status == "waiting"
        assert state(q, "late") in ("queued", "active", "completed")  # released at once
        await eventually(lambda: state(q, "late") == "completed", 30)
    assert q.result("late") == 8
    assert r.xlen(q.keys.outbox) == 0


async def test_a_repeated_resolve_is_a_no_op(q: Queue, r: redis.Redis, qname: str) -> None:
    q.enqueue("add", 1, job_id="c1")
    q.enqueue("add", 2, job_id="c2")
    q.enqueue("collect", job_id="p", depends_on=["c1", "c2"])
    pkey = q.keys.job("p")
    m1 = f"f0 {qname} c1"
    assert SCRIPTS["resolve"](r, [pkey], ["p", m1, "c1"]) == 1
    assert SCRIPTS["resolve"](r, [pkey], ["p", m1, "c1"]) == 0
    assert r.scard(q.keys.deps("p")) == 1 and state(q, "p") == "waiting"
    assert SCRIPTS["resolve"](r, [pkey], ["p", f"f1 {qname} c2", "c2"]) == 3
    assert SCRIPTS["resolve"](r, [pkey], ["p", f"f1 {qname} c2", "c2"]) == 0
    assert state(q, "p") == "queued"
    assert r.xlen(q.keys.stream) == 3
    assert not r.exists(q.keys.deps("p")) and r.zcard(q.keys.waiting) == 0


@pytest.mark.parametrize(("policy", "ends"), [("fail", "failed"), ("ignore", "queued")])
def test_repair_resolves_a_parent_whose_child_record_was_deleted(
        q: Queue, r: redis.Redis, qname: str, policy: str, ends: str) -> None:
    q.enqueue("add", 1, job_id="kid")
    q.enqueue("collect", job_id="p", depends_on=[JobRef(qname, "kid", policy)])  # type: ignore[arg-type]
    cursors: dict[str, int] = {}
    assert drive(r, repair(q.keys, 1, 0, cursors)) == (1, 0)  # a live child: only linked
    assert state(q, "p") == "waiting"
    r.delete(q.keys.job("kid"))  # expired, purged by hand, lost in a failover
    assert drive(r, repair(q.keys, 1, 0, cursors)) == (1, 1)
    assert state(q, "p") == ends
    _, deps = q.dependency_results("p")
    assert [(d.job_id, d.state) for d in deps] == [("kid", "missing")]
    assert drive(r, repair(q.keys, 1, 0, cursors)) == (0, 0)
    assert int(r.hget(q.keys.stats, "flow_repairs") or 0) == 1


def test_repair_leaves_young_waiting_jobs_to_their_producer(q: Queue, r: redis.Redis) -> None:
    q.enqueue("add", 1, job_id="kid")
    q.enqueue("collect", job_id="p", depends_on=["kid"])
    r.delete(q.keys.job("kid"))
    assert drive(r, repair(q.keys, 1, 3_600_000, {})) == (0, 0)
    assert state(q, "p") == "waiting"


async def test_cancel_a_waiting_job_and_a_cancelled_child(q: Queue, r: redis.Redis,
                                                          qname: str) -> None:
    q.enqueue("add", 1, job_id="kid")
    q.enqueue("collect", job_id="p", depends_on=["kid"])
    q.enqueue("collect", job_id="p2", depends_on=[JobRef(qname, "kid", "continue")])
    assert q.cancel("p").cancelled
    assert state(q, "p") == "cancelled"
    assert not r.exists(q.keys.deps("p"), q.keys.dep_results("p"))
    assert q.cancel("kid").cancelled
    assert state(q, "p2") == "queued"  # resolved inline by the cancel, policy continue
    _, deps = q.dependency_results("p2")
    assert [(d.job_id, d.state) for d in deps] == [("kid", "cancelled")]
    assert not r.exists(q.keys.parents("kid")) and r.zcard(q.keys.waiting) == 0


async def test_a_sharded_queue_resolves_across_its_shards(url: str, qname: str,
                                                          r: redis.Redis) -> None:
    cfg = streamq.QueueConfig(shards=4)
    sq = Queue.from_url(url, qname, cfg)
    try:
        kids = [f"k{i}" for i in range(12)]
        for i, k in enumerate(kids):
            sq.enqueue("add", i, job_id=k)
        sq.enqueue("collect", job_id="p", depends_on=kids)
        assert state(sq, "p") == "waiting"
        async with streamq.Worker(url, [qname], _reg(), _fast(), queue_config=cfg):
            await eventually(lambda: state(sq, "p") == "completed", 30)
        assert sq.result("p") == [["completed", i] for i in range(12)]
        for s in range(4):
            assert r.xlen(sq.keys.of_shard(s).outbox) == 0
    finally:
        sq.close()


def _fast() -> streamq.WorkerConfig:
    from helpers import fast
    return fast()


async def test_memory_returns_after_a_1000_to_1_fan_in(url: str, q: Queue, qname: str,
                                                       r: redis.Redis) -> None:
    n = 1000
    q.enqueue_many([{"type": "add", "payload": 1, "job_id": f"k{i}", "result_ttl": 0}
                    for i in range(n)])
    q.enqueue("collect", job_id="sink", depends_on=[f"k{i}" for i in range(n)])
    assert r.scard(q.keys.deps("sink")) == n
    async with running(url, qname, _reg()):
        await eventually(lambda: state(q, "sink") == "completed", 60)
    res = q.result("sink")
    assert len(res) == n and all(x == ["completed", 1] for x in res)
    left = [k for k in r.scan_iter(match=f"streamq:{{{qname}}}:*", count=1000)
            if any(p in k for p in (b":deps:", b":dres:", b":par:", b":job:k"))]
    assert left == []
    assert r.xlen(q.keys.outbox) == 0 and r.zcard(q.keys.waiting) == 0


async def test_the_scheduler_daemon_relays_too(url: str, qname: str, r: redis.Redis) -> None:
    from schedulers import Scheduler, SchedulerConfig

    cfg = streamq.QueueConfig(shards=2)
    sq = Queue.from_url(url, qname, cfg)
    try:
        kids = [f"k{i}" for i in range(6)]  # in both shards: some edges cross slots
        for k in kids:
            sq.enqueue("add", 1, job_id=k)
        sq.enqueue("collect", job_id="p", depends_on=kids)
        async with streamq.Worker(url, [qname], _reg(), _fast_no_relay(), queue_config=cfg):
            await eventually(lambda: all(state(sq, k) == "completed" for k in kids), 30)
            outbox = sum(r.xlen(sq.keys.of_shard(s).outbox) for s in range(2))
            assert outbox > 0 and state(sq, "p") == "waiting"  # no relay ran yet
            async with Scheduler(url, [qname], config=SchedulerConfig(poll_interval_s=0.1),
                                 queue_config=cfg):
                await eventually(lambda: state(sq, "p") == "completed", 30)
        assert sum(r.xlen(sq.keys.of_shard(s).outbox) for s in range(2)) == 0
    finally:
        sq.close()


def _fast_no_relay() -> streamq.WorkerConfig:
    from helpers import fast
    return fast(promote=False)


def test_stats_count_waiting_jobs_and_the_oldest_wait(q: Queue, url: str) -> None:
    from streamq.admin import Admin

    q.enqueue("add", 1, job_id="kid")
    q.enqueue("collect", job_id="p1", depends_on=["kid"])
    q.enqueue("collect", job_id="p2", depends_on=["kid", "p1"])
    admin = Admin.from_url(url)
    try:
        s = admin.stats(q.name)
        assert s.waiting == 2 and s.oldest_waiting_age_s is not None
        assert s.oldest_waiting_age_s >= 0
        page = admin.delayed(q.name, "waiting")
        assert [(j.job_id, j.state) for j in page.items] == [("p1", "waiting"),
                                                              ("p2", "waiting")]
    finally:
        admin.close()


async def test_the_dashboard_lists_waiting_jobs(q: Queue, url: str) -> None:
    import httpx

    from streamq.dashboard import DashboardConfig, create_app

    q.enqueue("add", 1, job_id="kid")
    q.enqueue("collect", job_id="blocked", depends_on=["kid"])
    app = create_app(url, config=DashboardConfig(queues=(q.name,), poll_interval_s=0.1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as c:
        page = await c.get(f"/queue?q={q.name}&tab=waiting")
        assert page.status_code == 200
        assert "blocked" in page.text and "waiting since" in page.text
        job = await c.get(f"/job?q={q.name}&id=blocked")
        assert job.status_code == 200 and "waiting" in job.text


async def test_typed_tasks_make_flow_nodes(url: str, q: Queue, qname: str) -> None:
    reg = Registry()

    @reg.task("double")
    def double(job: streamq.Job, n: int) -> int:
        return 2 * (job.previous_result() or n)

    flow = chain(double.spec(3), double.options(job_id="d2").spec(0), double.spec(0))
    out = q.enqueue_flow(flow, flow_id="t")
    assert out.job_ids == ["t.0", "d2", "t.2"]
    async with running(url, qname, reg):
        await eventually(lambda: state(q, "t.2") == "completed", 30)
    assert q.result("t.2") == 24


def test_a_job_may_wait_for_more_jobs_than_lua_unpacks_at_once(q: Queue, r: redis.Redis
                                                              ) -> None:
    n = 9_000  # over Lua's unpack limit (~8,000): wait.lua adds the set in slices
    q.enqueue_many([{"type": "add", "payload": 1, "job_id": f"k{i}"} for i in range(n)])
    assert q.enqueue("collect", job_id="sink",
                     depends_on=[f"k{i}" for i in range(n)]).status == "waiting"
    assert r.scard(q.keys.deps("sink")) == n
    assert r.scard(q.keys.parents("k8999")) == 1


@pytest.mark.parametrize("shards", [1, 2])
async def test_re_driving_a_dead_dependency_re_opens_its_dead_job(url: str, qname: str,
                                                                  shards: int) -> None:
    from streamq._core.keys import shard_of
    from streamq.admin import Admin

    cfg = streamq.QueueConfig(shards=shards)
    reg = _reg()
    fixed: list[bool] = []

    @reg.handler("flaky")
    def flaky(job: streamq.Job) -> Any:
        if not fixed:
            raise streamq.Fail("not yet")
        return 42

    kid = next(f"kid{i}" for i in range(100) if shards == 1
               or shard_of(f"kid{i}", shards) != shard_of("p", shards))  # another slot
    sq = Queue.from_url(url, qname, cfg)
    admin = Admin.from_url(url, cfg)
    try:
        sq.enqueue("flaky", job_id=kid)
        sq.enqueue("add", 1, job_id="ok")
        sq.enqueue("collect", job_id="p", depends_on=[kid, "ok"])
        async with streamq.Worker(url, [qname], reg, _fast(), queue_config=cfg):
            await eventually(lambda: state(sq, "p") == "failed", 30)
            info = sq.get("p")
            assert info is not None and info.reason == f"dependency {qname} {kid} failed"
            fixed.append(True)
            dead = [e for e in admin.dead(qname).items if e.job_id == kid]
            assert admin.redrive(qname, dead) == {"redriven": 1}
            await eventually(lambda: state(sq, "p") == "completed", 30)
        assert sq.result("p") == [["completed", 42], ["completed", 1]]
    finally:
        sq.close()
        admin.close()


def test_depends_on_refuses_what_it_does_not_support_yet(q: Queue) -> None:
    q.enqueue("add", 1, job_id="kid")
    for bad in ({"group": "g"}, {"dedup": streamq.Dedup(key="k")}):
        with pytest.raises(streamq.InvalidArgument):
            q.enqueue("collect", depends_on=["kid"], **bad)
    with pytest.raises(streamq.InvalidArgument):
        q.enqueue("collect", depends_on=[])
    with pytest.raises(streamq.InvalidArgument):
        q.enqueue("collect", depends_on=["kid", "kid"])
    with pytest.raises(streamq.InvalidArgument):
        q.enqueue_flow(chain(JobSpec("add", 1, job_id="x"), JobSpec("add", 2, job_id="x")))
