"""Workers own a subset of a sharded queue's shards (``_worker/owners.py``,
docs/scaling.md#who-reads-which-shard): each live worker fetches new work only from its part,
and the parts move as workers come and go; a worker alone, an unsharded queue and
``WorkerConfig(own_shards=False)`` read every shard as before."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import eventually, fast
from test_faults import Procs, executions, read_ledger, registered, wait_completed, wait_until
from test_shard_turns import fresh, ids_for

from streamq import Job, Keys, Queue, QueueConfig, Registry, Worker
from streamq._core.scripts import SCRIPTS
from streamq._worker.owners import assign
from streamq._worker.promote import Promoter
from streamq.admin import Admin


def owned(w: Worker) -> set[int]:
    """The shards ``w`` owns, once every other one's fetch loop rests (no read or ticket of
    it out: until then a shard owned a moment ago may still get a job)."""
    if any(not qs.owned and not qs.resting for qs in w._shards()):
        return {-1}
    return {qs.keys.shard for qs in w._shards() if qs.owned}


def recording(name: str, ran: dict[str, str]) -> Registry:
    reg = Registry()

    @reg.handler("work")
    async def work(job: Job) -> None:
        ran[job.id] = name

    return reg


# ------------------------------------------------------------------------- the split alone


def test_the_split_is_the_same_on_every_worker_and_covers_every_shard() -> None:
    names = ["b", "a", "c"]
    parts = {n: assign(names, n, range(12)) for n in names}
    assert parts == {"a": {0, 3, 6, 9}, "b": {1, 4, 7, 10}, "c": {2, 5, 8, 11}}
    assert assign([], "me", [3, 1, 2]) == {1, 2, 3}  # alone: every shard
    assert assign(["x"], "me", [0, 1]) == {0} and assign(["me"], "x", [0, 1]) == {1}
    many = [f"w{i}" for i in range(5)]  # more workers than shards: each owns one
    got = [assign(many, n, [0, 1]) for n in many]
    assert got == [{0}, {1}, {0}, {1}, {0}]
    assert assign(["a", "b"], "c", []) == set()


def test_owners_lua_lists_live_workers_by_the_servers_clock(r: redis.Redis) -> None:
    key = "streamq:{own-lua}:workers"
    now_ms = int(r.time()[0]) * 1000
    r.zadd(key, {"fresh": now_ms, "old": now_ms - 60_000, "edge": now_ms - 1_000})
    reply: Any = SCRIPTS["owners"](r, [key], [10_000, 100])
    assert int(reply[0]) >= now_ms
    assert sorted(v.decode() for v in reply[1:]) == ["edge", "fresh"]
    capped: Any = SCRIPTS["owners"](r, [key], [120_000, 2])
    assert [v.decode() for v in capped[1:]] == ["fresh", "edge"]  # newest first, capped
    r.delete(key)


# ------------------------------------------------------------------------- on a real server


async def test_two_workers_on_four_shards_each_fetch_from_their_two(url: str) -> None:
    shards = 4
    name = fresh(None, shards)
    cfg = QueueConfig(shards=shards)
    ran: dict[str, str] = {}
    conf = fast(concurrency=8, promote=False, heartbeat_interval_s=1.0)
    with Queue.from_url(url, name, cfg) as q:
        async with Worker(url, [name], recording("a", ran), conf, cfg, consumer="a") as a, \
                Worker(url, [name], recording("b", ran), conf, cfg, consumer="b") as b:
            await eventually(lambda: owned(a) == {0, 2} and owned(b) == {1, 3}, 30,
                             "both workers see each other")
            ids = {s: ids_for(s, shards, 40, f"o{s}") for s in range(shards)}
            q.enqueue_many([{"type": "work", "job_id": j} for js in ids.values() for j in js])
            every = [j for js in ids.values() for j in js]
            await eventually(lambda: all(j in ran for j in every), 60, "every job run")
            for s, js in ids.items():
                owner = "a" if s in (0, 2) else "b"
                assert {ran[j] for j in js} == {owner}, f"shard {s}"
            for w in (a, b):  # nobody rests a shard it owns, or reads one it does not
                assert w.health()["shard owners"].failures == 0


async def test_a_worker_that_stops_hands_its_shards_on_at_once(url: str, r: redis.Redis
                                                                ) -> None:
    """Its ZREM at stop: the other takes its shards at its next refresh (about 1 s), long
    before the stopped worker's heartbeat would age out (3 x 5 s here)."""
    shards = 4
    name = fresh(None, shards)
    cfg = QueueConfig(shards=shards)
    ran: dict[str, str] = {}
    conf = fast(concurrency=8, promote=False, heartbeat_interval_s=5.0)
    with Queue.from_url(url, name, cfg) as q:
        async with Worker(url, [name], recording("a", ran), conf, cfg, consumer="a") as a:
            b = Worker(url, [name], recording("b", ran), conf, cfg, consumer="b")
            await b.start()
            await eventually(lambda: owned(a) == {0, 2} and owned(b) == {1, 3}, 30,
                             "both workers see each other")
            await b.stop()
            assert r.zscore(Keys(name).of_shard(0).workers, "b") is None
            await eventually(lambda: owned(a) == {0, 1, 2, 3}, 5, "a owns every shard")
            ids = [j for s in range(shards) for j in ids_for(s, shards, 30, f"s{s}")]
            q.enqueue_many([{"type": "work", "job_id": j} for j in ids])
            await eventually(lambda: all(j in ran for j in ids), 60, "every job run")
            assert {ran[j] for j in ids} == {"a"}


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.close()


