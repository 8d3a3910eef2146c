"""Producers during a live reshard (docs/scaling.md#producers-during-a-reshard), on one server
and on the session's cluster: a producer opened before ``reshard.begin`` keeps enqueuing (one,
many, auto-batched from threads, asyncio) and its jobs land in their homes under the new
count; an id enqueued before the reshard answers 'duplicate' after it (3 -> 6 and 6 -> 3) and
no second record is written; a call refused by a frozen shard writes nothing while the other
calls of an enqueue_many keep their outcomes; a producer finishes a reshard whose driver died
after storing ``next``; a script-level enqueue routed by the old count gets LayoutChanged; a
process configured with the old count follows the stored layout."""

from __future__ import annotations

import asyncio
import threading
import uuid
from typing import Any

import pytest
import redis
from helpers import eventually

from streamq import (
    AsyncQueue,
    Dedup,
    EnqueueResult,
    JobSpec,
    Keys,
    LayoutChanged,
    Queue,
    QueueConfig,
    ReshardInProgress,
    chain,
    group,
)
from streamq._core import reshard
from streamq._core import shards as _shards
from streamq._core.cluster_server import ClusterServer
from streamq._core.conn import sync_client
from streamq._core.driver import drive
from streamq._core.keys import shard_keys, shard_of
from streamq._core.retry import layout_changed, transient
from streamq._core.scripts import SCRIPTS
from streamq._producer import prepare as prod

W = 3600
"""The reshard's retention window (s)."""


def fresh(cluster: ClusterServer | None, shards: int = 6) -> str:
    """A new queue name; on the cluster, one whose shards sit on every primary."""
    while True:
        name = f"rp-{uuid.uuid4().hex[:10]}"
        if cluster is None or len({cluster.owner(k.stream)
                                   for k in shard_keys(name, shards)}) == 3:
            return name


def moved(old: int, new: int, n: int, tag: str) -> list[str]:
    """``n`` ids whose home differs between ``old`` and ``new`` shards."""
    out: list[str] = []
    i = 0
    while len(out) < n:
        jid = f"{tag}{i}"
        i += 1
        if shard_of(jid, old) != shard_of(jid, new):
            out.append(jid)
    return out


def begin(client: Any, name: str, n: int) -> _shards.Layout:
    return drive(client, reshard.begin(Keys(name), n, W))


def at(client: Any, name: str, jid: str, shards: int) -> bool:
    """Whether job ``jid``'s record is in its home under ``shards``."""
    return bool(client.exists(Keys(name).for_job(jid, shards).job(jid)))


def test_producer_opened_before_a_reshard_follows_it(where: tuple[str, Any]) -> None:
    url, cluster = where
    name = fresh(cluster)
    admin = sync_client(url)
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        assert q.enqueue("t", job_id="warm").status == "queued"
        assert begin(admin, name, 6).shards == 6
        one = moved(3, 6, 4, "one-")
        for jid in one:  # lone enqueues: refused by the frozen shard, resent to the new home
            assert q.enqueue("t", {"i": jid}, job_id=jid).status == "queued"
        many = moved(3, 6, 20, "many-")
        got = q.enqueue_many([{"type": "t", "job_id": j} for j in many])
        assert [r.job_id for r in got] == many
        assert {r.status for r in got} == {"queued"}
        drawn = q.enqueue("t")  # a drawn id
        assert q.config.shards == 6 and q.layout.shards == 6 and q.layout.prev == (3,)
        for jid in [*one, *many, drawn.job_id]:
            assert at(admin, name, jid, 6), jid
        for jid in [*one, *many]:
            assert not at(admin, name, jid, 3), jid
        assert at(admin, name, "warm", 3)  # written before: stays where it was written
    admin.close()


