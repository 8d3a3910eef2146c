"""Sharded queues (QueueConfig.shards): N complete key sets under the hash tags {Q}, {Q#1},
..., a job in shard crc32(id) % N. On one server and on the session's 3-primary cluster:
N = 1 keeps today's keys; N = 3 and 16 enqueue (one, many, and wait), dedup across shards,
drain every shard, promote delayed jobs of every shard from the scheduler, aggregate and
re-drive dead letters, pause every shard, aggregate stats and drill into one shard; a
shard count that disagrees with the stored one is refused (producer, worker, scheduler,
admin) with ShardCountMismatch."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import subprocess
import sys
import urllib.parse
import uuid
import zlib
from typing import Any

import pytest
from helpers import eventually, fast

from schedulers import Cron, Scheduler, SchedulerConfig
from streamq import (
    AsyncQueue,
    Fail,
    InvalidArgument,
    Job,
    Keys,
    Queue,
    QueueConfig,
    Registry,
    ShardCountMismatch,
    Worker,
)
from streamq._core.cluster_server import ClusterServer
from streamq._core.conn import sync_client
from streamq._core.driver import _send, drive
from streamq._core.keys import MAX_SHARDS, shard_keys, shard_of
from streamq._core.shards import LAYOUT_FIELDS
from streamq._core.shards import check as check_shards
from streamq.admin import Admin


def fresh(cluster: ClusterServer | None, shards: int) -> str:
    """A new queue name; on the cluster, one whose shards sit on every primary."""
    while True:
        name = f"sh-{uuid.uuid4().hex[:10]}"
        if cluster is None or len({cluster.owner(k.stream)
                                   for k in shard_keys(name, shards)}) == min(shards, 3):
            return name


def registry(seen: list[str]) -> Registry:
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> str:
        seen.append(job.id)
        return f"done {job.id}"

    @reg.handler("bad")
    async def bad(job: Job) -> None:
        raise Fail("bad")

    return reg


def ids_in_every_shard(shards: int, per_shard: int, tag: str) -> list[str]:
    """Job ids that fill every shard with ``per_shard`` jobs."""
    out: list[str] = []
    count = dict.fromkeys(range(shards), 0)
    i = 0
    while min(count.values()) < per_shard:
        jid = f"{tag}-{i}"
        i += 1
        s = shard_of(jid, shards)
        if count[s] < per_shard:
            count[s] += 1
            out.append(jid)
    return out


def test_the_shard_hash_is_crc32_of_the_utf8_id() -> None:
    """The documented, fixed routing (docs/scaling.md#sharded-queues): any client in any
    language finds a job by computing the same number."""
    for jid in ("abc", "job-1", "cron:x:1", "é-ü"):
        for n in (1, 3, 16, MAX_SHARDS):
            assert shard_of(jid, n) == zlib.crc32(jid.encode("utf-8")) % n
    assert (shard_of("abc", 3), shard_of("job-1", 16)) == (0, 15)
    assert Keys("q", shard=0).job("a") == "streamq:{q}:job:a"
    assert Keys("q", shard=7).stream == "streamq:{q#7}:stream"
    assert Keys("q").meta == Keys("q", shard=5).meta == "streamq:{q}:meta"
    for bad in (0, MAX_SHARDS + 1, True, "3"):
        with pytest.raises(InvalidArgument, match=r"shards must be an integer 1\.\.256"):
            QueueConfig(shards=bad)  # type: ignore[arg-type]


def test_one_shard_keeps_todays_keys(where: tuple[str, ClusterServer | None]) -> None:
    url, cluster = where
    name = fresh(cluster, 1)
    with Queue.from_url(url, name) as q:
        jid = q.enqueue("ok", {"n": 1}, job_id="j1").job_id
        q.enqueue("ok", job_id="later", delay=3600)
        client: Any = q.client
        found = sorted(k.decode() for k in client.scan_iter(match=f"streamq:{{{name}*",
                                                            count=1000))
    assert found == sorted([f"streamq:{{{name}}}:{s}" for s in ("stream", "delayed", "stats")]
                           + [f"streamq:{{{name}}}:job:{j}" for j in (jid, "later")])


@pytest.mark.parametrize("shards", [3, 16])
async def test_a_sharded_queue_end_to_end(where: tuple[str, ClusterServer | None],
                                          shards: int) -> None:
    url, cluster = where
    name = fresh(cluster, shards)
    cfg = QueueConfig(shards=shards)
    ids = ids_in_every_shard(shards, 2, "m")
    q = Queue.from_url(url, name, cfg)
    client: Any = q.client
    admin = Admin.from_url(url, cfg)
    try:
        # enqueue_many splits by shard and answers in the caller's order
        got = q.enqueue_many([{"type": "ok", "job_id": j} for j in ids])
        assert [(r.job_id, r.status) for r in got] == [(j, "queued") for j in ids]
        for j in ids:
            assert client.exists(Keys(name, shard=shard_of(j, shards)).job(j))
        # dedup stays exact across shards: the same id again is a duplicate, one by one or
        # in bulk, and a bulk call with an id twice accepts it once
        assert q.enqueue("ok", job_id=ids[-1]).status == "duplicate"
        again = q.enqueue_many([{"type": "ok", "job_id": j} for j in [*ids[:3], "new", "new"]])
        assert [r.status for r in again] == ["duplicate"] * 3 + ["queued", "duplicate"]
        ids.append("new")
        st = admin.stats(name)
        assert st.ready == len(ids)
        per = [admin.stats(name, shard=i) for i in range(shards)]
        assert sum(s.ready for s in per) == len(ids) and all(s.ready >= 2 for s in per)
        assert sum(s.counters.get("duplicates", 0) for s in per) == 5
        if cluster is not None:  # the shards really are spread over the primaries
            assert len({cluster.owner(k.stream) for k in shard_keys(name, shards)}) == 3
            slots = {client.cluster_keyslot(k.stream) for k in shard_keys(name, shards)}
            assert len(slots) == shards

        # a worker drains every shard; records read back by id from any shard
        seen: list[str] = []
        async with Worker(url, [name], registry(seen), fast(promote=False), cfg):
            await eventually(lambda: len(seen) == len(ids), 30, "every shard drained")
            aq = AsyncQueue.from_url(url, name, cfg)
            try:
                waited = [await aq.enqueue_and_wait("ok", job_id=j, timeout=20)
                          for j in ids_in_every_shard(shards, 1, "w")]
                assert len(waited) == shards and all(w.startswith("done w-") for w in waited)
            finally:
                await aq.close()
            assert await asyncio.to_thread(  # blocking: off the worker's event loop
                q.enqueue_and_wait, "ok", job_id="sync-wait", timeout=20) == "done sync-wait"
        assert sorted(seen) == sorted([*ids, *ids_in_every_shard(shards, 1, "w"),
                                       "sync-wait"])
        assert all(q.get(j).state == "completed" for j in ids)  # type: ignore[union-attr]
        assert admin.job(name, ids[0]).state == "completed"
        assert admin.stats(name).counters["completed"] == len(seen)

        # dead letters of every shard: listed together (page by page), re-driven by id
        bad = ids_in_every_shard(shards, 1, "bad")
        q.enqueue_many([{"type": "bad", "job_id": j} for j in bad])
        async with Worker(url, [name], registry(seen), fast(promote=False), cfg):
            await eventually(lambda: admin.stats(name).dead == len(bad), 30, "dead letters")
        listed: list[str] = []
        cursor: str | None = None
        while True:
            page = admin.dead(name, limit=2, cursor=cursor)
            listed += [e.job_id for e in page.items]
            if page.cursor is None:
                break
            cursor = page.cursor
        assert sorted(listed) == sorted(bad)
        assert [e.job_id for e in admin.dead(name, shard=shard_of(bad[0], shards)).items] == [
            bad[0]]
        assert admin.redrive_matching(name) == {"redriven": len(bad)}
        st = admin.stats(name)
        assert (st.dead, st.ready) == (0, len(bad))
        assert admin.purge(name, "queued") == len(bad) and admin.stats(name).ready == 0
    finally:
        q.close()
        admin.close()


@pytest.mark.parametrize("shards", [3, 16])
async def test_scheduler_and_pause_cover_every_shard(where: tuple[str, ClusterServer | None],
                                                     shards: int) -> None:
    url, cluster = where
    name = fresh(cluster, shards)
    cfg = QueueConfig(shards=shards)
    admin = Admin.from_url(url, cfg)
    q = Queue.from_url(url, name, cfg)
    try:
        # delayed jobs in every shard, promoted by a scheduler (no worker promotes)
        later = ids_in_every_shard(shards, 1, "d")
        q.enqueue_many([{"type": "ok", "job_id": j, "delay": 0.2} for j in later])
        assert admin.stats(name).scheduled == len(later)
        sched_cfg = SchedulerConfig(poll_interval_s=0.1, sweep_interval_s=0.1)
        every_second = Cron("tick", every=1, job_type="ok", queue=name)

        def fired() -> list[str]:
            return [r.job_id for r in admin.ready(name, limit=1000).items
                    if r.job_id.startswith("cron:")]

        async with Scheduler(url, [name], [every_second], sched_cfg, cfg) as s:
            await eventually(lambda: admin.stats(name).scheduled == 0, 20,
                             "delayed jobs of every shard promoted")
            # cron ticks land in their job id's shard (one beyond shard 0 at least)
            await eventually(lambda: any(shard_of(j, shards) for j in fired()), 30,
                             "a cron tick fired into a shard other than 0")
            # shard 0's cron hash learns a tick fired elsewhere just after it (_mirror_cron)
            await eventually(lambda: admin.cron(name)[0].last_job in fired(), 10,
                             "the last tick mirrored to shard 0")
        st = admin.stats(name)
        assert st.scheduled == 0 and st.ready == len(later) + len(fired())
        # every tick is counted, but one whose fire.lua reply the stop cut off
        assert len(fired()) - 1 <= s.fired <= len(fired())
        assert all(q.get(j) is not None for j in fired())  # found by id: the right shard
        [info] = admin.cron(name)
        assert info.name == "tick" and info.last_job in fired()

        # pause stops every shard: each shard's flag is set and every fetch loop sees it
        admin.pause(name)
        assert all(q.client.exists(k.paused) for k in shard_keys(name, shards))
        assert admin.stats(name).paused
        seen: list[str] = []
        w = Worker(url, [name], registry(seen), fast(promote=False), cfg)
        async with w:
            await eventually(lambda: all(s.paused for s in w._qs.values()), 10,
                             "every shard's fetch loop paused")
            assert len(w._qs) == shards and seen == []
            admin.resume(name)
            await eventually(lambda: len(seen) == st.ready, 30, "drained after resume")
    finally:
        q.close()
        admin.close()


def test_a_shard_count_that_disagrees_is_refused(where: tuple[str, ClusterServer | None]
                                                  ) -> None:
    url, cluster = where
    name = fresh(cluster, 3)
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("ok", job_id="a")
        assert q.client.hget(Keys(name).meta, "shards") == b"3"
    for n in (1, 4):
        with Queue.from_url(url, name, QueueConfig(shards=n)) as other:
            with pytest.raises(ShardCountMismatch, match=f"stored with shards=3, but this"
                               f" object was configured with shards={n}") as exc:
                other.enqueue("ok", job_id="b")
            assert (exc.value.stored, exc.value.configured) == (3, n)
            with pytest.raises(ShardCountMismatch):
                other.get("a")
    admin = Admin.from_url(url, QueueConfig(shards=2))
    try:
        with pytest.raises(ShardCountMismatch, match="QueueConfig\\(shards=3\\)"):
            admin.stats(name)
    finally:
        admin.close()
    worker = Worker(url, [name], registry([]), fast(), QueueConfig(shards=1))
    with pytest.raises(ShardCountMismatch):
        asyncio.run(worker.start())
    assert not worker.running
    sched = Scheduler(url, [name], queue_config=QueueConfig(shards=5))
    with pytest.raises(ShardCountMismatch):
        asyncio.run(sched.start())

    # a queue used before sharding (keys, no stored count) has 1 shard
    legacy = fresh(cluster, 1)
    with Queue.from_url(url, legacy) as q:
        q.enqueue("ok", job_id="old")
        assert q.client.hget(Keys(legacy).meta, "shards") is None
    with Queue.from_url(url, legacy, QueueConfig(shards=3)) as q:
        with pytest.raises(ShardCountMismatch, match="stored with shards=1"):
            q.enqueue("ok", job_id="new")
        assert sync_client(url).exists(Keys(legacy, shard=1).stream) == 0
    with Queue.from_url(url, legacy, QueueConfig(shards=1)) as q:
        assert q.enqueue("ok", job_id="old").status == "duplicate"


def test_two_first_users_of_a_sharded_queue_agree(url: str) -> None:
    """Two workers start together on a fresh queue with shards=3: one reads no stored count,
    the other stores it and creates its keys, then the first finds keys. It must read the count
    again (3: agreed), not take the queue for one used before sharding (ShardCountMismatch
    stored=1: the chaos run's cluster mode saw a worker exit on it at start-up)."""
    client = sync_client(url)
    name = f"race-{uuid.uuid4().hex[:8]}"
    keys = Keys(name)
    slow = check_shards(keys, 3)
    step = next(slow)  # the slow starter's first read: no count stored yet
    empty = [[None] * len(LAYOUT_FIELDS)]  # (one HMGET of the layout's fields)
    assert _send(client, step) == empty
    assert drive(client, check_shards(keys, 3)) == 3  # the other one stores 3 ...
    client.xgroup_create(keys.stream, "g", id="0", mkstream=True)  # ... and creates its keys
    try:
        step = slow.send(empty)
        while True:
            step = slow.send(_send(client, step))
    except StopIteration as done:
        assert done.value == 3
    # a queue with keys and truly no count is still the unsharded layout
    legacy = Keys(f"legacy-{uuid.uuid4().hex[:8]}")
    client.xgroup_create(legacy.stream, "g", id="0", mkstream=True)
    with pytest.raises(ShardCountMismatch, match="stored with shards=1"):
        drive(client, check_shards(legacy, 3))
    client.close()


def test_due_and_run_at_route_like_any_job(where: tuple[str, ClusterServer | None]) -> None:
    """run_at and cancel by id find the job's shard."""
    url, cluster = where
    name = fresh(cluster, 3)
    cfg = QueueConfig(shards=3)
    with Queue.from_url(url, name, cfg) as q:
        at = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
        jobs = ids_in_every_shard(3, 1, "c")
        for j in jobs:
            assert q.enqueue("ok", job_id=j, run_at=at).status == "scheduled"
        assert all(q.cancel(j).cancelled for j in jobs)
        assert all(q.get(j).state == "cancelled" for j in jobs)  # type: ignore[union-attr]


def _cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("STREAMQ_URL", "STREAMQ_SHARDS")}
    return subprocess.run([sys.executable, "-m", "streamq", *args, "--url", url], env=env,
                          capture_output=True, text=True, timeout=60)


def test_cli_covers_every_shard_and_drills_into_one(url: str) -> None:
    name = fresh(None, 3)
    ids = ids_in_every_shard(3, 2, "x")
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue_many([{"type": "ok", "job_id": j} for j in ids])
    whole = _cli(url, "stats", name, "--shards", "3", "--json")
    assert whole.returncode == 0, whole.stderr
    assert json.loads(whole.stdout)[0]["ready"] == len(ids)
    one = _cli(url, "stats", name, "--shards", "3", "--shard", "2", "--json")
    assert json.loads(one.stdout)[0]["ready"] == 2
    assert _cli(url, "job", name, ids[-1], "--shards", "3").returncode == 0
    wrong = _cli(url, "stats", name, "--json")
    assert wrong.returncode != 0
    assert "stored with shards=3, but this object was configured with shards=1" in (
        wrong.stdout + wrong.stderr)
    purged = _cli(url, "purge", name, "--state", "queued", "--shards", "3", "--yes")
    assert purged.returncode == 0 and f"purged {len(ids)} queued jobs" in purged.stdout


def test_testing_helpers_cover_every_shard(url: str) -> None:
    """run_until_idle waits on, and reports, every shard; fast_forward moves every shard's
    delayed jobs."""
    from streamq.testing import fast_forward, run_until_idle

    name = fresh(None, 3)
    cfg = QueueConfig(shards=3)
    seen: list[str] = []
    with Queue.from_url(url, name, cfg) as q:
        later = ids_in_every_shard(3, 1, "ff")
        q.enqueue_many([{"type": "ok", "job_id": j, "delay": 3600} for j in later])
        assert fast_forward(q) == len(later)
        done = run_until_idle(Worker(url, [name], registry(seen), fast(), cfg))
    assert sorted(i.id for i in done) == sorted(later) == sorted(seen)


async def test_dashboard_lists_every_shard(url: str) -> None:
    """The dashboard reads through the admin API: its tabs list the jobs of every shard,
    and a page's cursor ('<shard>:<entry id>') leads to the next page."""
    import httpx

    from streamq.dashboard import DashboardConfig, create_app

    name = fresh(None, 3)
    cfg = QueueConfig(shards=3)
    ready = ids_in_every_shard(3, 2, "r")
    with Queue.from_url(url, name, cfg) as q:
        q.enqueue_many([{"type": "ok", "job_id": j} for j in ready])
        q.enqueue_many([{"type": "bad", "job_id": j} for j in ids_in_every_shard(3, 1, "b")])
    seen: list[str] = []
    async with Worker(url, [name], registry(seen), fast(promote=False), cfg) as w:
        await eventually(lambda: len(seen) == len(ready) and Admin.from_url(url, cfg).stats(
            name).dead == 3, 30, "jobs done and dead")
        await w.stop()
    with Queue.from_url(url, name, cfg) as q:
        fresh_ids = ids_in_every_shard(3, 2, "n")  # ready in every shard
        q.enqueue_many([{"type": "ok", "job_id": j} for j in fresh_ids])
    app = create_app(url, config=DashboardConfig(queues=(name,), page_size=2,
                                                 queue_config=cfg))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as c:
        dead = await c.get("/queue", params={"q": name, "tab": "dead"})
        assert dead.status_code == 200
        assert len(set(re.findall(r'id=(b-\d+)"', dead.text))) == 2  # a page of 2
        listed: list[str] = []
        cursor: str | None = None
        for _ in range(10):  # page by page (2 a page) over the three shards
            params = {"q": name, "tab": "ready", **({"cursor": cursor} if cursor else {})}
            page = await c.get("/queue", params=params)
            assert page.status_code == 200, page.text
            listed += re.findall(r'id=(n-\d+)"', page.text)
            more = {urllib.parse.unquote(m) for m in re.findall(r"cursor=([^\"&]+)", page.text)
                    } - {cursor}  # other links keep the page's own cursor
            if not more:
                break
            [cursor] = more
            assert re.fullmatch(r"[0-2]:(\d+-\d+)?", cursor)
        assert sorted(listed) == sorted(fresh_ids)


def test_forget_counts_the_jobs_of_every_shard(url: str) -> None:
    name = fresh(None, 3)
    [jid] = [j for j in ids_in_every_shard(3, 1, "f") if shard_of(j, 3) != 0][:1]
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("ok", job_id=jid)  # shard 0 has no job
    refused = _cli(url, "queues", "forget", name, "--shards", "3")
    assert refused.returncode != 0 and "still has 1 jobs over its 3 shards" in (
        refused.stdout + refused.stderr)
    assert _cli(url, "queues", "forget", name, "--shards", "3", "--force").returncode == 0


def test_spark_bulk_enqueue_fills_every_shard(where: tuple[str, ClusterServer | None]) -> None:
    """Spark's executor task (driven here with Arrow batches, as mapInArrow would) keeps one
    batch per shard: every job lands in its id's shard, and the counts stay exact."""
    pytest.importorskip("pyspark", reason="the spark extra is not installed")
    import pyarrow as pa

    from streamq.spark._enqueue import EnqueueTask

    url, cluster = where
    name = fresh(cluster, 3)
    cfg = QueueConfig(shards=3)
    ids = [f"row-{i}" for i in range(100)]
    task = EnqueueTask(url, False, name, cfg, "ok", "value", ("n",), False, 7, 0, True,
                       uuid.uuid4().hex[:8])
    batches = [pa.RecordBatch.from_pydict({"id": part, "n": list(range(len(part)))})
               for part in (ids[:60], ids[60:], ids[:10])]  # the last 10 repeat
    [out] = list(task(batches))
    assert dict(zip(out.column(0).to_pylist(), out.column(1).to_pylist(), strict=True)) == {
        "enqueued": 100, "duplicates": 10}
    with Queue.from_url(url, name, cfg) as q:
        client: Any = q.client
        assert all(client.exists(Keys(name, shard=shard_of(j, 3)).job(j)) for j in ids)
        per = [client.xlen(k.stream) for k in shard_keys(name, 3)]
        assert sum(per) == 100 and min(per) > 0


async def test_a_busy_shard_does_not_starve_another(url: str) -> None:
    """Each shard has its own fetch loop and share of the worker's slots: a job arriving in
    an idle shard starts while a backlog in another shard is still being worked off."""
    name = fresh(None, 3)
    cfg = QueueConfig(shards=3)
    backlog = [j for j in (f"busy-{i}" for i in range(3000)) if shard_of(j, 3) == 0][:300]
    [late] = [j for j in (f"late-{i}" for i in range(50)) if shard_of(j, 3) == 2][:1]
    done: list[str] = []
    reg = Registry()

    @reg.handler("slow")
    async def slow(job: Job) -> None:
        await asyncio.sleep(0.01)
        done.append(job.id)

    with Queue.from_url(url, name, cfg) as q:
        q.enqueue_many([{"type": "slow", "job_id": j} for j in backlog])
        async with Worker(url, [name], reg, fast(concurrency=4, promote=False), cfg):
            await eventually(lambda: len(done) >= 10, 30, "the backlog being worked off")
            await asyncio.to_thread(q.enqueue, "slow", job_id=late)
            await eventually(lambda: late in done, 30, "the idle shard's job")
            assert len(done) < len(backlog)  # the backlog was still there
            await eventually(lambda: len(done) == len(backlog) + 1, 60, "everything done")