def test_a_killed_worker_s_shards_and_running_jobs_are_taken_over(
        url: str, r: redis.Redis, procs: Procs) -> None:
    """Worker A, alone, starts a job in every shard; B joins (A's shards: 0 and 2); A is
    killed: once its heartbeat ages out (3 x 0.5 s) B owns every shard, reclaims A's lapsed
    leases (visibility 3 s) and runs what arrives after. Nothing is lost."""
    shards = 4
    name = fresh(None, shards)
    cfg = QueueConfig(shards=shards)
    fast_cfg = {"heartbeat_interval_s": 0.5, "promote_interval_s": 0.2, "shards": shards,
                "visibility_timeout_s": 3, "reclaim_interval_s": 0.2}
    q = Queue.from_url(url, name, cfg)
    procs.worker(url, name, "w-a", **fast_cfg)
    wait_until(lambda: registered(r, Keys(name), "w-a"), 15, "w-a is up", procs.diagnostics)
    first = [ids_for(s, shards, 1, "k")[0] for s in range(shards)]
    for jid in first:
        q.enqueue("job", {"sleep_first": 60}, job_id=jid)
    wait_until(lambda: all(executions(procs.ledger)[j] == 1 for j in first), 20,
               "w-a started a job in every shard", procs.diagnostics)
    assert {rec["consumer"] for rec in read_ledger(procs.ledger)} == {"w-a"}
    procs.worker(url, name, "w-b", **fast_cfg)
    wait_until(lambda: registered(r, Keys(name), "w-b"), 15, "w-b is up", procs.diagnostics)
    procs.sigkill("w-a")
    for jid in first:
        info = wait_completed(q, jid, 60, f"w-b finished {jid}", procs.diagnostics)
        assert info.attempts == 2 and info.result["consumer"] == "w-b"
    late = [j for s in range(shards) for j in ids_for(s, shards, 2, "late")]
    for jid in late:
        q.enqueue("job", {}, job_id=jid)
    for jid in late:
        info = wait_completed(q, jid, 30, f"{jid} after the kill", procs.diagnostics)
        assert info.result["consumer"] == "w-b"
    q.close()