def test_auto_batched_threads_follow_a_reshard(where: tuple[str, Any]) -> None:
    url, cluster = where
    name = fresh(cluster)
    admin = sync_client(url)
    ids = moved(3, 6, 40, "th-")
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("t", job_id="warm")
        begin(admin, name, 6)
        out: dict[str, EnqueueResult] = {}

        def run(part: list[str]) -> None:
            for jid in part:
                out[jid] = q.enqueue("t", job_id=jid)

        threads = [threading.Thread(target=run, args=(ids[i::4],)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert {out[j].status for j in ids} == {"queued"}
        assert all(at(admin, name, j, 6) for j in ids)
    admin.close()


def test_async_producer_follows_a_reshard(where: tuple[str, Any]) -> None:
    url, cluster = where
    name = fresh(cluster)
    admin = sync_client(url)
    ids = moved(3, 6, 12, "as-")

    async def main() -> list[EnqueueResult]:
        async with AsyncQueue.from_url(url, name, QueueConfig(shards=3)) as aq:
            await aq.enqueue("t", job_id="warm")
            begin(admin, name, 6)
            lone = await asyncio.gather(*(aq.enqueue("t", job_id=j) for j in ids[:6]))
            many = await aq.enqueue_many([{"type": "t", "job_id": j} for j in ids[6:]])
            assert aq.config.shards == 6
            return [*lone, *many]

    got = asyncio.run(main())
    assert [r.job_id for r in got] == ids
    assert {r.status for r in got} == {"queued"}
    assert all(at(admin, name, j, 6) for j in ids)
    admin.close()


@pytest.mark.parametrize(("old", "new"), [(3, 6), (6, 3)])
def test_an_id_enqueued_before_a_reshard_is_a_duplicate_after_it(
        where: tuple[str, Any], old: int, new: int) -> None:
    url, cluster = where
    name = fresh(cluster)
    admin = sync_client(url)
    ids = moved(old, new, 12, "d-")
    with Queue.from_url(url, name, QueueConfig(shards=old)) as before:
        assert {r.status for r in before.enqueue_many(
            [{"type": "t", "job_id": j, "payload": 1} for j in ids])} == {"queued"}
        begin(admin, name, new)
        # the producer opened before, and one opened after (configured with either count)
        with Queue.from_url(url, name, QueueConfig(shards=new)) as after:
            for q in (before, after):
                for jid in ids[:3]:
                    r = q.enqueue("t", 2, job_id=jid)
                    assert (r.status, r.state) == ("duplicate", "queued")
                got = q.enqueue_many([{"type": "t", "job_id": j, "payload": 2}
                                      for j in [*ids[3:], "new-one"]])
                assert [r.status for r in got[:-1]] == ["duplicate"] * (len(ids) - 3)
                assert got[-1].status in ("queued", "duplicate")
        for jid in ids:  # no second record in the new home
            assert at(admin, name, jid, old) and not at(admin, name, jid, new)
    admin.close()


def test_a_refused_call_writes_nothing_and_the_others_keep_their_outcomes(
        url: str, r: redis.Redis) -> None:
    """A reshard whose driver died after storing ``next`` and freezing one shard: a stale
    producer's calls to the other shards are written where they were routed, the frozen
    shard's call is refused (nothing written), the producer finishes the reshard and resends
    only the refused jobs to their new homes."""
    name = fresh(None)
    ids = [f"p-{i}" for i in range(30)]
    frozen = 1
    assert {shard_of(j, 3) for j in ids} == {0, 1, 2}
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("t", job_id="warm")
        keys = Keys(name)
        op = reshard.begin(keys, 6, W)  # drive the driver's steps by hand, then let it die
        step = next(op)  # HMGET the layout
        while True:
            replies = drive(r, _one(step))
            step = op.send(replies)
            if step and step[0].args[:1] == ("HSET",):  # the freeze: it dies before
                break
        op.close()
        assert r.hget(keys.of_shard(0).meta, "next") == b"6"
        r.hset(keys.of_shard(frozen).stats, "lay", 6)  # (the one shard it froze)
        stream_len = r.xlen(keys.of_shard(frozen).stream)
        got = q.enqueue_many([{"type": "t", "job_id": j} for j in ids])
        assert [g.job_id for g in got] == ids
        assert {g.status for g in got} == {"queued"}
        for jid in ids:
            if shard_of(jid, 3) == frozen:  # refused under 3: written in its home under 6
                assert at(r, name, jid, 6)
                assert shard_of(jid, 6) == frozen or not at(r, name, jid, 3)
            else:  # accepted where it was routed, before the freeze
                assert at(r, name, jid, 3)
        lay = drive(r, _shards.read(keys))
        assert lay is not None and (lay.shards, lay.next, lay.epoch) == (6, None, 1)
        assert r.xlen(keys.of_shard(frozen).stream) == stream_len + sum(
            1 for j in ids if shard_of(j, 3) == frozen and shard_of(j, 6) == frozen)


def _one(step: list[Any]) -> Any:
    replies = yield step
    return replies


def frozen_not_published(client: Any, name: str, n: int) -> None:
    """A reshard to ``n`` whose driver died after freezing every shard, before publishing."""
    op = reshard.begin(Keys(name), n, W)
    step = next(op)  # HMGET the layout
    for _ in range(3):  # HSETNX next, the freeze, then it dies before TIME and the publish
        step = op.send(drive(client, _one(step)))
    op.close()
    lay = drive(client, _shards.read(Keys(name)))
    assert lay is not None and lay.next == n and lay.shards != n


def test_an_id_sent_again_with_its_own_body_into_a_frozen_shard_is_a_duplicate(
        where: tuple[str, Any]) -> None:
    """An id an earlier call wrote, sent again with the very same body by a producer whose
    call the reshard's freeze refuses, answers 'duplicate' whether its home moved or not: the
    refused call wrote nothing, so its resend is no retry (found by the cluster chaos run's
    --reshard: such ids answered 'queued', as a retry that finds its own job does)."""
    url, cluster = where
    name = fresh(cluster)
    admin = sync_client(url)
    stay = [j for j in (f"s-{i}" for i in range(100)) if shard_of(j, 3) == shard_of(j, 6)]
    ids = [*moved(3, 6, 4, "m-"), *stay[:4]]
    specs = [{"type": "t", "job_id": j, "payload": {"n": 1}} for j in ids]
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        assert {g.status for g in q.enqueue_many(specs)} == {"queued"}
        frozen_not_published(admin, name, 6)
        got = q.enqueue_many(specs)  # refused, the reshard finished, sent again
        assert q.layout.shards == 6
        assert [(g.job_id, g.status) for g in got] == [(j, "duplicate") for j in ids]
        frozen_not_published(admin, name, 3)
        for jid in (ids[0], stay[0]):  # lone calls, now routed by 6: refused again
            assert q.enqueue("t", {"n": 1}, job_id=jid).status == "duplicate"
        assert q.layout.shards == 3
        for jid in ids:  # one record each, where the first call wrote it
            assert at(admin, name, jid, 3)
            assert shard_of(jid, 3) == shard_of(jid, 6) or not at(admin, name, jid, 6)
    admin.close()


def test_a_lone_enqueue_finishes_a_reshard_whose_driver_died(url: str, r: redis.Redis) -> None:
    name = fresh(None)
    keys = Keys(name)
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("t", job_id="warm")
        op = reshard.begin(keys, 6, W)
        step = next(op)
        step = op.send(drive(r, _one(step)))  # HSETNX next
        op.send(drive(r, _one(step)))
        op.close()  # died after storing next, before freezing anything
        assert r.hget(keys.of_shard(0).meta, "next") == b"6"
        jid = moved(3, 6, 1, "lone-")[0]
        # routed by 3 into an unfrozen shard: accepted there (the reshard has not frozen it)
        assert q.enqueue("t", job_id=jid).status == "queued"
        assert at(r, name, jid, 3)
        with pytest.raises(ReshardInProgress):
            drive(r, reshard.begin(keys, 9, W))
    # a producer whose first call meets a frozen shard finishes it
    r.hset(keys.of_shard(shard_of("x-1", 3)).stats, "lay", 6)
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q2:
        assert q2.enqueue("t", job_id="x-1").status == "queued"
        assert q2.layout.shards == 6 and q2.layout.next is None
        assert at(r, name, "x-1", 6)
        assert q2.enqueue("t", job_id=jid).status == "duplicate"  # found in its old home


def test_a_script_level_enqueue_routed_by_the_old_count_gets_layout_changed(
        where: tuple[str, Any]) -> None:
    url, cluster = where
    name = fresh(cluster)
    client = sync_client(url)
    keys = Keys(name)
    cfg = QueueConfig(shards=3)
    with Queue.from_url(url, name, cfg) as q:
        q.enqueue("t", job_id="warm")
    begin(client, name, 6)
    jid = moved(3, 6, 1, "s-")[0]
    p = prod.prepare(keys, cfg, "t", None, job_id=jid)
    k, a = prod.enqueue_call(keys, cfg, [p])
    with pytest.raises(Exception) as caught:
        SCRIPTS["enqueue"](client, k, a)
    lc = layout_changed(caught.value, name)
    assert isinstance(lc, LayoutChanged) and (lc.queue, lc.shards) == (name, 6)
    assert not transient(caught.value)
    assert not at(client, name, jid, 3) and not at(client, name, jid, 6)
    # routed by the new count, the same call is accepted
    cfg6 = QueueConfig(shards=6)
    p6 = prod.prepare(keys, cfg6, "t", None, job_id=jid)
    assert SCRIPTS["enqueue"](client, *prod.enqueue_call(keys, cfg6, [p6])) == [b"queued"]
    client.close()


def test_a_process_configured_with_the_old_count_follows_the_stored_layout(
        where: tuple[str, Any]) -> None:
    url, cluster = where
    name = fresh(cluster)
    admin = sync_client(url)
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("t", job_id="warm")
    begin(admin, name, 6)
    ids = moved(3, 6, 6, "f-")
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        assert {q.enqueue("t", job_id=j).status for j in ids} == {"queued"}
        assert q.config.shards == 6
    assert all(at(admin, name, j, 6) for j in ids)
    admin.close()


def test_a_batch_opened_before_a_reshard_keeps_working(where: tuple[str, Any]) -> None:
    url, cluster = where
    name = fresh(cluster)
    admin = sync_client(url)
    bid = moved(3, 6, 1, "batch-")[0]
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        b = q.batch(on_complete=JobSpec("done"), batch_id=bid)
        assert {r.status for r in b.add([JobSpec("t"), JobSpec("t")]).results} == {"queued"}
        begin(admin, name, 6)
        with Queue.from_url(url, name, QueueConfig(shards=6)) as q6:
            for qq in (q6, q):  # one opened after (by the new count), the one opened before
                ref = qq.batch_ref(bid)
                try:
                    added = ref.add([JobSpec("t", job_id=f"{qq.config.shards}-{bid}")])
                except LayoutChanged:  # (the stale one: its first call re-read the layout)
                    added = ref.add([JobSpec("t", job_id=f"{qq.config.shards}-{bid}")])
                assert [r.status for r in added.results] == ["queued"]
                # opened again with the same id: nothing new, the same callbacks
                again = qq.batch(on_complete=JobSpec("done"), batch_id=bid)
                assert again.callbacks == b.callbacks
            assert q6.batch_ref(bid).close() is True
            assert q.batch_ref(bid).close() is False
        for cid in b.callbacks.values():  # the callback stays in the batch's shard
            assert at(admin, name, cid, 3)
            assert shard_of(cid, 6) == shard_of(cid, 3) or not at(admin, name, cid, 6)
    admin.close()


def test_a_workflow_call_refused_by_a_frozen_shard_raises_layout_changed(
        where: tuple[str, Any]) -> None:
    url, cluster = where
    name = fresh(cluster)
    admin = sync_client(url)
    dep = next(j for j in (f"dep-{i}" for i in range(100)) if shard_of(j, 3) == shard_of(j, 6))
    jid = moved(3, 6, 1, "child-")[0]
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("t", job_id=dep)
        begin(admin, name, 6)
        with pytest.raises(LayoutChanged) as caught:
            q.enqueue("t", job_id=jid, depends_on=[dep])
        assert caught.value.shards == 6 and q.config.shards == 6
        assert not at(admin, name, jid, 3) and not at(admin, name, jid, 6)
        r = q.enqueue("t", job_id=jid, depends_on=[dep])  # a repeat routes by the new count
        assert r.status == "waiting" and at(admin, name, jid, 6)
    admin.close()


async def test_a_cron_tick_follows_the_layout_and_is_not_fired_twice(url: str,
                                                                     r: redis.Redis) -> None:
    from schedulers import Cron, Scheduler, SchedulerConfig

    name = fresh(None)
    keys = Keys(name)
    now = int(r.time()[0]) * 1000
    long_ago = now - 10 * 365 * 86400_000

    def entry(tag: str) -> Cron:  # a yearly entry whose latest tick's job id moves 3 -> 6
        for i in range(1000):
            e = Cron(f"{tag}{i}", "0 0 1 1 *", job_type="report", queue=name)
            tick = e.latest_at_or_before(now)
            assert tick is not None
            if shard_of(e.job_id(tick), 3) != shard_of(e.job_id(tick), 6):
                return e
        raise AssertionError("no entry")

    fired, new = entry("before"), entry("after")
    tick = fired.latest_at_or_before(now)
    assert tick is not None
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        # the tick fired under 3 shards (its job in its old home), the marker not mirrored yet
        q.enqueue("report", job_id=fired.job_id(tick))
    r.hset(keys.cron, mapping={f"{fired.name}:last": long_ago, f"{new.name}:last": long_ago})
    begin(r, name, 6)
    cfg = SchedulerConfig(poll_interval_s=30.0, sweep_interval_s=0.1)
    async with Scheduler(url, [name], [fired, new], cfg, queue_config=QueueConfig(shards=3)):
        await eventually(lambda: r.hget(keys.cron, f"{fired.name}:last") == str(tick).encode()
                         and at(r, name, new.job_id(tick), 6), what="both ticks handled")
    assert not at(r, name, fired.job_id(tick), 6)  # found in its old home: not fired again
    assert not at(r, name, new.job_id(tick), 3)


def test_a_dedup_job_is_kept_in_its_keys_shard_across_a_reshard(url: str, r: redis.Redis
                                                                 ) -> None:
    name = fresh(None)
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("t", job_id="warm")
        begin(r, name, 6)
        got = q.enqueue("t", dedup=Dedup(key="k-1", mode="throttle", ttl_s=60))
        assert got.status == "queued"
        assert shard_of(got.job_id, 6) == shard_of("k-1", 6) and at(r, name, got.job_id, 6)
        again = q.enqueue("t", dedup=Dedup(key="k-1", mode="throttle", ttl_s=60))
        assert (again.status, again.job_id) == ("deduplicated", got.job_id)


def test_a_flow_repeated_after_a_reshard_writes_no_node_twice(where: tuple[str, Any]) -> None:
    url, cluster = where
    name = fresh(cluster)
    admin = sync_client(url)
    flow = chain(JobSpec("a"), group([JobSpec("b"), JobSpec("c"), JobSpec("d")]), JobSpec("e"))
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        first = q.enqueue_flow(flow, flow_id="f-1")
        wid = moved(3, 6, 1, "w-")[0]
        assert q.enqueue("t", job_id=wid, depends_on=[first.job_ids[0]]).status == "waiting"
        ids = [ref.job_id for ref in first.refs]
        assert any(shard_of(j, 3) != shard_of(j, 6) for j in ids)
        begin(admin, name, 6)
        with Queue.from_url(url, name, QueueConfig(shards=6)) as q6:
            for qq in (q6, q):
                try:
                    again = qq.enqueue_flow(flow, flow_id="f-1")
                except LayoutChanged:  # (the stale one's first call)
                    again = qq.enqueue_flow(flow, flow_id="f-1")
                assert [ref.job_id for ref in again.refs] == ids
                assert {r.status for r in again.results} <= {"duplicate", "queued"}
                r = qq.enqueue("t", job_id=wid, depends_on=[first.job_ids[0]])
                assert (r.status, r.state) == ("duplicate", "waiting")
        for jid in [*ids, wid]:  # every node once, where it was written
            assert at(admin, name, jid, 3)
            assert shard_of(jid, 6) == shard_of(jid, 3) or not at(admin, name, jid, 6), jid
    admin.close()


def test_a_spark_partition_routes_by_the_layout_and_counts_stay_exact(
        where: tuple[str, Any]) -> None:
    """Spark's executor task (driven with Arrow batches, as mapInArrow would): a partition
    that starts after a reshard routes by the new count, an id written before it counts as a
    duplicate (or as written, when this very row wrote it: a retried task) and no id is
    written twice."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    import pyarrow as pa

    from streamq.spark._enqueue import EnqueueTask

    url, cluster = where
    name = fresh(cluster)
    admin = sync_client(url)
    cfg = QueueConfig(shards=3)
    old = moved(3, 6, 30, "sp-")
    new = moved(3, 6, 20, "sp-new-")

    def task(run: str, ids: list[str]) -> dict[str, int]:
        t = EnqueueTask(url, False, name, cfg, "ok", "value", ("n",), False, 7, 0, True, run)
        [out] = list(t([pa.RecordBatch.from_pydict({"id": ids, "n": list(range(len(ids)))})]))
        return dict(zip(out.column(0).to_pylist(), out.column(1).to_pylist(), strict=True))

    assert task("run1", old) == {"enqueued": 30}
    begin(admin, name, 6)
    assert task("run1", old) == {"enqueued": 30}  # the same rows again (a retried task)
    assert task("run2", [*old, *new]) == {"enqueued": 20, "duplicates": 30}
    for jid in old:
        assert at(admin, name, jid, 3) and not at(admin, name, jid, 6)
    assert all(at(admin, name, jid, 6) for jid in new)
    admin.close()


def test_a_stale_producer_opens_a_new_batch_in_its_home_under_the_new_count(
        url: str, r: redis.Redis) -> None:
    name = fresh(None)
    bid = moved(3, 6, 1, "nb-")[0]
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("t", job_id="warm")
        begin(r, name, 6)
        with pytest.raises(LayoutChanged):  # refused before anything is written
            q.batch(on_complete=JobSpec("done"), batch_id=bid)
        assert not at(r, name, bid, 3)
        b = q.batch(on_complete=JobSpec("done"), batch_id=bid)  # the repeat follows
        assert at(r, name, bid, 6)
        assert all(shard_of(c, 6) == shard_of(bid, 6) for c in b.callbacks.values())
        assert [x.status for x in b.add([JobSpec("t")]).results] == ["queued"]
        assert b.close() is True


def test_a_producer_drops_the_old_homes_once_the_layout_forgot_them(
        url: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamq._producer import relayout

    name = fresh(None)
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("t", job_id="warm")
        begin(r, name, 6)
        q.enqueue("t")
        assert q.layout.prev == (3,)
        monkeypatch.setattr(relayout, "REREAD_S", 0.0)
        r.hdel(Keys(name).of_shard(0).meta, "prev")  # (what happens once prev_until passed)
        q.enqueue("t")
        assert not q.layout.prev and q.layout.shards == 6


def test_refusals_are_bounded_then_layout_changed_names_only_the_refused_jobs(
        url: str, r: redis.Redis) -> None:
    """A shard that keeps refusing (frozen for a count no layout publishes: a stand-in for
    reshards back to back): after relayout.ATTEMPTS rounds its jobs get LayoutChanged, the
    other shards' jobs are written, nothing is written for the refused ones."""
    from streamq import PartialEnqueueError

    name = fresh(None)
    ids = [f"b-{i}" for i in range(30)]
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("t", job_id="warm")
        r.hset(Keys(name).of_shard(1).stats, "lay", 9)
        with pytest.raises(PartialEnqueueError) as caught:
            q.enqueue_many([{"type": "t", "job_id": j} for j in ids])
        res = caught.value.results
        assert [x.job_id for x in res] == ids
        for jid, x in zip(ids, res, strict=True):
            if shard_of(jid, 3) == 1:
                assert x.status == "error" and isinstance(x.exception, LayoutChanged)
                assert x.exception.shards == 9 and not at(r, name, jid, 3)
            else:
                assert x.status == "queued" and at(r, name, jid, 3)
        lone = next(j for j in (f"l-{i}" for i in range(50)) if shard_of(j, 3) == 1)
        with pytest.raises(LayoutChanged):
            q.enqueue("t", job_id=lone)
        assert not at(r, name, lone, 3)
