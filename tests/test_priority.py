"""Priorities (docs/fairness.md#priorities) against a real redis-server: routing at enqueue,
delayed and retried jobs keep their level, weighted and strict order, start order by ledger."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from helpers import eventually, fast, running

from streamq import InvalidPriority, Job, Queue, QueueConfig, Registry, Retry, Worker
from streamq._core.keys import DEFAULT_PRIORITY, GROUP, Keys
from streamq._worker.promote import Promoter


def ids(r: redis.Redis, stream: str) -> list[bytes]:
    entries: Any = r.xrange(stream)
    return [e[1][b"id"] for e in entries]



def test_priority_is_validated(q: Queue) -> None:
    for bad in (5, -1, True, "4", 2.0):
        with pytest.raises(InvalidPriority):
            q.enqueue("t", priority=bad)
    with pytest.raises(InvalidPriority):
        q.enqueue_many([{"type": "t", "priority": 7}])
    assert q.client.exists(q.keys.stream) == 0  # nothing was written


def test_each_level_has_its_stream(q: Queue, r: redis.Redis) -> None:
    k = q.keys
    q.enqueue("t", job_id="hi", priority=4)
    q.enqueue("t", job_id="plain")
    q.enqueue("t", job_id="dflt", priority=DEFAULT_PRIORITY)
    q.enqueue_many([{"type": "t", "job_id": "lo", "priority": 0},
                    {"type": "t", "job_id": "mid"}])
    assert ids(r, k.stream) == [b"plain", b"dflt", b"mid"]
    assert ids(r, k.stream_level(4)) == [b"hi"]
    assert ids(r, k.stream_level(0)) == [b"lo"]
    assert r.smembers(k.levels) == {b"0", b"4"}
    assert r.hget(k.job("hi"), "p") == b"4" and r.hget(k.job("plain"), "p") is None
    assert q.get("hi").priority == 4 and q.get("plain").priority == 2  # type: ignore[union-attr]
    assert k.stream_level(4) == f"streamq:{{{q.name}}}:stream:p4"


async def test_delayed_job_is_promoted_to_its_level(q: Queue, r: redis.Redis, url: str) -> None:
    import redis.asyncio as aredis

    k = q.keys
    q.enqueue("t", job_id="later", priority=3, delay=0.01)
    q.enqueue("t", job_id="later-plain", delay=0.01)
    assert r.exists(k.stream_level(3)) == 0
    client = aredis.Redis.from_url(url)
    try:
        promoter = Promoter(k, QueueConfig())
        await eventually(lambda: r.zscore(k.delayed, "later") is not None, what="scheduled")
        await asyncio.sleep(0.05)  # due time passes (server clock; checked by the script)
        moved, _ = await promoter.run_once(client)
    finally:
        await client.aclose()
    assert moved == 2
    assert ids(r, k.stream_level(3)) == [b"later"]
    assert ids(r, k.stream) == [b"later-plain"]
    assert q.get("later").state == "queued"  # type: ignore[union-attr]


async def test_a_handler_reads_the_job_priority(q: Queue, url: str) -> None:
    seen: dict[str, int] = {}
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        seen[job.id] = job.priority

    q.enqueue("t", job_id="lowest", priority=0)
    q.enqueue("t", job_id="plain")
    q.enqueue_many([{"type": "t", "job_id": "highest", "priority": 4},
                    {"type": "t", "job_id": "three", "priority": 3, "delay": 0.01}])
    async with Worker(url, [q.name], reg, fast(promote_interval_s=0.02)):
        await eventually(lambda: len(seen) == 4, what="the four jobs to run")
    assert seen == {"lowest": 0, "plain": DEFAULT_PRIORITY, "highest": 4, "three": 3}


async def test_a_retry_keeps_its_priority(q: Queue, url: str, r: redis.Redis) -> None:
    seen: list[tuple[str, int, int]] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        seen.append((job.id, job.attempt, job.priority))
        if job.attempt == 1:
            raise Retry(delay_s=0.05)

    q.enqueue("t", job_id="urgent", priority=4)
    async with Worker(url, [q.name], reg, fast(promote_interval_s=0.02)) as w:
        await eventually(lambda: q.get("urgent").state == "completed",  # type: ignore
                         what="the retried job to complete")
        assert w.stats.retried == 1
    assert seen == [("urgent", 1, 4), ("urgent", 2, 4)]
    info = q.get("urgent")
    assert info is not None and info.priority == 4 and info.attempts == 2
    # the second attempt ran from the level's stream: its group delivered two entries there
    groups = {g["name"]: g for g in r.xinfo_groups(q.keys.stream_level(4))}
    assert groups[GROUP.encode()]["entries-read"] == 2
    assert r.xlen(q.keys.stream) == 0 and r.xlen(q.keys.stream_level(4)) == 0


async def _drain(url: str, qname: str, reg: Registry, n: int, cfg: QueueConfig | None = None,
                 **wcfg: Any) -> None:
    async with Worker(url, [qname], reg, fast(**wcfg), cfg) as w:
        await eventually(lambda: w.stats.completed >= n, timeout_s=30, what=f"{n} jobs")


def _ledger_registry() -> tuple[Registry, list[str]]:
    ledger: list[str] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        ledger.append(job.id)
        await asyncio.sleep(0.002)

    return reg, ledger


async def test_weighted_share_under_a_high_priority_flood(q: Queue, url: str) -> None:
    """200 jobs at priority 4 and 40 at priority 0, all waiting. Weights 3 (level 4), 1
    (level 2, the default: in use always, empty here, so its share goes to the highest level
    with work) and 1 (level 0): low jobs progress at a fifth of the starts."""
    reg, ledger = _ledger_registry()
    q.enqueue_many([{"type": "t", "job_id": f"h{i}", "priority": 4} for i in range(200)])
    q.enqueue_many([{"type": "t", "job_id": f"l{i}", "priority": 0} for i in range(40)])
    cfg = QueueConfig(priority_weights=(1, 1, 1, 1, 3))
    await _drain(url, q.name, reg, 240, cfg, concurrency=8, fetch_batch=4)
    first = ledger[:120]
    low = sum(1 for j in first if j.startswith("l"))
    assert 20 <= low <= 28, (low, first)  # 24 = a fifth, give or take a fetch
    assert sorted(ledger) == sorted([f"h{i}" for i in range(200)] + [f"l{i}" for i in range(40)])


async def test_strict_priority(q: Queue, url: str) -> None:
    reg, ledger = _ledger_registry()
    q.enqueue_many([{"type": "t", "job_id": f"l{i}", "priority": 0} for i in range(30)])
    q.enqueue_many([{"type": "t", "job_id": f"m{i}"} for i in range(30)])
    q.enqueue_many([{"type": "t", "job_id": f"h{i}", "priority": 4} for i in range(30)])
    await _drain(url, q.name, reg, 90, QueueConfig(strict_priority=True), concurrency=8,
                 fetch_batch=4)
    assert [j[0] for j in ledger] == ["h"] * 30 + ["m"] * 30 + ["l"] * 30


async def test_high_priority_starts_within_one_fetch_of_a_low_flood(q: Queue, url: str) -> None:
    """A steady flood of low-priority work is running; a high-priority job enqueued now
    starts before more than one fetch (plus what the slots already held) of low jobs."""
    reg, ledger = _ledger_registry()
    q.enqueue("t", job_id="warm", priority=4)  # the level is in use: workers know its stream
    q.enqueue_many([{"type": "t", "job_id": f"l{i}", "priority": 0} for i in range(600)])
    conc, batch = 4, 2
    async with Worker(url, [q.name], reg, fast(concurrency=conc, fetch_batch=batch)):
        await eventually(lambda: len(ledger) >= 50, what="the flood to run")
        at = len(ledger)
        q.enqueue("t", job_id="urgent", priority=4)
        await eventually(lambda: "urgent" in ledger, what="the urgent job")
        low_between = ledger.index("urgent") - at
        assert ledger[-1] != "l599"  # the flood was still going
    assert low_between <= conc + 2 * batch, (low_between, ledger[at:at + 20])


async def test_levels_of_a_sharded_queue(url: str, qname: str, r: redis.Redis) -> None:
    cfg = QueueConfig(shards=3)
    reg, ledger = _ledger_registry()
    with Queue.from_url(url, qname, config=cfg) as q:
        q.enqueue_many([{"type": "t", "job_id": f"h{i}", "priority": 4} for i in range(30)]
                       + [{"type": "t", "job_id": f"d{i}"} for i in range(30)])
        used = [i for i in range(3) if r.xlen(Keys(qname, shard=i).stream_level(4))]
        assert len(used) >= 2  # spread over the shards, each at its level
        await _drain(url, qname, reg, 60, cfg, concurrency=8)
        assert sorted(ledger) == sorted([f"h{i}" for i in range(30)]
                                        + [f"d{i}" for i in range(30)])
        assert all(q.get(f"h{i}").priority == 4 for i in range(30))  # type: ignore


def test_stats_per_level(url: str, q: Queue, r: redis.Redis) -> None:
    from streamq.admin import Admin

    q.enqueue_many([{"type": "t", "priority": 4} for _ in range(3)]
                   + [{"type": "t"} for _ in range(2)]
                   + [{"type": "t", "priority": 0}])
    admin = Admin.from_url(url)
    try:
        st = admin.stats(q.name)
    finally:
        admin.close()
    assert st.ready == 6
    assert list(st.levels) == [4, 2, 0]
    assert [st.levels[p].ready for p in (4, 2, 0)] == [3, 2, 1]
    assert all(st.levels[p].oldest_ready_age_s is not None for p in (4, 2, 0))
    assert st.oldest_ready_age_s == max(v.oldest_ready_age_s or 0 for v in st.levels.values())


def test_streamq_stats_shows_each_level(url: str, q: Queue) -> None:
    """The CLI's stats add a table per priority level once a queue uses more than one."""
    import subprocess
    import sys

    q.enqueue_many([{"type": "t", "priority": 4} for _ in range(3)]
                   + [{"type": "t"} for _ in range(2)])
    out = subprocess.run([sys.executable, "-m", "streamq", "--url", url, "stats", q.name],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    header = next(i for i, row in enumerate(rows) if row[:2] == ["QUEUE", "PRIORITY"])
    assert rows[header + 1][:4] == [q.name, "4", "3", "0"]
    assert rows[header + 2][:4] == [q.name, "2", "2", "0"]


def test_cancel_purge_and_redrive_use_the_level_stream(url: str, q: Queue,
                                                       r: redis.Redis) -> None:
    """Entry ids of two streams can be equal (same millisecond): a queued job's entry is
    deleted from its own level's stream, never from another."""
    from streamq.admin import Admin

    k = q.keys
    q.enqueue("t", job_id="a", priority=4)
    # the default stream gets an entry with the very id of a's entry
    entries: Any = r.xrange(k.stream_level(4))
    entry = entries[0][0]
    r.xadd(k.stream, {"id": "twin"}, id=entry)
    assert q.cancel("a").cancelled
    assert ids(r, k.stream_level(4)) == [] and ids(r, k.stream) == [b"twin"]
    r.xdel(k.stream, entry)
    q.enqueue("t", job_id="b")
    q.enqueue_many([{"type": "t", "job_id": f"p{i}", "priority": 0} for i in range(3)])
    admin = Admin.from_url(url)
    try:
        assert admin.purge(q.name, "queued") == 4  # b and p0..p2
    finally:
        admin.close()
    assert r.xlen(k.stream) == 0 and r.xlen(k.stream_level(0)) == 0


async def test_a_redriven_job_goes_back_to_its_level(url: str, q: Queue,
                                                     r: redis.Redis) -> None:
    from streamq import Fail
    from streamq.admin import Admin

    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        if job.attempt == 1 and not r.exists(q.keys.job("marker")):
            raise Fail("first time")

    q.enqueue("t", job_id="d", priority=3)
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: q.get("d").state == "failed", what="dead")  # type: ignore
    admin = Admin.from_url(url)
    try:
        assert admin.redrive_matching(q.name).get("redriven") == 1
    finally:
        admin.close()
    assert ids(r, q.keys.stream_level(3)) == [b"d"] and r.xlen(q.keys.stream) == 0