async def test_three_workers_on_two_shards_and_one_on_twelve_starve_nothing(url: str
                                                                             ) -> None:
    ran: dict[str, str] = {}
    conf = fast(concurrency=4, promote=False, heartbeat_interval_s=1.0)
    name = fresh(None, 2)
    cfg = QueueConfig(shards=2)
    with Queue.from_url(url, name, cfg) as q:
        async with Worker(url, [name], recording("a", ran), conf, cfg, consumer="a") as a, \
                Worker(url, [name], recording("b", ran), conf, cfg, consumer="b") as b, \
                Worker(url, [name], recording("c", ran), conf, cfg, consumer="c") as c:
            await eventually(lambda: [owned(w) for w in (a, b, c)] == [{0}, {1}, {0}], 30,
                             "three workers see each other")
            ids = [j for s in range(2) for j in ids_for(s, 2, 60, f"t{s}")]
            q.enqueue_many([{"type": "work", "job_id": j} for j in ids])
            await eventually(lambda: all(j in ran for j in ids), 60, "every job run")
            for s in range(2):
                want = {"a", "c"} if s == 0 else {"b"}
                assert {ran[j] for j in ids_for(s, 2, 60, f"t{s}")} <= want
    name = fresh(None, 12)
    cfg = QueueConfig(shards=12)
    with Queue.from_url(url, name, cfg) as q:
        async with Worker(url, [name], recording("solo", ran), conf, cfg) as solo:
            assert owned(solo) == set(range(12))  # alone: every shard, from the start
            ids = [j for s in range(12) for j in ids_for(s, 12, 10, f"u{s}")]
            q.enqueue_many([{"type": "work", "job_id": j} for j in ids])
            await eventually(lambda: all(j in ran for j in ids), 60, "every shard drained")


async def test_own_shards_off_keeps_every_lane_fetching(url: str) -> None:
    shards = 4
    name = fresh(None, shards)
    cfg = QueueConfig(shards=shards)
    ran: dict[str, str] = {}
    conf = fast(concurrency=8, promote=False, heartbeat_interval_s=0.5, own_shards=False)
    with Queue.from_url(url, name, cfg) as q:
        async with Worker(url, [name], recording("a", ran), conf, cfg, consumer="a") as a, \
                Worker(url, [name], recording("b", ran), conf, cfg, consumer="b") as b:
            assert "shard owners" not in a.health()  # no owners loop: every shard read
            ids = [j for s in range(shards) for j in ids_for(s, shards, 20, f"f{s}")]
            q.enqueue_many([{"type": "work", "job_id": j} for j in ids])
            await eventually(lambda: all(j in ran for j in ids), 60, "every job run")
            assert owned(a) == owned(b) == set(range(shards))
            assert a._slots.loops == b._slots.loops == shards


