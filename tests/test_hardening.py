"""Regression tests for the hardening review (issue 14): lost replies, loops that must survive
every error, transient server errors, fencing on every path, atomic pause, clocks, hung sync
handlers. Each forces its interleaving against a real redis-server: by calling a script, by
dropping a reply at the client boundary, or by injecting an error there."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import types
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis
from helpers import eventually, fast, field, record, start_entries

from streamq import Job, Queue, QueueConfig, Registry, ScriptError, Worker
from streamq._core.errors import StreamqError
from streamq._core.keys import GROUP
from streamq._core.retry import transient
from streamq._core.scripts import SCRIPTS, Script
from streamq._core.server import RedisServer
from streamq._worker.promote import Promoter
from streamq._worker.settle import Settler
from streamq._worker.state import QState, WorkerStats
from streamq.admin import Admin

pytestmark = pytest.mark.timeout(90)



@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    yield server
    server.close()


@asynccontextmanager
async def running(url: str, qname: str, reg: Registry, queue_config: QueueConfig | None = None,
                  **cfg: Any) -> AsyncIterator[Worker]:
    async with Worker(url, [qname], reg, fast(**cfg), queue_config=queue_config) as w:
        yield w


def drop_reply_once(monkeypatch: pytest.MonkeyPatch, name: str, times: int = 1) -> list[int]:
    """The script runs on the server, then its reply is lost (a connection error instead)."""
    script = SCRIPTS[name]
    orig = Script.run_async
    calls = [0]

    async def lossy(self: Script, client: Any, keys: Any, args: Any, **kw: Any) -> Any:
        reply = await orig(self, client, keys, args, **kw)
        if self is script and calls[0] < times:
            calls[0] += 1
            raise redis.ConnectionError(f"reply of {name}.lua lost (test)")
        return reply

    orig_packed = Script.run_packed_async

    async def lossy_packed(self: Script, client: Any, packed: bytes, **kw: Any) -> Any:
        reply = await orig_packed(self, client, packed, **kw)  # (claims, finish.lua calls)
        if self is script and calls[0] < times:
            calls[0] += 1
            raise redis.ConnectionError(f"reply of {name}.lua lost (test)")
        return reply

    monkeypatch.setattr(Script, "run_async", lossy)
    monkeypatch.setattr(Script, "run_packed_async", lossy_packed)
    return calls


def fail_once(monkeypatch: pytest.MonkeyPatch, name: str, exc: Exception, times: int = 1
              ) -> list[int]:
    """The script call fails before it reaches the server (the error the server would send)."""
    script = SCRIPTS[name]
    orig = Script.run_async
    calls = [0]

    async def failing(self: Script, client: Any, keys: Any, args: Any, **kw: Any) -> Any:
        if self is script and calls[0] < times:
            calls[0] += 1
            raise exc
        return await orig(self, client, keys, args, **kw)

    orig_packed = Script.run_packed_async

    async def failing_packed(self: Script, client: Any, packed: bytes, **kw: Any) -> Any:
        if self is script and calls[0] < times:
            calls[0] += 1
            raise exc
        return await orig_packed(self, client, packed, **kw)

    monkeypatch.setattr(Script, "run_async", failing)
    monkeypatch.setattr(Script, "run_packed_async", failing_packed)
    return calls


def counter_registry() -> tuple[Registry, list[int]]:
    reg = Registry()
    runs: list[int] = []

    @reg.handler("t")
    async def t(job: Job) -> int:
        runs.append(job.attempt)
        return job.attempt

    return reg, runs


# ------------------------------------------------------------------ 1. start is repeatable


def test_a_repeated_start_returns_the_same_lease_and_attempt(q: Queue, r: redis.Redis) -> None:
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="j", max_attempts=1)
    r.xreadgroup(GROUP, "A", {k.stream: ">"}, count=1)
    entry = field(r, k.job("j"), "entry").decode()  # type: ignore[union-attr]
    first = start_entries(r, k, "A", [(entry, "j")], token="tok-1")
    again = start_entries(r, k, "A", [(entry, "j")], token="tok-1")
    assert first[:3] == [b"run", b"tok-1", 1]
    assert again[:3] == [b"run", b"tok-1", 1], "a repeated start must not count an attempt"
    rec = record(r, k.job("j"))
    assert rec[b"attempts"] == b"1" and rec[b"state"] == b"active"
    assert r.hget(k.stats, "started") == b"1" and r.xlen(k.dead) == 0


@pytest.mark.parametrize("script", ["claim", "start"])
async def test_a_lost_start_reply_does_not_bury_a_job_that_never_ran(
        url: str, q: Queue, monkeypatch: pytest.MonkeyPatch, script: str) -> None:
    """claim.lua starts a backlog; start.lua what an idle worker's blocking read got."""
    reg, runs = counter_registry()
    lost = drop_reply_once(monkeypatch, script)
    if script == "claim":
        q.enqueue("t", job_id="last-try", max_attempts=1)
    # (an idle worker's job comes started by the producer, unless hand-off is off:
    # test_handoff.py covers a lost reply there)
    async with running(url, q.name, reg, QueueConfig(handoff=False)) as w:
        if script == "start":
            await eventually(lambda: w._qs[q.name].idle, what="the worker to wait idle")
            q.enqueue("t", job_id="last-try", max_attempts=1)
        await eventually(lambda: q.get("last-try").state == "completed",  # type: ignore[union-attr]
                         what="the job to run once and complete")
    assert lost == [1] and runs == [1]
    assert q.result("last-try") == 1


