"""Calls by id find a job across a live reshard (docs/scaling.md, "Calls by id during and after
a reshard"). Records are never moved: a job written before ``reshard.begin`` stays in its home
under the count it was written with, and every call by id looks in ``Layout.homes(id)``.
After 3 -> 6 and then 6 -> 3: Queue.get / result (also waiting for it) / cancel /
dependency_results, sync and async; Admin job, timeline, lease, run_now, requeue, cancel,
find_dead, redrive (a dead letter in an old shard of a reshard down goes back to that shard);
search by id and by id prefix; depends_on an old job (queued and completed), add_children to
an old running parent, cancelling a waiting job that cascades to an old dependency, the flow
view. An id that did not move needs no extra read (``locate`` returns without a step)."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import closing
from typing import Any

import attrs
import pytest
from helpers import eventually, fast, start_entries

from streamq import (
    AsyncQueue,
    Fail,
    Job,
    JobFailed,
    JobRef,
    JobSpec,
    Keys,
    Queue,
    QueueConfig,
    Registry,
    SearchConfig,
    Worker,
)
from streamq._core.cluster_server import ClusterServer
from streamq._core.conn import sync_client
from streamq._core.driver import Cmd, drive
from streamq._core.flow import repair
from streamq._core.keys import GROUP, shard_of
from streamq._core.locate import homes, locate, locate_many, lookup
from streamq._core.reshard import begin
from streamq._core.shards import Layout
from streamq._producer.flows import _prepared, wait_call
from streamq.admin import Admin, AsyncAdmin

C3, C6 = QueueConfig(shards=3), QueueConfig(shards=6)


def moved(tag: str, a: int = 3, b: int = 6, *, to: int | None = None) -> str:
    """A job id whose home under ``a`` shards is not its home under ``b`` (and is ``to``)."""
    for i in range(10_000):
        jid = f"{tag}-{i}"
        if shard_of(jid, a) != shard_of(jid, b) and to in (None, shard_of(jid, a)):
            return jid
    raise AssertionError("no such id")


def stayed(tag: str, a: int = 3, b: int = 6) -> str:
    """A job id whose home is the same under both counts."""
    return next(f"{tag}-{i}" for i in range(10_000)
                if shard_of(f"{tag}-{i}", a) == shard_of(f"{tag}-{i}", b))


def reshard(url: str, name: str, n: int) -> Layout:
    c = sync_client(url)
    try:
        return drive(c, begin(Keys(name), n, 3600))
    finally:
        c.close()


def registry() -> Registry:
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> str:
        return f"done {job.id}"

    @reg.handler("bad")
    async def bad(job: Job) -> None:
        raise Fail("bad")

    return reg


async def run_until(url: str, name: str, cfg: QueueConfig, q: Queue, *ids: str) -> None:
    """A worker of ``cfg`` runs until every job of ``ids`` ended."""
    def ended() -> bool:
        return all((i := q.get(j)) is not None and i.finished for j in ids)
    async with Worker(url, [name], registry(), fast(promote=False), cfg):
        await eventually(ended, 30, what="jobs ended")


def record_exists(url: str, name: str, shard: int, jid: str) -> bool:
    c = sync_client(url)
    try:
        return bool(c.exists(Keys(name, shard=shard).job(jid)))
    finally:
        c.close()


def one(step: list[Any]) -> Any:
    """An operation of one step."""
    r = yield step
    return r


def start(c: Any, keys: Keys, jid: str) -> None:
    """Start ``jid`` as a worker would, in its shard (``keys``): it is running then."""
    c.xreadgroup(GROUP, "c1", {keys.stream: ">"}, count=100)
    entries: Any = c.xrange(keys.stream)
    entry = next(e[0].decode() for e in entries if jid.encode() in e[1].values())
    assert start_entries(c, keys, "c1", [(entry, jid)])[0] == b"run"


def test_locate_reads_nothing_for_an_id_that_did_not_move() -> None:
    keys = Keys("q")
    lay = Layout(6, prev=(3,))
    same, away = stayed("s"), moved("m")
    op = locate(keys, lay, same)
    with pytest.raises(StopIteration) as stop:
        next(op)  # no step: answered from the layout alone
    assert stop.value.value == Keys("q", shard=shard_of(same, 6))
    op = locate(keys, lay, away)
    step = next(op)
    assert step == [Cmd.of("EXISTS", Keys("q", shard=s).job(away))
                    for s in (shard_of(away, 6), shard_of(away, 3))]
    with pytest.raises(StopIteration) as stop:
        op.send([0, 1])  # found in its old home
    assert stop.value.value.shard == shard_of(away, 3)
    op = locate(keys, lay, away)
    next(op)
    with pytest.raises(StopIteration) as stop:
        op.send([0, 0])  # nowhere: the current home, where it would be written now
    assert stop.value.value.shard == shard_of(away, 6)
    # never resharded: never a step, whatever the id
    with pytest.raises(StopIteration):
        next(locate(keys, Layout(3), away))
    with pytest.raises(StopIteration):
        next(locate_many(keys, Layout(6, prev=(6,)), [same, away]))
    # a reshard begun and not published: its count's home is looked at last
    assert homes(Layout(3, next=6), away) == (shard_of(away, 3), shard_of(away, 6))


async def test_queue_calls_by_id_find_jobs_written_before_a_reshard(
        where: tuple[str, ClusterServer | None]) -> None:
    url, _cluster = where
    name = f"rl-{uuid.uuid4().hex[:10]}"
    done, dead, wait, gone, later = (moved(t) for t in ("done", "dead", "wait", "gone", "later"))
    with Queue.from_url(url, name, C3) as q3:
        q3.enqueue("ok", job_id=done)
        q3.enqueue("bad", job_id=dead)
        await run_until(url, name, C3, q3, done, dead)
        for jid in (wait, gone):
            q3.enqueue("ok", job_id=jid)
        q3.enqueue("ok", job_id=later, delay=3600)
        assert reshard(url, name, 6).prev == (3,)
        with Queue.from_url(url, name, C6) as q6:
            info = q6.get(wait)
            assert info is not None and info.state == "queued"
            assert q6.layout == Layout(6, prev=(3,), prev_until_ms=q6.layout.prev_until_ms,
                                       live=6, epoch=1)
            assert q6.result(done) == f"done {done}"
            with pytest.raises(JobFailed):
                q6.result(dead)
            assert q6.dependency_results(done) == (0, [])
            res = q6.cancel(gone)
            assert res.cancelled and q6.get(gone).state == "cancelled"  # type: ignore[union-attr]
            assert record_exists(url, name, shard_of(gone, 3), gone)  # (where it was written)
            # a job written after the reshard goes to its new home; the queue object made
            # before it (its layout: 3 shards) finds it too: a miss reads the layout again
            new = moved("new")
            q6.enqueue("ok", job_id=new)
            assert record_exists(url, name, shard_of(new, 6), new)
            assert q3.get(new) is not None and q3.layout.shards == 6
            # waiting for a result: a worker (of the new count) runs the old job
            async with Worker(url, [name], registry(), fast(promote=False), C6):
                for jid in (wait, new):  # (blocking: in a thread, the worker on this loop)
                    got = await asyncio.to_thread(q6.result, jid, timeout=30)
                    assert got == f"done {jid}"
        assert q3.get("never-enqueued") is None
    # 6 -> 3: jobs written under 6 and under 3 are both found
    assert reshard(url, name, 3).prev == (6,)
    with Queue.from_url(url, name, C3) as q:
        assert q.result(new) == f"done {new}"
        assert q.result(wait) == f"done {wait}"
        assert q.get(later).state == "scheduled"  # type: ignore[union-attr]
        assert q.get("never-enqueued") is None
    async with AsyncQueue.from_url(url, name, C3) as aq:
        info = await aq.get(new)
        assert info is not None and info.state == "completed"
        assert await aq.result(done, timeout=5) == f"done {done}"
        assert (await aq.dependency_results(new)) == (0, [])
        res = await aq.cancel(later)
        assert res.cancelled and (await aq.get(later)).state == "cancelled"  # type: ignore[union-attr]


async def test_admin_calls_by_id_and_search_find_jobs_written_before_a_reshard(
        where: tuple[str, ClusterServer | None]) -> None:
    url, _cluster = where
    name = f"ra-{uuid.uuid4().hex[:10]}"
    cfg3 = QueueConfig(shards=3, search=SearchConfig())
    cfg6 = QueueConfig(shards=6, search=SearchConfig())
    dead, run, sched, gone = (moved(f"{t}x") for t in ("dead", "run", "sched", "gone"))
    c = sync_client(url)
    with Queue.from_url(url, name, cfg3) as q3:
        q3.enqueue("bad", job_id=dead)
        await run_until(url, name, cfg3, q3, dead)
        q3.enqueue("ok", job_id=sched, delay=3600)
        q3.enqueue("ok", job_id=gone)
        # a running job (started as a worker would, in its shard)
        q3.enqueue("ok", job_id=run)
        start(c, Keys(name, shard=shard_of(run, 3)), run)
    reshard(url, name, 6)
    admin = Admin.from_url(url, cfg6)
    try:
        assert admin.job(name, sched).state == "scheduled"
        assert admin.lease(name, run) is not None
        assert admin.requeue(name, run) == "requeued"
        assert admin.job(name, run).state == "queued"
        assert admin.run_now(name, sched) == "due now"
        res = admin.cancel(name, gone)
        assert res.cancelled
        assert admin.timeline(name, gone).events  # its shard's events stream (the audit)
        info = admin.job(name, dead)
        assert info.state == "failed" and info.finished_at is not None
        entry_ = admin.find_dead(name, dead, int(info.finished_at.timestamp() * 1000))
        assert entry_ is not None and entry_.shard == shard_of(dead, 3)
        hits = admin.find(name, id=sched).items
        assert [(h.job_id, h.shard) for h in hits] == [(sched, shard_of(sched, 3))]
        pre = admin.find(name, id_prefix=sched[:-2]).items
        assert sched in {h.job_id for h in pre}
        assert admin.redrive(name, [entry_]) == {"redriven": 1}
        assert admin.job(name, dead).state == "queued"
    finally:
        admin.close()
    # 6 -> 3: an admin of either count finds what was written under 6 and under 3
    with Queue.from_url(url, name, cfg6) as q6:
        six = moved("six", 6, 3)
        q6.enqueue("ok", job_id=six, delay=3600)
    reshard(url, name, 3)
    aadmin = AsyncAdmin.from_url(url, cfg3)
    try:
        assert (await aadmin.job(name, six)).state == "scheduled"
        assert (await aadmin.job(name, sched)).state == "scheduled"  # (due now: not promoted)
        assert await aadmin.run_now(name, six) == "due now"
        got = await aadmin.find(name, id=six)
        assert [h.shard for h in got.items] == [shard_of(six, 6)]
    finally:
        await aadmin.close()
    c.close()


async def test_redrive_of_a_dead_letter_in_an_old_shard_of_a_reshard_down(url: str) -> None:
    """A job dead-lettered in shard 5 of 6, after a reshard to 3 (shard 5 still live while it
    drains), goes back into shard 5's stream, where workers still read it."""
    name = f"rd-{uuid.uuid4().hex[:10]}"
    ids = [moved(f"d{i}", 6, 3, to=5) for i in range(2)]
    with Queue.from_url(url, name, C6) as q6:
        for jid in ids:
            q6.enqueue("bad", job_id=jid)
        await run_until(url, name, C6, q6, *ids)
    lay = reshard(url, name, 3)
    assert lay.shards == 3 and lay.live == 6
    with closing(Admin.from_url(url, C3)) as a3:
        # an admin of the new count lists the old shards still live (Layout.read)
        assert {e.job_id for e in a3.dead(name).items} == set(ids)
        assert a3.stats(name).dead == 2
        entries = a3.dead(name, shard=5).items
        assert {e.job_id for e in entries} == set(ids) and {e.shard for e in entries} == {5}
        # one as listed (its shard named), one without (found by its record)
        assert a3.redrive(name, [entries[0], attrs.evolve(entries[1], shard=None)]) == {
            "redriven": 2}
        c = sync_client(url)
        try:
            assert c.xlen(Keys(name, shard=5).stream) == 2
            assert c.xlen(Keys(name, shard=5).dead) == 0
        finally:
            c.close()
        assert {a3.job(name, j).state for j in ids} == {"queued"}