@pytest.mark.cluster
async def test_priorities_on_a_cluster_with_shards(redis_cluster: Any) -> None:
    """claim.lua names the records of the entries it reads by the shard's prefix: on a
    cluster they are in its slot. A 3-shard queue with two levels drains, strictly."""
    import uuid

    from streamq.admin import Admin

    url = redis_cluster.url
    name = f"prio-{uuid.uuid4().hex[:8]}"
    cfg = QueueConfig(shards=3, strict_priority=True)
    reg, ledger = _ledger_registry()
    with Queue.from_url(url, name, config=cfg) as q:
        q.enqueue_many([{"type": "t", "job_id": f"l{i}", "priority": 0} for i in range(30)])
        q.enqueue_many([{"type": "t", "job_id": f"h{i}", "priority": 4} for i in range(30)])
        admin = Admin.from_url(url, cfg)
        try:
            st = admin.stats(name)
            assert st.levels[4].ready == 30 and st.levels[0].ready == 30
        finally:
            admin.close()
        await _drain(url, name, reg, 60, cfg, concurrency=2, fetch_batch=1)
    # strict, per shard: a shard's low jobs start after its high ones; overall the first
    # starts are high ones
    assert sorted(ledger) == sorted([f"h{i}" for i in range(30)] + [f"l{i}" for i in range(30)])
    assert all(j.startswith("h") for j in ledger[:10])