# ------------------------------------------------------------------ 2. loops survive


async def test_fetch_survives_nogroup_then_a_connection_error(
        url: str, q: Queue, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    reg, runs = counter_registry()
    calls = [0]
    orig = Worker._ensure_group

    async def flaky(client: Any, keys: Any) -> None:
        calls[0] += 1
        if calls[0] == 2:  # the first is start(); the second answers NOGROUP in the fetch loop
            raise redis.ConnectionError("connection dropped while recreating the group (test)")
        await orig(client, keys)

    monkeypatch.setattr(Worker, "_ensure_group", staticmethod(flaky))
    async with running(url, q.name, reg, block_ms=100) as w:
        r.xgroup_destroy(q.keys.stream, GROUP)
        await eventually(lambda: calls[0] >= 3, what="the group made again after the error")
        q.enqueue("t", job_id="after")
        await eventually(lambda: q.get("after").state == "completed",  # type: ignore[union-attr]
                         what="fetching to go on")
        assert w.health()[f"fetch from {q.name}"].failures == 0
    assert runs == [1]


async def test_promotion_survives_a_failed_clock_sync(
        url: str, q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    reg, _ = counter_registry()
    orig = Promoter.sync_clock
    calls = [0]

    async def flaky(self: Promoter, client: Any) -> None:
        calls[0] += 1
        if calls[0] == 1:
            raise redis.ConnectionError("blip (test)")
        await orig(self, client)

    monkeypatch.setattr(Promoter, "sync_clock", flaky)
    async with running(url, q.name, reg):
        q.enqueue("t", job_id="later", delay=0.2)
        await eventually(lambda: q.get("later").state == "completed",  # type: ignore[union-attr]
                         what="the delayed job to be promoted and run")
    assert calls[0] >= 2


async def test_heartbeats_go_on_after_a_script_error(
        url: str, q: Queue, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    reg, _ = counter_registry()
    fail_once(monkeypatch, "heartbeat", ScriptError("heartbeat.lua failed: ERR boom (test)"))
    async with running(url, q.name, reg, heartbeat_interval_s=0.1) as w:
        await eventually(lambda: r.zscore(q.keys.workers, w.consumer), what="a heartbeat")
        first = r.zscore(q.keys.workers, w.consumer)
        await eventually(lambda: (r.zscore(q.keys.workers, w.consumer) or 0) > (first or 0),
                         what="heartbeats to go on")


async def test_cron_survives_readonly_before_its_first_round(
        url: str, qname: str, r: redis.Redis, monkeypatch: pytest.MonkeyPatch) -> None:
    from schedulers import Cron, Scheduler, SchedulerConfig

    orig = redis.asyncio.Redis.hget
    calls = [0]

    async def readonly(self: Any, *args: Any) -> Any:
        calls[0] += 1
        if calls[0] == 1:  # publishing the entries' info, before the first tick
            raise redis.exceptions.ReadOnlyError("You can't write against a read only replica.")
        return await orig(self, *args)

    monkeypatch.setattr(redis.asyncio.Redis, "hget", readonly)
    entry = Cron("every-second", every=1, job_type="tick", queue=qname)
    async with Scheduler(url, [qname], [entry], SchedulerConfig(sweep_interval_s=60)) as s:
        await eventually(lambda: r.xlen(f"streamq:{{{qname}}}:stream") >= 2, timeout_s=15,
                         what="cron ticks after the READONLY reply")
        assert s.health()["cron"].failures == 0


# ------------------------------------------------------------------ 3. transient errors


def test_server_errors_are_classified_in_one_place() -> None:
    cases: list[Exception] = [redis.ConnectionError("x"), redis.TimeoutError("x"),
                redis.exceptions.BusyLoadingError("Redis is loading"),
                redis.exceptions.OutOfMemoryError("command not allowed"),
                redis.exceptions.ReadOnlyError("read only replica"),
                redis.ResponseError("BUSY Redis is busy running a script"),
                redis.ResponseError("MISCONF Redis is configured to save RDB snapshots"),
                redis.exceptions.TryAgainError("x"), redis.exceptions.ClusterDownError("x"),
                redis.ResponseError("Command # 1 (EXISTS streamq:{q}:paused) of pipeline caused"
                                    " error: ('BUSY Redis is busy running a script.',)"),
                redis.ResponseError("ERR Error running script (call to f_1): @user_script:3:"
                                    " -OOM command not allowed"),
                # Redis 7.0, a script's write on a server turned replica (the chaos soak's
                # 'readonly' fault: claim.lua logged at ERROR with a traceback before)
                redis.ResponseError("user_script:1018: READONLY You can't write against a read"
                                    " only replica. script: e1f0, on @user_script:1018.")]
    for exc in cases:
        assert transient(exc), exc
        wrapped = ScriptError("finish.lua failed")
        wrapped.__cause__ = exc
        assert transient(wrapped), f"wrapped {exc!r}"
    permanent: list[Exception] = [
        redis.ResponseError("WRONGTYPE Operation against a key"),
        redis.ResponseError("NOGROUP No such key"), redis.exceptions.NoPermissionError(),
        ScriptError("start.lua failed: ERR user_script:1 bad"), ValueError("bug"),
        redis.ResponseError("Command # 2 (HGET k f) of pipeline caused error: ('WRONGTYPE x',)"),
        redis.ResponseError("ERR unknown command 'BUSYX'"),
        redis.ResponseError("user_script:7: WRONGTYPE Operation against a key")]
    for exc in permanent:
        assert not transient(exc), exc


async def test_settling_through_oom_loses_no_outcome(own_server: RedisServer, qname: str
                                                     ) -> None:
    url = own_server.url
    admin = redis.Redis.from_url(url, protocol=2)
    q = Queue.from_url(url, qname)
    gate = asyncio.Event()
    reg = Registry()
    runs: list[str] = []

    @reg.handler("t")
    async def t(job: Job) -> str:
        runs.append(job.id)
        await gate.wait()
        return job.id

    q.enqueue_many([{"type": "t", "job_id": f"j{i}", "max_attempts": 1} for i in range(10)])
    async with running(url, qname, reg, visibility_timeout_s=60) as w:
        await eventually(lambda: len(runs) == 10, what="all jobs running")
        admin.config_set("maxmemory-policy", "noeviction")
        admin.config_set("maxmemory", 1)
        try:
            gate.set()
            settle = f"settling on {qname}"
            await eventually(lambda: w._settler is not None
                             and w._settler.loops[settle].total_failures >= 3,
                             what="settling to meet OOM three times")
            assert w.stats.completed == 0 and w.stats.lost == 0
        finally:
            admin.config_set("maxmemory", 0)
        await eventually(lambda: w.stats.completed == 10, what="settling to go through")
    assert w.stats.lost == 0 and sorted(runs) == sorted(f"j{i}" for i in range(10))
    assert all(q.get(f"j{i}").state == "completed" for i in range(10))  # type: ignore[union-attr]
    q.close()
    admin.close()


# ------------------------------------------------------------------ 4. reclaim after a lost lease


async def test_an_entry_whose_lease_this_worker_lost_is_reclaimed_and_run(
        url: str, q: Queue, r: redis.Redis) -> None:
    reg = Registry()
    runs: list[int] = []
    hold = asyncio.Event()

    @reg.handler("t")
    async def t(job: Job) -> int:
        runs.append(job.attempt)
        if len(runs) == 1:
            await hold.wait()  # the first run hangs on
        return job.attempt

    q.enqueue("t", job_id="j")
    k = q.keys
    async with running(url, q.name, reg, visibility_timeout_s=1.0, reclaim_interval_s=0.2):
        await eventually(lambda: runs == [1], what="the first run")
        entry = field(r, k.job("j"), "entry").decode()  # type: ignore[union-attr]
        r.xclaim(k.stream, GROUP, "X", 0, [entry], justid=True)  # X takes over, then dies
        start_entries(r, k, "X", [(entry, "j")])
        await eventually(lambda: q.get("j").state == "completed",  # type: ignore[union-attr]
                         timeout_s=15, what="the worker to take the lapsed entry back and run it")
        hold.set()
    assert runs == [1, 3]


# ------------------------------------------------------------------ 5. a lease starts fresh


def test_start_resets_the_entry_idle_time(q: Queue, r: redis.Redis) -> None:
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="j")
    r.xreadgroup(GROUP, "A", {k.stream: ">"}, count=1)
    entry = field(r, k.job("j"), "entry").decode()  # type: ignore[union-attr]
    r.xclaim(k.stream, GROUP, "A", 0, [entry], idle=100_000, justid=True)  # delivered long ago
    assert start_entries(r, k, "A", [(entry, "j")])[0] == b"run"
    pel: Any = r.xpending_range(k.stream, GROUP, min=entry, max=entry, count=1)
    assert pel[0]["time_since_delivered"] < 5_000, "the lease must begin fresh"


# ------------------------------------------------------------------ 6. clocks


async def test_promotion_ignores_a_backward_step_of_the_host_clock(
        url: str, q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    import streamq._worker.promote

    reg, _ = counter_registry()
    async with running(url, q.name, reg):
        await asyncio.sleep(0.3)  # the promoter has read the server's clock
        stepped = types.SimpleNamespace(time=lambda: time.time() - 3600,  # the host clock
                                        monotonic=time.monotonic)       # steps back an hour
        monkeypatch.setattr(streamq._worker.promote, "time", stepped)
        q.enqueue("t", job_id="later", delay=0.3)
        await eventually(lambda: q.get("later").state == "completed",  # type: ignore[union-attr]
                         what="a due job to run despite the clock step")


def test_fire_refuses_a_tick_in_the_servers_future_and_skip_never_moves_back(
        q: Queue, r: redis.Redis) -> None:
    from schedulers import Cron

    k = q.keys
    entry = Cron("hourly", every=3600, job_type="t", queue=q.name)
    now_ms = int(r.time()[0]) * 1000

    def fire(tick: int, mode: str) -> Any:
        p = entry.prepare(k, q.config, tick)
        return SCRIPTS["fire"](r, [k.stream, k.delayed, k.stats, k.events, p.key, k.cron],
                               [q.config.events_maxlen, k.wake_channel, entry.name, tick, "{}",
                                *p.args, mode])

    assert fire(now_ms + 3_600_000, "fire")[0] == b"future"
    assert r.hget(k.cron, "hourly:last") is None and r.xlen(k.stream) == 0
    assert fire(now_ms - 1000, "fire")[0] == b"queued"
    assert fire(now_ms - 5000, "skip")[0] == b"stale", "an older tick must not move 'last' back"
    assert r.hget(k.cron, "hourly:last") == str(now_ms - 1000).encode()


# ------------------------------------------------------------------ 7. hung sync handlers


async def test_hung_sync_handlers_do_not_starve_later_sync_jobs(
        url: str, q: Queue, caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry()
    release = threading.Event()

    @reg.handler("hang", timeout=0.3, max_attempts=1)
    def hang(job: Job) -> None:
        release.wait(30)

    @reg.handler("quick", timeout=0.3, max_attempts=1)
    def quick(job: Job) -> str:
        return "ok"

    caplog.set_level(logging.WARNING, logger="streamq.worker")
    try:
        q.enqueue_many([{"type": "hang", "job_id": f"h{i}"} for i in range(2)])
        async with running(url, q.name, reg, concurrency=2) as w:
            await eventually(lambda: w.stats.stuck_threads == 2, what="two abandoned handlers")
            q.enqueue_many([{"type": "quick", "job_id": f"q{i}"} for i in range(4)])
            await eventually(lambda: all(q.get(f"q{i}").state == "completed"  # type: ignore
                                         for i in range(4)), what="later sync jobs to complete")
    finally:
        release.set()
    assert all(q.get(f"h{i}").state == "failed" for i in range(2))  # type: ignore[union-attr]
    assert "outlived its timeout" in caplog.text and "h0" in caplog.text


# ------------------------------------------------------------------ 8. fencing on every path


def test_a_takeover_bury_fences_out_the_stale_worker(q: Queue, r: redis.Redis) -> None:
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="j", max_attempts=1)
    r.xreadgroup(GROUP, "A", {k.stream: ">"}, count=1)
    entry = field(r, k.job("j"), "entry").decode()  # type: ignore[union-attr]
    a = start_entries(r, k, "A", [(entry, "j")])
    r.xclaim(k.stream, GROUP, "B", 0, [entry], justid=True)  # A's lease lapsed: B takes over
    assert start_entries(r, k, "B", [(entry, "j")])[0] == b"dead"  # attempts exhausted
    out = SCRIPTS["finish"](r, [k.stream, k.delayed, k.dead, k.stats, k.events, k.job("j")],
                            [GROUP, 100, 3600, 1000, "", 1, "j", entry, a[1], "ok", b"1", 0, ""])
    assert out == [b"lost"] and r.hget(k.stats, "lease_lost") == b"1"


def test_a_repeated_finish_after_its_retry_was_promoted_is_not_lost(q: Queue, r: redis.Redis
                                                                    ) -> None:
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="j")
    r.xreadgroup(GROUP, "A", {k.stream: ">"}, count=1)
    entry = field(r, k.job("j"), "entry").decode()  # type: ignore[union-attr]
    a = start_entries(r, k, "A", [(entry, "j")])
    call = [GROUP, 100, 3600, 1000, "", 1, "j", entry, a[1], "retry", b"{}", 0, "E"]
    keys = [k.stream, k.delayed, k.dead, k.stats, k.events, k.job("j")]
    assert SCRIPTS["finish"](r, keys, call) == [b"retrying"]
    SCRIPTS["promote"](r, [k.delayed, k.stream, k.dead, k.stats, k.events, k.job("j")],
                       [100, 3600, 1000, "1 0 0", "j"])
    assert field(r, k.job("j"), "state") == b"queued"
    assert SCRIPTS["finish"](r, keys, call) == [b"retrying"]  # the reply was lost: sent again
    r.xreadgroup(GROUP, "B", {k.stream: ">"}, count=1)  # and even once it started again
    new_entry = field(r, k.job("j"), "entry").decode()  # type: ignore[union-attr]
    start_entries(r, k, "B", [(new_entry, "j")])
    assert SCRIPTS["finish"](r, keys, call) == [b"retrying"]
    assert r.hget(k.stats, "lease_lost") is None and r.hget(k.stats, "retried") == b"1"


# ------------------------------------------------------------------ 9. no leak of dead workers


async def test_a_worker_that_never_became_a_consumer_is_pruned(url: str, q: Queue,
                                                               r: redis.Redis) -> None:
    reg, _ = counter_registry()
    r.zadd(q.keys.workers, {"died-while-paused": 1})  # a heartbeat long ago, never a consumer
    async with running(url, q.name, reg, consumer_dead_after_s=0.5, prune_interval_s=0.1):
        await eventually(lambda: r.zscore(q.keys.workers, "died-while-paused") is None,
                         what="the dead worker to be pruned")


# ------------------------------------------------------------------ 10. enqueue all or nothing


def test_a_wrong_type_key_refuses_the_whole_batch(q: Queue, r: redis.Redis) -> None:
    r.set(q.keys.job("b"), "not a hash")
    with pytest.raises(StreamqError, match="WRONGTYPE"):
        q.enqueue_many([{"type": "t", "job_id": i} for i in ("a", "b", "c")])
    assert not r.exists(q.keys.job("a")) and not r.exists(q.keys.job("c"))
    assert r.xlen(q.keys.stream) == 0 and r.hget(q.keys.stats, "enqueued") is None


@pytest.mark.parametrize("which", ["stats", "stream", "events", "delayed"])
def test_a_wrong_type_queue_key_the_call_writes_refuses_it_all(url: str, qname: str,
                                                               r: redis.Redis, which: str
                                                               ) -> None:
    """The stats HASH is checked by the call's first write (its count), the others by reads
    before it (the events STREAM when a kind the call writes is on, the delayed ZSET when a
    job of the batch has a delay): either way nothing is written."""
    cfg = QueueConfig(event_kinds=frozenset({"enqueued"}))
    with Queue.from_url(url, qname, config=cfg) as q:
        key = getattr(q.keys, which)
        r.set(key, "not mine")
        jobs: list[dict[str, Any]] = [{"type": "t", "job_id": i} for i in ("a", "b")]
        jobs.append({"type": "t", "job_id": "c", "delay": 60})
        with pytest.raises(StreamqError, match=f"WRONGTYPE {key} is not a"):
            q.enqueue_many(jobs)
        for j in ("a", "b", "c"):
            assert not r.exists(q.keys.job(j))
        assert r.get(key) == b"not mine"
        for k in (q.keys.stream, q.keys.delayed, q.keys.stats, q.keys.events):
            assert k == key or not r.exists(k)


# ------------------------------------------------------------------ 11. docs are true


def test_a_sweep_dead_letters_a_malformed_entry_as_malformed(q: Queue, r: redis.Redis) -> None:
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    entry = r.xadd(k.stream, {"junk": "x"}).decode()  # type: ignore[union-attr]
    r.xreadgroup(GROUP, "gone", {k.stream: ">"}, count=1)
    args = [GROUP, 100, 3600, 1000, "sweeper", "1 0 0", entry, ""]
    keys = [k.stream, k.dead, k.stats, k.events, k.job("-")]
    SCRIPTS["requeue"](r, keys, args)
    SCRIPTS["requeue"](r, keys, args)  # repeated: writes nothing more
    dead: Any = r.xrange(k.dead)
    assert len(dead) == 1 and dead[0][1][b"reason"] == b"malformed stream entry"
    assert r.xlen(k.stream) == 0


async def test_a_lapsed_lease_dead_letter_stays_out_of_the_errors_history(
        url: str, q: Queue, r: redis.Redis) -> None:
    reg = Registry()

    @reg.handler("t", max_attempts=1)  # the limit comes from the handler, not the job
    async def t(job: Job) -> None:
        return None

    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="j")
    r.xreadgroup(GROUP, "X", {k.stream: ">"}, count=1)
    entry = field(r, k.job("j"), "entry").decode()  # type: ignore[union-attr]
    start_entries(r, k, "X", [(entry, "j")])  # X ran attempt 1 and died
    r.xclaim(k.stream, GROUP, "X", 0, [entry], idle=100_000, justid=True)
    async with running(url, q.name, reg, visibility_timeout_s=1.0, reclaim_interval_s=0.2):
        await eventually(lambda: q.get("j").state == "failed",  # type: ignore[union-attr]
                         what="the job to be dead-lettered")
    info = q.get("j")
    assert info is not None and info.reason == "attempts exhausted (lease lapsed)"
    assert r.hget(k.job("j"), "errors") is None


# ------------------------------------------------------------------ review items


def test_default_consumer_names_carry_a_random_part(url: str) -> None:
    reg, _ = counter_registry()
    a, b = Worker(url, ["x"], reg), Worker(url, ["x"], reg)
    assert len(a.consumer.split(":")) == 4 and a.consumer.split(":")[3] != b.consumer.split(":")[3]


async def test_hand_back_releases_a_pending_list_longer_than_one_page(url: str, q: Queue,
                                                                      r: redis.Redis) -> None:
    from streamq._core.conn import async_client
    from streamq._worker.lease import LeaseKeeper

    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue_many([{"type": "t", "job_id": f"j{i}"} for i in range(1_500)])
    r.xreadgroup(GROUP, "c", {k.stream: ">"}, count=2_000)
    client = async_client(url)
    stats = WorkerStats()
    settler = Settler(client, q.config, LeaseKeeper(lambda: None, "c", 1.0), stats,  # type: ignore
                      "c", lambda n: None)
    await settler.hand_back([QState(k)], "")
    await client.aclose()
    assert stats.released == 1_500
    assert r.xpending(k.stream, GROUP)["pending"] == 0


# ------------------------------------------------------------------ pause is atomic


async def test_nothing_starts_once_pause_returns(url: str, q: Queue, r: redis.Redis) -> None:
    reg, runs = counter_registry()
    admin = Admin.from_url(url)
    q.enqueue("nope", job_id="dead-one")  # no handler: dead-lettered, re-driven below
    async with running(url, q.name, reg, block_ms=5_000) as w:
        await eventually(lambda: q.get("dead-one").state == "failed",  # type: ignore
                         what="the unknown type dead-lettered")
        reg.register("nope", lambda job: None)
        await asyncio.sleep(0.2)  # the fetch loop is blocked in XREADGROUP now
        admin.pause(q.name)
        q.enqueue_many([{"type": "t", "job_id": f"j{i}"} for i in range(5)])
        admin.redrive_matching(q.name)
        await eventually(lambda: int(r.hget(q.keys.stats, "released") or 0) >= 1,
                         what="the blocked read to hand its entries back")
        await eventually(lambda: all(s.paused for s in w._qs.values()), what="pause seen")
        assert runs == [] and w.stats.started == 1  # only the first, before the pause
        assert all(q.get(f"j{i}").state == "queued" for i in range(5))  # type: ignore
        admin.resume(q.name)
        await eventually(lambda: len(runs) == 5 and q.get("dead-one").state == "completed",  # type: ignore
                         what="everything to run after resume")
    assert sorted(runs) == [1] * 5
    admin.close()


async def test_every_loop_resumes_as_soon_as_one_sees_redis_again() -> None:
    """After an outage a loop does not sleep out its grown back-off: the first loop of the
    process that gets an answer cuts every other loop's back-off short."""
    from streamq._core.supervise import Outage, Supervised

    log = logging.getLogger("streamq.test")
    outage = Outage(log, "test")
    slow = Supervised("slow", log, outage=outage, min_backoff_s=10.0, max_backoff_s=30.0)
    quick = Supervised("quick", log, outage=outage)
    healthy = asyncio.Event()

    async def step() -> float:
        if not healthy.is_set():
            raise redis.ConnectionError("down (test)")
        return 0.01

    tasks = [asyncio.create_task(s.run(step, lambda: True)) for s in (slow, quick)]
    try:
        await eventually(lambda: slow.failures >= 1 and quick.failures >= 2,
                         what="both loops failing")
        healthy.set()
        # slow's back-off is at least 5 s; it resumes within 2 s because quick got an answer
        await eventually(lambda: slow.failures == 0, timeout_s=2.0,
                         what="the slow loop to resume with the quick one")
        assert outage.recoveries == 1
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