async def test_workflow_calls_find_jobs_written_before_a_reshard(url: str) -> None:
    name = f"rw-{uuid.uuid4().hex[:10]}"
    old, fin, parent, other_q = moved("old"), moved("fin"), moved("par"), f"{name}-o"
    kid = moved("kid", 6, 3)
    other = moved("oth")
    c = sync_client(url)
    with Queue.from_url(url, name, C3) as q3, Queue.from_url(url, other_q, C3) as o3:
        q3.enqueue("ok", job_id=fin)
        await run_until(url, name, C3, q3, fin)
        q3.enqueue("ok", job_id=old)
        o3.enqueue("ok", job_id=other)
        q3.enqueue("ok", job_id=parent)
        start(c, Keys(name, shard=shard_of(parent, 3)), parent)
        bid = moved("bat")
        b3 = q3.batch(on_complete=JobSpec("ok"), batch_id=bid)
        b3.add([JobSpec("ok", job_id="b-1", delay=3600)])
    reshard(url, name, 6)
    reshard(url, other_q, 6)
    with Queue.from_url(url, name, C6) as q6, closing(Admin.from_url(url, C6)) as admin:
        # depends_on a completed old job: released at once with its result
        r = q6.enqueue("ok", job_id="w-fin", depends_on=[fin])
        assert r.status == "waiting"
        assert q6.get("w-fin").state == "queued"  # type: ignore[union-attr]
        _, deps = q6.dependency_results("w-fin")
        assert [(d.job_id, d.state, d.result) for d in deps] == [(fin, "completed",
                                                                  f"done {fin}")]
        # depends_on queued old jobs (this queue's and another's): waits for them
        q6.enqueue("ok", job_id="w-old", depends_on=[old, JobRef(other_q, other)])
        view = admin.flow(name, "w-old")
        assert view.state == "waiting"
        assert sorted((e.job_id, e.state) for e in view.blocked_by) == [(old, "queued"),
                                                                         (other, "queued")]
        assert [p.job_id for p in admin.flow(name, old).parents] == ["w-old"]
        # cancelling the waiting job cancels its old dependency no other job waits for
        assert q6.cancel("w-old").cancelled
        await eventually(lambda: q6.get(old).state == "cancelled",  # type: ignore[union-attr]
                         what="old dependency cancelled")
        # add_children to a running parent written before the reshard
        kids = q6.add_children(parent, [JobSpec("ok", job_id=kid)])
        assert [k.job_id for k in kids] == [kid]
        pv = admin.flow(name, parent)
        assert [(e.job_id, e.state) for e in pv.children] == [(kid, "queued")]
        # a batch opened before the reshard: add to it, close it
        b6 = q6.batch_ref(bid)
        b6.add([JobSpec("ok", job_id="b-2", delay=3600)])
        assert b6.close()
        view = admin.flow(name, b3.callbacks["on_complete"])
        assert view.state == "waiting"
        assert {(e.job_id, e.state) for e in view.blocked_by} >= {("b-1", "scheduled"),
                                                                  ("b-2", "scheduled")}
        # the repair sweep links an edge nobody linked (a producer that died after wait.lua)
        # in the shard of its dependency, written before the reshard
        p, _ = _prepared(q6.keys, C6, "ok", None, {"job_id": "w-rep"}, True)
        drive(c, one([wait_call(q6.keys, C6, p, [JobRef(name, fin)])]))
        assert q6.get("w-rep").state == "waiting"  # type: ignore[union-attr]
        drive(c, repair(q6.keys.of_shard(p.shard), 6, 0, {}))
        assert q6.get("w-rep").state == "queued"  # type: ignore[union-attr]
    # 6 -> 3: the flow view of a job written under 6 with a dependency written under 3
    reshard(url, name, 3)
    with Queue.from_url(url, name, C3) as q3:
        six = moved("six6", 6, 3)  # (written under 3, its home under 6 elsewhere)
        q3.enqueue("ok", job_id=six)
        q3.enqueue("ok", job_id="w-six", depends_on=[six, kid])
        with closing(Admin.from_url(url, C3)) as admin3:
            got = {(e.job_id, e.state) for e in admin3.flow(name, "w-six").children}
            assert got == {(six, "queued"), (kid, "queued")}
    c.close()