def test_pending_and_ready_listings_cover_every_level(url: str, q: Queue,
                                                      r: redis.Redis) -> None:
    from streamq.admin import Admin

    k = q.keys
    q.enqueue("t", job_id="h1", priority=4)
    q.enqueue("t", job_id="d1")
    q.enqueue("t", job_id="l1", priority=0)
    q.enqueue("t", job_id="h2", priority=4)
    for p in (4, 2, 0):
        r.xgroup_create(k.stream_level(p), GROUP, id="0", mkstream=True)
        r.xreadgroup(GROUP, "c", {k.stream_level(p): ">"}, count=1)  # one delivered per level
    admin = Admin.from_url(url)
    try:
        seen, cursor = [], None
        while True:
            page = admin.pending(q.name, count=1, cursor=cursor)
            seen += [e.job_id for e in page.items]
            cursor = page.cursor
            if cursor is None:
                break
        assert seen == ["h1", "d1", "l1"]
        assert [j.job_id for j in admin.ready(q.name).items] == ["h2"]
        assert admin.job(q.name, "h1").priority == 4
        lease = admin.lease(q.name, "h1")
        assert lease is not None and lease.consumer == "c"  # found in its level's stream
    finally:
        admin.close()


def test_run_until_idle_waits_for_every_level(url: str, q: Queue) -> None:
    from streamq.testing import run_until_idle

    reg, ledger = _ledger_registry()
    q.enqueue_many([{"type": "t", "job_id": f"h{i}", "priority": 4} for i in range(5)])
    run_until_idle(Worker(url, [q.name], reg, fast()))
    assert sorted(ledger) == [f"h{i}" for i in range(5)]