async def test_a_shards_upkeep_runs_on_its_owner_only(url: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Promotion (like the relay, the error index and group upkeep: loops any number of
    workers may run) runs on a shard's owner alone: two workers over four shards make four
    shards' promotion calls per interval, not eight. Delayed jobs of every shard still run."""
    shards = 4
    name = fresh(None, shards)
    cfg = QueueConfig(shards=shards)
    ran: dict[str, str] = {}
    conf = fast(concurrency=8, heartbeat_interval_s=1.0, promote_interval_s=0.05)
    calls: dict[tuple[str, int], int] = {}
    with Queue.from_url(url, name, cfg) as q:
        async with Worker(url, [name], recording("a", ran), conf, cfg, consumer="a") as a, \
                Worker(url, [name], recording("b", ran), conf, cfg, consumer="b") as b:
            await eventually(lambda: owned(a) == {0, 2} and owned(b) == {1, 3}, 30,
                             "both workers see each other")
            whose = {id(qs.promoter): (who, qs.keys.shard) for w, who in ((a, "a"), (b, "b"))
                     for qs in w._shards()}
            real = Promoter.run_once

            async def counted(self: Promoter, client: Any) -> Any:
                key = whose[id(self)]
                calls[key] = calls.get(key, 0) + 1
                return await real(self, client)

            monkeypatch.setattr(Promoter, "run_once", counted)
            ids = {s: ids_for(s, shards, 5, f"d{s}") for s in range(shards)}
            for js in ids.values():
                for j in js:
                    q.enqueue("work", {}, job_id=j, delay=0.2)
            every = [j for js in ids.values() for j in js]
            await eventually(lambda: all(j in ran for j in every), 60, "every delayed job run")
            await eventually(lambda: all(calls.get((o, s), 0) >= 3 for o, s in (
                ("a", 0), ("a", 2), ("b", 1), ("b", 3))), 30, "each owner promoting")
            assert not [k for k in calls if k not in {("a", 0), ("a", 2), ("b", 1), ("b", 3)}]


async def test_a_queue_resharded_up_from_one_shard_is_split_and_back_down_owned_whole(
        url: str) -> None:
    """Workers configured for an unsharded queue (``QueueConfig()``) follow a reshard 1 -> 4:
    they split the four shards between them as on a queue made with 4; after 4 -> 1 each
    owns the one shard left (none rests it), and jobs enqueued after each change all run."""
    name = fresh(None, 4)
    cfg = QueueConfig()
    ran: dict[str, str] = {}
    conf = fast(concurrency=8, promote=False, heartbeat_interval_s=1.0)
    admin = Admin.from_url(url, cfg)
    try:
        with Queue.from_url(url, name, cfg) as q:
            async with Worker(url, [name], recording("a", ran), conf, cfg, consumer="a") as a, \
                    Worker(url, [name], recording("b", ran), conf, cfg, consumer="b") as b:
                assert owned(a) == owned(b) == {0}
                assert admin.reshard(name, 4).shards == 4
                await eventually(lambda: owned(a) == {0, 2} and owned(b) == {1, 3}, 30,
                                 "the four shards split")
                ids = [f"up-{i}" for i in range(80)]
                q.enqueue_many([{"type": "work", "job_id": j} for j in ids])
                await eventually(lambda: all(j in ran for j in ids), 60, "every job run")
                assert {ran[j] for j in ids} == {"a", "b"}
                assert admin.reshard(name, 1).shards == 1
                await eventually(lambda: admin.reshard_finish(name).done, 30, "shards gone")
                await eventually(lambda: owned(a) == owned(b) == {0}, 30,
                                 "shard 0 owned by both")
                late = [f"down-{i}" for i in range(40)]
                q.enqueue_many([{"type": "work", "job_id": j} for j in late])
                await eventually(lambda: all(j in ran for j in late), 60, "every job run")
    finally:
        admin.close()


async def test_a_heartbeat_too_slow_for_the_visibility_timeout_is_warned_about(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    """3 heartbeat intervals at or above the visibility timeout: a dead worker's shards
    would wait longer than its leases (not refused; said once at start, with the fix)."""
    name = fresh(None, 2)
    cfg = QueueConfig(shards=2)
    slow = fast(concurrency=2, promote=False, heartbeat_interval_s=4.0, visibility_timeout_s=9)
    with caplog.at_level("WARNING", logger="streamq.worker"):
        async with Worker(url, [name], recording("a", {}), slow, cfg):
            pass
    said = [r.getMessage() for r in caplog.records if "handed on after" in r.getMessage()]
    assert len(said) == 1 and "heartbeat_interval_s below 3.00 s" in said[0]
    caplog.clear()
    ok = fast(concurrency=2, promote=False, heartbeat_interval_s=2.0, visibility_timeout_s=9)
    with caplog.at_level("WARNING", logger="streamq.worker"):
        async with Worker(url, [name], recording("a", {}), ok, cfg):
            pass
    assert not [r for r in caplog.records if "handed on after" in r.getMessage()]
