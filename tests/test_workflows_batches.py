"""Batches with callbacks and the ``remove`` policy (docs/workflows.md#batches-with-callbacks),
on one server."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
from helpers import eventually, fast, running, state

import streamq
from streamq import BatchClosed, JobRef, JobSpec, Queue, Registry
from streamq._core.driver import drive
from streamq._core.flow import repair
from streamq._core.scripts import SCRIPTS
from streamq.admin import Admin
from streamq.cli.main import main as cli


def _reg(producer: Queue | None = None, runs: list[str] | None = None) -> Registry:
    reg = Registry()

    @reg.handler("add")
    def add(job: streamq.Job) -> Any:
        return int(job.payload)

    @reg.handler("boom")
    def boom(job: streamq.Job) -> Any:
        raise streamq.Fail("boom")

    @reg.handler("spawn")
    def spawn(job: streamq.Job) -> Any:  # adds two jobs to its own batch, from inside
        assert producer is not None and job.batch_id is not None
        producer.batch_ref(job.batch_id).add(
            [JobSpec("add", 100, job_id=f"{job.id}-k{i}") for i in range(2)], from_job=job)
        return 0

    @reg.handler("summary")
    def summary(job: streamq.Job) -> Any:
        if runs is not None:
            runs.append(job.id)
        s = job.batch_summary()
        return [s.batch_id, s.total, s.completed, sorted(s.failed),
                sum(d.result for d in s.results if d.state == "completed")]

    return reg


def _callbacks() -> dict[str, JobSpec]:
    return {"on_success": JobSpec("summary"), "on_complete": JobSpec("summary"),
            "on_death": JobSpec("summary")}


def _flow_keys(r: redis.Redis, qname: str) -> list[bytes]:
    return [k for k in r.scan_iter(match=f"streamq:{{{qname}}}:*", count=1000)
            if any(p in k for p in (b":deps:", b":dres:", b":par:"))]


async def test_callbacks_fire_only_after_close_and_memory_returns(
        url: str, q: Queue, qname: str, r: redis.Redis) -> None:
    b = q.batch(**_callbacks(), batch_id="b1")
    assert b.callbacks == {"on_success": "b1.on_success", "on_complete": "b1.on_complete",
                           "on_death": "b1.on_death"}
    out = b.add([JobSpec("add", i, job_id=f"j{i}") for i in range(5)])
    assert out.job_ids == [f"j{i}" for i in range(5)]
    cbs = list(b.callbacks.values())
    async with running(url, qname, _reg()):
        await eventually(lambda: all(state(q, f"j{i}") == "completed" for i in range(5)), 30)
        # every job ended, the batch is open: no callback left 'waiting'
        assert [state(q, c) for c in cbs] == ["waiting"] * 3
        admin = Admin.from_url(url)
        view = admin.flow(qname, "b1")
        admin.close()
        assert view.batch is not None
        assert (view.batch.total, view.batch.completed, view.batch.dead,
                view.batch.pending, view.batch.open) == (5, 5, 0, 0, True)
        assert b.close() is True
        assert b.close() is False  # idempotent
        await eventually(lambda: state(q, "b1.on_success") == "completed"
                         and state(q, "b1.on_complete") == "completed", 30)
    assert state(q, "b1.on_death") == "cancelled"  # nothing died
    assert q.result("b1.on_success") == ["b1", 5, 5, [], 10]
    assert q.result("b1.on_complete") == ["b1", 5, 5, [], 10]
    assert state(q, "b1") == "completed"
    with pytest.raises(BatchClosed):
        b.add([JobSpec("add", 1, job_id="late")])
    assert state(q, "late") == ""
    assert _flow_keys(r, qname) == [] and r.zcard(q.keys.waiting) == 0


async def test_complete_with_failures_and_death_fires_once(url: str, q: Queue, qname: str
                                                           ) -> None:
    runs: list[str] = []
    with q.batch(**_callbacks(), batch_id="b2") as b:
        b.add([JobSpec("add", 1, job_id="ok1"), JobSpec("add", 2, job_id="ok2")])
        b.add([JobSpec("boom", job_id="bad1"), JobSpec("boom", job_id="bad2")])
    async with running(url, qname, _reg(runs=runs), concurrency=4):
        await eventually(lambda: state(q, "b2.on_complete") == "completed"
                         and state(q, "b2.on_death") == "completed"
                         and state(q, "b2.on_success") == "failed", 30)
    assert runs.count("b2.on_death") == 1
    assert q.result("b2.on_complete") == ["b2", 4, 2, ["bad1", "bad2"], 3]
    dead = q.result("b2.on_death")
    assert dead[0] == "b2" and len(dead[3]) == 1 and dead[3][0] in ("bad1", "bad2")
    info = q.get("b2.on_success")
    assert info is not None and info.reason in (f"dependency {qname} bad1 failed",
                                                f"dependency {qname} bad2 failed")


def test_two_concurrent_deaths_release_on_death_once(q: Queue, qname: str, r: redis.Redis
                                                     ) -> None:
    b = q.batch(on_death=JobSpec("summary"), batch_id="b3")
    b.add([JobSpec("boom", job_id="d1"), JobSpec("boom", job_id="d2")])
    cb = b.callbacks["on_death"]
    members = {m.decode() if isinstance(m, bytes) else m for m in r.smembers(q.keys.deps(cb))}
    assert members == {f"d0 {qname} b3", f"d1 {qname} d1", f"d2 {qname} d2"}
    # both dead letters resolve it (the order does not matter): the first releases it, the
    # second finds nothing pending; while the batch is still open
    assert SCRIPTS["resolve"](r, [q.keys.job(cb)], [cb, f"d2 {qname} d2", "fboom"]) == 3
    assert SCRIPTS["resolve"](r, [q.keys.job(cb)], [cb, f"d1 {qname} d1", "fboom"]) == 0
    assert state(q, cb) == "queued" and r.xlen(q.keys.stream) == 3  # d1, d2, the callback


async def test_jobs_added_from_inside_a_job_after_close(url: str, q: Queue, qname: str) -> None:
    producer = Queue.from_url(url, qname)
    try:
        b = q.batch(on_complete=JobSpec("summary"), batch_id="b4")
        b.add([JobSpec("spawn", job_id="s")])
        b.close()  # closed before the job runs: it adds to its own batch all the same
        async with running(url, qname, _reg(producer)):
            await eventually(lambda: state(q, "b4.on_complete") == "completed", 30)
        assert q.result("b4.on_complete") == ["b4", 3, 3, [], 200]
        with pytest.raises(BatchClosed):
            b.add([JobSpec("add", 1)])
    finally:
        producer.close()


def test_lost_replies_repeat_add_and_close_and_open(q: Queue, qname: str, r: redis.Redis,
                                                   url: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    b = q.batch(**_callbacks(), batch_id="b5")
    assert q.batch(**_callbacks(), batch_id="b5").callbacks == b.callbacks  # a repeated open
    specs = [JobSpec("add", i) for i in range(3)]
    first = b.add(specs)
    again = b.add(specs)  # the same call repeated (no job ids: the same content)
    assert first.job_ids == again.job_ids and len(set(first.job_ids)) == 3
    b.add([JobSpec("add", 7, job_id="other")])
    assert b.add(specs).job_ids == first.job_ids  # an earlier call than the last, repeated
    for cb in b.callbacks.values():
        assert r.scard(q.keys.deps(cb)) == 5  # the batch + 4 jobs, once each
    assert r.xlen(q.keys.stream) == 4
    assert cli(["--url", url, "flow", qname, "b5"]) == 0
    assert "batch (open): total 4, completed 0, dead 0, pending 4" in capsys.readouterr().out
    assert b.close() is True and b.close() is False
    assert cli(["--url", url, "--json", "flow", qname, "b5"]) == 0
    got = json.loads(capsys.readouterr().out)["batch"]
    assert (got["open"], got["total"], got["pending"]) == (False, 4, 4)
    for cb in b.callbacks.values():
        assert r.scard(q.keys.deps(cb)) == 4 and state(q, cb) == "waiting"


def test_cancelling_a_batch_cancels_its_callbacks_and_unstarted_jobs(q: Queue) -> None:
    b = q.batch(**_callbacks(), batch_id="b6")
    b.add([JobSpec("add", i, job_id=f"c{i}") for i in range(3)])
    assert all(c.cancelled for c in q.batch_ref("b6").cancel())
    assert [state(q, i) for i in ("b6", "c0", "c1", "c2", *b.callbacks.values())] == \
        ["cancelled"] * 7
    with pytest.raises(BatchClosed):
        b.add([JobSpec("add", 9)])


async def test_remove_policy_drops_a_failed_dependency(url: str, q: Queue, qname: str) -> None:
    reg = _reg()

    @reg.handler("collect")
    def collect(job: streamq.Job) -> Any:
        return [(d.job_id, d.state) for d in job.dependency_results()]

    q.enqueue("add", 1, job_id="good")
    q.enqueue("boom", job_id="bad")
    q.enqueue("collect", job_id="p-rm", depends_on=[JobRef(qname, "good", "remove"),
                                                    JobRef(qname, "bad", "remove")])
    q.enqueue("collect", job_id="p-ign", depends_on=[JobRef(qname, "bad", "ignore")])
    async with running(url, qname, reg):
        await eventually(lambda: state(q, "p-rm") == "completed"
                         and state(q, "p-ign") == "completed", 30)
    assert q.result("p-rm") == [["good", "completed"]]  # no trace of 'bad'
    assert q.result("p-ign") == [["bad", "failed"]]


def test_batch_refuses_bad_input(q: Queue) -> None:
    with pytest.raises(streamq.InvalidArgument):
        q.batch(batch_id="none")
    with pytest.raises(streamq.InvalidArgument):
        q.batch(on_success=JobSpec("summary", queue="elsewhere"))
    with pytest.raises(streamq.JobNotFound):
        q.batch_ref("never").add([JobSpec("add", 1)])
    b = q.batch(on_complete=JobSpec("summary"))
    with pytest.raises(streamq.InvalidArgument):
        b.add([])


def test_the_repair_sweep_covers_a_lost_job_but_never_opens_an_open_batch(
        q: Queue, r: redis.Redis, qname: str) -> None:
    b = q.batch(on_success=JobSpec("summary"), on_complete=JobSpec("summary"), batch_id="b7")
    b.add([JobSpec("add", 1, job_id="lost")])
    r.delete(q.keys.job("lost"))  # expired, purged by hand, lost in a failover
    cursors: dict[str, int] = {}
    drive(r, repair(q.keys, 1, 0, cursors))
    # the lost job is resolved 'missing'; the batch is open: on_complete keeps waiting for it
    assert state(q, "b7.on_complete") == "waiting"
    assert state(q, "b7.on_success") == "failed"  # (policy fail: a missing job is a failure)
    assert drive(r, repair(q.keys, 1, 0, cursors))[1] == 0  # the open batch is linked, live
    assert state(q, "b7.on_complete") == "waiting"
    assert b.close() is True
    assert state(q, "b7.on_complete") == "queued"
    _, deps = q.dependency_results("b7.on_complete")
    assert [(d.job_id, d.state) for d in deps] == [("b7", "completed"), ("lost", "missing")]


async def test_re_driving_a_dead_job_re_opens_on_success(url: str, q: Queue, qname: str) -> None:
    reg = _reg()
    fixed: list[bool] = []

    @reg.handler("flaky")
    def flaky(job: streamq.Job) -> Any:
        if not fixed:
            raise streamq.Fail("not yet")
        return 5

    with q.batch(on_success=JobSpec("summary"), batch_id="b8") as b:
        b.add([JobSpec("flaky", job_id="fl"), JobSpec("add", 1, job_id="one")])
    admin = Admin.from_url(url)
    try:
        async with running(url, qname, reg):
            await eventually(lambda: state(q, "b8.on_success") == "failed", 30)
            fixed.append(True)
            dead = [e for e in admin.dead(qname).items if e.job_id == "fl"]
            assert admin.redrive(qname, dead) == {"redriven": 1}
            await eventually(lambda: state(q, "b8.on_success") == "completed", 30)
        assert q.result("b8.on_success") == ["b8", 2, 2, [], 6]
    finally:
        admin.close()


async def test_a_batch_of_a_sharded_queue_through_the_async_api(url: str, qname: str,
                                                                r: redis.Redis) -> None:
    from streamq._core.keys import shard_of

    cfg = streamq.QueueConfig(shards=4)
    aq = streamq.AsyncQueue.from_url(url, qname, cfg)
    sq = Queue.from_url(url, qname, cfg)
    admin = Admin.from_url(url, cfg)
    try:
        async with await aq.batch(on_complete=JobSpec("summary"), batch_id="b9") as b:
            await b.add([JobSpec("add", i, job_id=f"s{i}") for i in range(8)])
        cb = b.callbacks["on_complete"]
        assert shard_of(cb, 4) == shard_of("b9", 4)  # the callbacks live in the batch's shard
        got = admin.flow(qname, "b9").batch
        assert got is not None and (got.open, got.total, got.pending) == (False, 8, 8)
        async with streamq.Worker(url, [qname], _reg(), fast(), queue_config=cfg):
            await eventually(lambda: state(sq, cb) == "completed", 30)
        assert sq.result(cb) == ["b9", 8, 8, [], 28]
        with pytest.raises(BatchClosed):
            await b.add([JobSpec("add", 1)])
        other = await aq.batch(on_success=JobSpec("summary"), on_death=JobSpec("summary"))
        await other.add([JobSpec("add", 1, job_id="s-x")])
        assert all(c.cancelled for c in await other.cancel())
        assert state(sq, "s-x") == "cancelled"
        assert [k for k in r.scan_iter(match=f"streamq:{{{qname}}}*", count=1000)
                if b":deps:" in k or b":par:" in k or b":dres:" in k] == []
    finally:
        admin.close()
        sq.close()
        await aq.close()