async def test_the_scheduler_sweeps_every_level_when_no_worker_is_alive(
        url: str, q: Queue, r: redis.Redis) -> None:
    from helpers import start_entries

    from schedulers import Scheduler, SchedulerConfig

    k = q.keys
    q.enqueue("t", job_id="hi", priority=4)
    q.enqueue("t", job_id="plain")
    for p in (4, 2):
        r.xgroup_create(k.stream_level(p), GROUP, id="0", mkstream=True)
        r.xreadgroup(GROUP, "dead-worker", {k.stream_level(p): ">"}, count=10)
    hi = k.at_level(4)
    entries: Any = r.xrange(hi.stream)
    start_entries(r, hi, "dead-worker", [(entries[0][0].decode(), "hi")])
    r.zadd(k.workers, {"dead-worker": 1})  # its last heartbeat was long ago
    cfg = SchedulerConfig(visibility_timeout_s=0.05, sweep_interval_s=0.05)
    async with Scheduler(url, [q.name], config=cfg) as sched:
        await eventually(lambda: sched.requeued == 2, what="both entries handed back")
    info = q.get("hi")
    assert info is not None and (info.state, info.attempts) == ("queued", 1)
    assert ids(r, hi.stream) == [b"hi"] and ids(r, k.stream) == [b"plain"]
    assert r.xpending(hi.stream, GROUP)["pending"] == 0