def test_lookup_reads_the_layout_again_only_on_a_miss(url: str) -> None:
    """A layout read before a reshard costs nothing while it finds records; a miss reads the
    stored layout once, and looks again only when it changed."""
    name = f"rm-{uuid.uuid4().hex[:10]}"
    with Queue.from_url(url, name, C3) as q3, Queue.from_url(url, name, C3) as other:
        q3.enqueue("ok", job_id="a")
        other.enqueue("ok", job_id="b")
        stale = q3.layout
        reshard(url, name, 6)
        jid, jid2 = moved("after"), moved("later")
        with Queue.from_url(url, name, C6) as q6:
            q6.enqueue("ok", job_id=jid)
            q6.enqueue("ok", job_id=jid2)
        # a queue object whose layout is from before the reshard cancels a job written after
        assert other.layout.shards == 3
        assert other.cancel(jid2).cancelled and other.layout.shards == 6
        op = lookup(q3.keys, stale, "a")
        steps = []
        try:
            reply: Any = None
            step = next(op)
            while True:
                steps.append(step)
                reply = [q3.client.execute_command(*c.args) for c in step]  # type: ignore[no-untyped-call]
                step = op.send(reply)
        except StopIteration as stop:
            k, rec, lay = stop.value
        assert len(steps) == 1 and rec is not None and lay == stale
        k, rec, lay = drive(q3.client, lookup(q3.keys, stale, jid))
        assert rec is not None and k.shard == shard_of(jid, 6) and lay.shards == 6