async def test_dead_consumers_are_pruned_from_every_level(url: str, q: Queue,
                                                          r: redis.Redis) -> None:
    k = q.keys
    q.enqueue("t", job_id="hi", priority=4)  # the level is in use
    r.xgroup_create(k.stream_level(4), GROUP, id="0", mkstream=True)
    r.xgroup_createconsumer(k.stream_level(4), GROUP, "gone")
    reg, _ = _ledger_registry()
    cfg = fast(consumer_dead_after_s=0.05, prune_interval_s=0.05)
    async with Worker(url, [q.name], reg, cfg):
        await eventually(lambda: all(c["name"] != b"gone" for c in r.xinfo_consumers(
            k.stream_level(4), GROUP)), what="the dead consumer pruned from the level's stream")


async def test_an_idle_worker_with_fewer_slots_than_levels_reads_every_level(
        q: Queue, url: str) -> None:
    """An idle worker blocks on the level streams with one slot per stream read: with fewer
    free slots than levels in use (concurrency 1 here: one slot), a job arriving at a lower
    level must still be read, not wait for a higher-level job to wake the worker first (the
    cluster chaos run's last low-priority retry, promoted after the queue drained, never ran)."""
    reg, ledger = _ledger_registry()
    async with running(url, q.name, reg, concurrency=1) as w:
        q.enqueue("t", job_id="hi", priority=4)
        await eventually(lambda: w.stats.completed >= 1, what="the priority-4 job")
        # the worker has drained the queue and waits for work on the levels it knows
        q.enqueue_many([{"type": "t", "job_id": "lo", "priority": 0},
                        {"type": "t", "job_id": "mid"}])
        await eventually(lambda: w.stats.completed >= 3, timeout_s=20,
                         what="the jobs enqueued at lower levels while the worker was idle")
    assert sorted(ledger) == ["hi", "lo", "mid"]


async def test_a_claim_of_two_levels_whose_jobs_end_at_once_settles_both(url: str, q: Queue
                                                                         ) -> None:
    """An idle worker's claim can hold jobs of several levels; when every one ends in its
    first step, the last one's outcome is sent from its own task and the other levels' loops
    are woken too. Before, the other level's outcome waited for that level's next job: its
    job stayed 'active', its lease renewed, for as long as the level stayed quiet (the cluster
    chaos run lost a job so). A batch that comes apart instead passes as well."""
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        return None

    q.enqueue("t", job_id="hi", priority=4)
    q.enqueue("t", job_id="lo", priority=0)
    async with running(url, q.name, reg, concurrency=8):
        await eventually(lambda: {q.get(j).state for j in ("hi", "lo")}  # type: ignore[union-attr]
                         == {"completed"}, what="both jobs to complete")
