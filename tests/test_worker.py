"""Worker behaviour against a real redis-server: outcomes, bad input, leases, recovery."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import redis
from helpers import eventually, fast, field, record, start_entries

from streamq import (
    Fail,
    InvalidArgument,
    Job,
    JobFailed,
    Queue,
    Registry,
    RegistryError,
    Retry,
    RetryPolicy,
    Worker,
    WorkerConfig,
)
from streamq._core.keys import GROUP
from streamq._core.scripts import SCRIPTS


@asynccontextmanager
async def running(url: str, qname: str, reg: Registry, **cfg: Any) -> AsyncIterator[Worker]:
    async with Worker(url, [qname], reg, fast(**cfg)) as w:
        yield w


def state(q: Queue, job_id: str) -> str:
    info = q.get(job_id)
    return info.state if info else ""


def finished(q: Queue, *ids: str) -> bool:
    return all(state(q, i) in ("completed", "failed", "cancelled") for i in ids)


@pytest.fixture
def q(url: str, qname: str) -> Any:
    queue = Queue.from_url(url, qname)
    yield queue
    queue.close()


async def test_async_and_sync_handlers_store_results(url: str, q: Queue) -> None:
    reg = Registry()
    threads: list[str] = []

    @reg.handler("add")
    async def add(job: Job) -> int:
        return int(job.payload["a"]) + int(job.payload["b"])

    @reg.handler("sync")
    def sync(job: Job) -> dict[str, Any]:
        threads.append(threading.current_thread().name)
        return {"attempt": job.attempt, "id": job.id}

    q.enqueue("add", {"a": 2, "b": 3}, job_id="a")
    q.enqueue("sync", job_id="s", result_ttl=120)
    async with running(url, q.name, reg) as w:
        await eventually(lambda: finished(q, "a", "s"), what="jobs to finish")
    assert q.result("a") == 5
    assert q.result("s") == {"attempt": 1, "id": "s"}
    assert threads and threads[0].startswith("streamq-job")
    info = q.get("s")
    assert info is not None and info.attempts == 1 and info.started_at and info.finished_at
    assert 110 <= q.client.ttl(q.keys.job("s")) <= 120
    assert w.stats.completed == 2


async def test_stream_holds_only_live_work(url: str, q: Queue, r: redis.Redis) -> None:
    reg = Registry()

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        return None

    ids = [x.job_id for x in q.enqueue_many([{"type": "noop"} for _ in range(500)])]
    async with running(url, q.name, reg, concurrency=50):
        await eventually(lambda: all(state(q, i) == "completed" for i in ids[-5:])
                         and r.xlen(q.keys.stream) == 0, what="drain")
    assert all(state(q, i) == "completed" for i in ids)
    assert r.xlen(q.keys.stream) == 0
    summary: Any = r.xpending(q.keys.stream, GROUP)
    assert summary["pending"] == 0


async def test_retry_with_backoff_then_success(url: str, q: Queue, r: redis.Redis) -> None:
    reg = Registry()

    @reg.handler("flaky", max_attempts=3, retry=RetryPolicy(base_s=0.05, cap_s=0.1))
    async def flaky(job: Job) -> int:
        if job.attempt == 1:
            raise ConnectionError("upstream down")
        return job.attempt

    q.enqueue("flaky", job_id="f")
    async with running(url, q.name, reg):
        await eventually(lambda: state(q, "f") == "completed", what="retry to succeed")
    info = q.get("f")
    assert info is not None and info.attempts == 2 and info.result == 2
    assert info.error is not None and info.error["type"] == "ConnectionError"  # last error kept
    assert r.hget(q.keys.stats, "retried") == b"1"


def test_backoff_is_exponential_with_full_jitter() -> None:
    policy = RetryPolicy(base_s=1.0, cap_s=10.0)
    for attempt, ceiling in [(1, 1.0), (2, 2.0), (3, 4.0), (5, 10.0), (50, 10.0)]:
        delays = [policy.delay_s(attempt) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling / 2  # jitter spreads over the whole range


async def test_explicit_retry_delay_goes_through_delayed_set(url: str, q: Queue,
                                                             r: redis.Redis) -> None:
    reg = Registry()
    gate = asyncio.Event()

    @reg.handler("later")
    async def later(job: Job) -> str:
        if job.attempt == 1:
            gate.set()
            raise Retry("not yet", delay_s=60)
        return "done"

    q.enqueue("later", job_id="l")
    async with running(url, q.name, reg):
        await asyncio.wait_for(gate.wait(), 10)
        await eventually(lambda: state(q, "l") == "retrying", what="retrying state")
    due = r.zscore(q.keys.delayed, "l")
    t = r.time()
    now_ms = t[0] * 1000 + t[1] // 1000
    assert due is not None and 55_000 < due - now_ms <= 60_000
    assert r.xlen(q.keys.stream) == 0


async def test_exhausted_attempts_dead_letter_with_reason(url: str, q: Queue,
                                                          r: redis.Redis) -> None:
    reg = Registry()

    @reg.handler("boom", max_attempts=2, retry=RetryPolicy(base_s=0.01, cap_s=0.01))
    async def boom(job: Job) -> None:
        raise ValueError(f"bad input on attempt {job.attempt}")

    q.enqueue("boom", job_id="b")
    async with running(url, q.name, reg):
        await eventually(lambda: state(q, "b") == "failed", what="dead-letter")
    info = q.get("b")
    assert info is not None and info.attempts == 2 and info.reason == "attempts exhausted"
    assert info.error is not None and info.error["type"] == "ValueError"
    assert "attempt 2" in info.error["message"] and "boom" in info.error["traceback"]
    dead: Any = r.xrange(q.keys.dead)
    assert len(dead) == 1 and dead[0][1][b"job"] == b"b" and dead[0][1][b"etype"] == b"ValueError"
    assert 0 < r.ttl(q.keys.job("b")) <= 14 * 24 * 3600
    with pytest.raises(JobFailed, match="ValueError"):
        q.result("b")


async def test_fail_dead_letters_at_once(url: str, q: Queue) -> None:
    reg = Registry()

    @reg.handler("nope", max_attempts=5)
    async def nope(job: Job) -> None:
        raise Fail("invalid address")

    q.enqueue("nope", job_id="n")
    async with running(url, q.name, reg):
        await eventually(lambda: state(q, "n") == "failed", what="Fail")
    info = q.get("n")
    assert info is not None and info.attempts == 1 and info.reason == "invalid address"


async def test_bad_input_is_dead_lettered_and_worker_keeps_going(
    url: str, q: Queue, r: redis.Redis
) -> None:
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> str:
        return "fine"

    @reg.handler("unserialisable")
    async def unserialisable(job: Job) -> object:
        return object()

    k = q.keys
    q.enqueue("unknown.type", job_id="u")
    q.enqueue("unserialisable", job_id="us")
    q.enqueue("ok", job_id="garbled")
    r.hset(k.job("garbled"), "b", b"ok \xff\x00not json")
    r.xadd(k.stream, {"junk": "no id field"})
    r.xadd(k.stream, {"id": "no-such-record"})
    q.enqueue("ok", job_id="after")
    async with running(url, q.name, reg) as w:
        await eventually(lambda: finished(q, "u", "us", "garbled", "after"), what="all settled")
        await eventually(lambda: r.xlen(k.stream) == 0, what="stream emptied")
        assert w._running
    assert state(q, "after") == "completed"
    reasons = {q.get(i).reason for i in ("u", "us", "garbled")}  # type: ignore[union-attr]
    assert reasons == {"unknown job type", "result not serialisable", "malformed envelope"}
    dead: Any = r.xrange(k.dead)
    by_reason = {e[1][b"reason"].decode() for e in dead}
    assert {"malformed stream entry", "job record missing"} <= by_reason
    summary: Any = r.xpending(k.stream, GROUP)
    assert summary["pending"] == 0


async def test_deadline_passed_is_dead_lettered_without_running(url: str, q: Queue) -> None:
    reg = Registry()
    ran: list[str] = []

    @reg.handler("t")
    async def t(job: Job) -> None:
        ran.append(job.id)

    q.enqueue("t", job_id="expired", deadline=0.05, delay=0.2)
    q.enqueue("t", job_id="in-time", deadline=60)
    async with running(url, q.name, reg):
        await eventually(lambda: finished(q, "expired", "in-time"), what="settle")
    assert ran == ["in-time"]
    info = q.get("expired")
    assert info is not None and info.state == "failed" and info.reason == "deadline passed"


async def test_handler_timeout_and_base_exceptions_are_job_failures(url: str, q: Queue) -> None:
    reg = Registry()

    @reg.handler("slow", timeout=0.1, max_attempts=1)
    async def slow(job: Job) -> None:
        await asyncio.sleep(30)

    @reg.handler("exits", max_attempts=1)
    async def exits(job: Job) -> None:
        raise SystemExit(3)

    @reg.handler("ok")
    async def ok(job: Job) -> int:
        return 1

    for jid, t in [("slow", "slow"), ("exits", "exits"), ("ok", "ok")]:
        q.enqueue(t, job_id=jid)
    async with running(url, q.name, reg):
        await eventually(lambda: finished(q, "slow", "exits", "ok"), what="settle")
    slow_info, exit_info = q.get("slow"), q.get("exits")
    assert slow_info is not None and slow_info.error is not None
    assert slow_info.error["type"] == "TimeoutError" and "0.1" in slow_info.error["message"]
    assert exit_info is not None and exit_info.error is not None
    assert exit_info.error["type"] == "SystemExit"
    assert state(q, "ok") == "completed"


async def test_concurrency_is_bounded(url: str, q: Queue) -> None:
    reg = Registry()
    live = 0
    peak = 0

    @reg.handler("t")
    async def t(job: Job) -> None:
        nonlocal live, peak
        live += 1
        peak = max(peak, live)
        await asyncio.sleep(0.01)
        live -= 1

    ids = [x.job_id for x in q.enqueue_many([{"type": "t"} for _ in range(200)])]
    async with running(url, q.name, reg, concurrency=7):
        await eventually(lambda: finished(q, *ids), timeout_s=20, what="drain")
    assert peak == 7


async def test_stale_completion_is_rejected_and_counted(url: str, q: Queue,
                                                        r: redis.Redis) -> None:
    """Fencing: a worker whose lease was taken over cannot overwrite the new owner's result."""
    reg = Registry()
    started = asyncio.Event()
    release = asyncio.Event()

    @reg.handler("t")
    async def t(job: Job) -> str:
        started.set()
        await release.wait()
        return "stale result"

    q.enqueue("t", job_id="j")
    async with running(url, q.name, reg, visibility_timeout_s=60) as w:
        await asyncio.wait_for(started.wait(), 10)
        k = q.keys
        # another consumer takes the entry over and starts it (what a reclaim does)
        entry: Any = field(r, k.job("j"), "entry")
        assert entry is not None
        r.xclaim(k.stream, GROUP, "other", 0, [entry], justid=True)
        reply: Any = start_entries(r, k, "other", [(entry.decode(), "j")])
        assert reply[0] == b"run" and reply[2] == 2
        release.set()
        await eventually(lambda: w.stats.lost == 1, what="stale finish to be rejected")
    rec = record(r, k.job("j"))
    assert rec[b"state"] == b"active" and rec[b"owner"] == b"other"
    assert rec[b"token"] == reply[1] and b"result" not in rec
    assert r.hget(k.stats, "lease_lost") == b"1"
    # the new owner settles normally
    done = SCRIPTS["finish"](r, [k.stream, k.delayed, k.dead, k.stats, k.events, k.job("j")],
                             [GROUP, 100, 3600, 1000, "", 1, "j", entry.decode(), reply[1],
                              "ok", b'"new result"', 0, ""])
    assert done == [b"completed"] and q.result("j") == "new result"
    # settling twice (a client retry) answers with the state and changes nothing
    again = SCRIPTS["finish"](r, [k.stream, k.delayed, k.dead, k.stats, k.events, k.job("j")],
                              [GROUP, 100, 3600, 1000, "", 1, "j", entry.decode(), reply[1],
                               "ok", b'"other"', 0, ""])
    assert again == [b"completed"] and q.result("j") == "new result"
    assert r.hget(k.stats, "completed") == b"1"


def test_lease_is_renewed_while_a_handler_blocks_the_event_loop(url: str, q: Queue,
                                                                r: redis.Redis) -> None:
    """A blocking async handler starves the loop, not the lease thread (streaq#146)."""
    reg = Registry()

    @reg.handler("blocker")
    async def blocker(job: Job) -> str:
        time.sleep(2.0)  # noqa: ASYNC251 - deliberately blocks the event loop
        return "done"

    q.enqueue("blocker", job_id="b")
    r.xgroup_create(q.keys.stream, GROUP, id="0")
    worker = Worker(url, [q.name], reg, fast(visibility_timeout_s=0.6))
    stop = threading.Event()

    async def serve() -> None:
        async with worker:
            await asyncio.to_thread(stop.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        idle_seen: list[int] = []
        while state(q, "b") != "completed" and time.monotonic() < deadline:
            pending: Any = r.xpending_range(q.keys.stream, GROUP, "-", "+", 10)
            idle_seen += [p["time_since_delivered"] for p in pending]
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(15)
    assert state(q, "b") == "completed"
    info = q.get("b")
    assert info is not None and info.attempts == 1  # never reclaimed
    assert idle_seen and max(idle_seen) < 600, f"lease lapsed: idle up to {max(idle_seen)} ms"
    assert r.hget(q.keys.stats, "lease_lost") is None


async def test_graceful_stop_finishes_short_jobs_and_hands_back_long_ones(
    url: str, q: Queue, r: redis.Redis
) -> None:
    reg = Registry()
    started: set[str] = set()

    @reg.handler("short")
    async def short(job: Job) -> str:
        started.add(job.id)
        await asyncio.sleep(0.2)
        return "short done"

    @reg.handler("long")
    async def long(job: Job) -> str:
        started.add(job.id)
        await asyncio.sleep(60)
        return "never"

    q.enqueue("short", job_id="s")
    q.enqueue("long", job_id="l")
    worker = Worker(url, [q.name], reg, fast(grace_period_s=0.5, visibility_timeout_s=60))
    await worker.start()
    await eventually(lambda: started == {"s", "l"}, what="both started")
    await worker.stop()
    assert state(q, "s") == "completed"
    info = q.get("l")
    assert info is not None and info.state == "queued" and info.attempts == 0  # refunded
    assert r.xlen(q.keys.stream) == 1
    assert r.xpending(q.keys.stream, GROUP)["pending"] == 0
    assert worker.stats.released == 1


async def test_lapsed_leases_are_reclaimed_and_counted(url: str, q: Queue,
                                                       r: redis.Redis) -> None:
    """Entries held by a dead consumer are found with XAUTOCLAIM and re-run."""
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    for i in range(250):
        q.enqueue("t", job_id=f"j{i}")
    q.enqueue("t", job_id="once", max_attempts=1)
    # a consumer that died: it read everything; it started 'once' and j0 before dying
    r.xreadgroup(GROUP, "dead-consumer", {k.stream: ">"}, count=1000)
    for jid in ("once", "j0"):
        entry: Any = field(r, k.job(jid), "entry")
        assert entry is not None
        start_entries(r, k, "dead-consumer", [(entry.decode(), jid)])
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> int:
        return job.attempt

    ids = [f"j{i}" for i in range(250)]
    async with running(url, q.name, reg, concurrency=64, visibility_timeout_s=0.3,
                       reclaim_interval_s=0.05) as w:
        await eventually(lambda: finished(q, *ids, "once"), timeout_s=20, what="reclaim all")
    assert q.result("j0") == 2 and q.result("j1") == 1
    once = q.get("once")
    assert once is not None and once.state == "failed"
    assert once.reason == "attempts exhausted (lease lapsed)"
    assert w.stats.reclaimed >= 250
    assert r.xpending(k.stream, GROUP)["pending"] == 0


async def test_restarted_worker_takes_back_its_own_pending_entries_at_once(
    url: str, q: Queue, r: redis.Redis
) -> None:
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="mine")
    r.xreadgroup(GROUP, "host:1:0", {k.stream: ">"}, count=10)  # delivered, then the process died
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> str:
        return "ok"

    async with Worker(url, [q.name], reg, fast(visibility_timeout_s=3600), consumer="host:1:0"):
        await eventually(lambda: state(q, "mine") == "completed", timeout_s=5,
                         what="own pending entry to run without waiting for the timeout")


async def test_delayed_jobs_are_promoted_by_workers(url: str, q: Queue) -> None:
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> str:
        return "ran"

    q.enqueue("t", job_id="d", delay=0.3)
    async with running(url, q.name, reg):
        await eventually(lambda: state(q, "d") == "completed", what="promotion")
    info = q.get("d")
    assert info is not None and info.due_at and info.started_at
    assert info.started_at >= info.due_at


async def test_pause_stops_fetching_and_resume_continues(url: str, q: Queue,
                                                         r: redis.Redis) -> None:
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> str:
        return "ran"

    r.set(q.keys.paused, 1)
    q.enqueue("t", job_id="p")
    async with running(url, q.name, reg) as w:
        await eventually(lambda: all(s.paused for s in w._qs.values()), what="pause seen")
        await asyncio.sleep(0.3)  # a paused worker must not take the job in this window
        assert state(q, "p") == "queued"
        r.delete(q.keys.paused)
        await eventually(lambda: state(q, "p") == "completed", what="resume")


async def test_one_worker_serves_several_queues(url: str, qname: str) -> None:
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> str:
        return job.queue

    qa, qb = Queue.from_url(url, qname + "-a"), Queue.from_url(url, qname + "-b")
    qa.enqueue("t", job_id="x")
    qb.enqueue("t", job_id="x")
    async with Worker(url, [qa.name, qb.name], reg, fast()):
        await eventually(lambda: state(qa, "x") == state(qb, "x") == "completed", what="both")
    assert qa.result("x") == qa.name and qb.result("x") == qb.name


async def test_versioned_handlers(url: str, q: Queue) -> None:
    reg = Registry()

    @reg.handler("report")
    async def any_version(job: Job) -> str:
        return "generic"

    @reg.handler("report", version=2)
    async def v2(job: Job) -> str:
        return "v2"

    q.enqueue("report", job_id="v1")
    q.enqueue("report", job_id="v2", version=2)
    async with running(url, q.name, reg):
        await eventually(lambda: finished(q, "v1", "v2"), what="both versions")
    assert (q.result("v1"), q.result("v2")) == ("generic", "v2")


async def test_enqueue_and_wait_returns_result_or_raises(url: str, q: Queue) -> None:
    reg = Registry()

    @reg.handler("double")
    async def double(job: Job) -> int:
        return int(job.payload) * 2

    @reg.handler("fails")
    async def fails(job: Job) -> None:
        raise Fail("no")

    async with running(url, q.name, reg):
        assert await asyncio.to_thread(q.enqueue_and_wait, "double", 21, timeout=10) == 42
        with pytest.raises(JobFailed, match="no"):
            await asyncio.to_thread(q.enqueue_and_wait, "fails", None, timeout=10)


def test_prune_keeps_consumers_with_pending_entries(q: Queue, r: redis.Redis) -> None:
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t")
    r.xreadgroup(GROUP, "holding", {k.stream: ">"}, count=1)
    r.xgroup_createconsumer(k.stream, GROUP, "empty")
    r.xgroup_createconsumer(k.stream, GROUP, "alive-empty")
    r.zadd(k.workers, {"alive-empty": int(time.time() * 1000)})

    def prune(name: str) -> Any:
        return SCRIPTS["prune"](r, [k.stream, k.workers], [GROUP, 60_000, name])

    assert prune("holding") == []
    assert prune("alive-empty") == []
    assert prune("empty") == [b"empty"]
    names = {c["name"] for c in r.xinfo_consumers(k.stream, GROUP)}
    assert names == {b"holding", b"alive-empty"}


def test_registry_and_config_validation() -> None:
    reg = Registry()
    reg.register("a", lambda job: None)
    with pytest.raises(RegistryError):
        reg.register("a", lambda job: None)
    with pytest.raises(RegistryError):
        reg.register("bad name", lambda job: None)
    with pytest.raises(InvalidArgument):
        reg.register("b", lambda job: None, max_attempts=0)
    bads: list[dict[str, Any]] = [{"concurrency": 0}, {"visibility_timeout_s": 0},
                                  {"visibility_timeout_s": -1.0},
                                  {"block_ms": 0}, {"grace_period_s": float("nan")}]
    for bad in bads:
        with pytest.raises(InvalidArgument):
            WorkerConfig(**bad)


async def test_a_handlers_own_timeout_error_is_an_ordinary_failure(url: str, q: Queue) -> None:
    reg = Registry()

    @reg.handler("upstream", max_attempts=2, retry=RetryPolicy(base_s=0.01, cap_s=0.01))
    async def upstream(job: Job) -> None:
        raise TimeoutError("upstream API timed out")  # not the worker's timeout

    q.enqueue("upstream", job_id="u")
    async with running(url, q.name, reg):
        await eventually(lambda: state(q, "u") == "failed", what="dead-letter")
    info = q.get("u")
    assert info is not None and info.attempts == 2 and info.reason == "attempts exhausted"
    assert info.error is not None and info.error["message"] == "upstream API timed out"
    assert [e["type"] for e in info.errors] == ["TimeoutError", "TimeoutError"]


async def test_a_corrupted_record_is_dead_lettered_and_its_batch_runs(
    url: str, q: Queue, r: redis.Redis
) -> None:
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> str:
        return "ok"

    q.enqueue_many([{"type": "t", "job_id": f"g{i}"} for i in range(3)])
    r.xadd(q.keys.stream, {"id": "broken"})
    r.rpush(q.keys.job("broken"), "not", "a", "hash")  # a record key of the wrong type
    async with running(url, q.name, reg):
        await eventually(lambda: finished(q, "g0", "g1", "g2"), what="the good jobs")
        await eventually(lambda: r.xlen(q.keys.dead) == 1, what="the corrupted one dead")
    dead: Any = r.xrange(q.keys.dead)
    assert dead[0][1][b"reason"] == b"job record corrupted"
    assert r.xpending(q.keys.stream, GROUP)["pending"] == 0


async def test_handlers_see_the_deadline_however_it_was_given(url: str, q: Queue,
                                                              r: redis.Redis) -> None:
    reg = Registry()
    seen: dict[str, int] = {}

    @reg.handler("t")
    async def t(job: Job) -> None:
        seen[job.id] = job.deadline_ms

    q.enqueue("t", job_id="rel", deadline=60)
    q.enqueue("t", job_id="none")
    async with running(url, q.name, reg):
        await eventually(lambda: finished(q, "rel", "none"), what="both")
    now: Any = r.time()
    now_ms = now[0] * 1000 + now[1] // 1000
    assert now_ms < seen["rel"] <= now_ms + 60_000 and seen["none"] == 0


async def test_msgpack_serde_round_trips_binary_payloads(url: str, qname: str) -> None:
    from streamq import MsgpackSerde, QueueConfig

    cfg = QueueConfig(serde=MsgpackSerde())
    q = Queue.from_url(url, qname, cfg)
    reg = Registry()

    @reg.handler("echo")
    async def echo(job: Job) -> Any:
        return {"got": job.payload, "size": len(job.payload["blob"])}

    q.enqueue("echo", {"blob": b"\x00\xffbinary"}, job_id="m")
    async with Worker(url, [qname], reg, fast(), cfg):
        await eventually(lambda: state(q, "m") == "completed", what="the msgpack job")
    assert q.result("m") == {"got": {"blob": b"\x00\xffbinary"}, "size": 8}


def test_a_stale_delivery_cannot_restart_a_job_under_a_live_lease(q: Queue,
                                                                   r: redis.Redis) -> None:
    """B read an entry, stalled; A took it over and started it. B's late start is skipped."""
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="s")
    r.xreadgroup(GROUP, "B", {k.stream: ">"}, count=1)
    entry: Any = field(r, k.job("s"), "entry")
    r.xclaim(k.stream, GROUP, "A", 0, [entry])

    def start(consumer: str) -> Any:
        return start_entries(r, k, consumer, [(entry.decode(), "s")])

    a = start("A")
    assert a[0] == b"run"
    assert start("B")[0] == b"skip"  # not B's entry any more
    rec = record(r, k.job("s"))
    assert rec[b"owner"] == b"A" and rec[b"attempts"] == b"1"
    assert rec[b"token"] == a[1]


def test_a_batch_start_runs_exactly_the_callers_own_entries(q: Queue, r: redis.Redis) -> None:
    """In one start.lua batch, entries another consumer took over are skipped and left alone;
    the caller's own entries start, however many others it holds."""
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    n = 1_010
    q.enqueue_many([{"type": "t", "job_id": f"j{i}"} for i in range(n)])
    r.xreadgroup(GROUP, "A", {k.stream: ">"}, count=n)
    entries = {f"j{i}": field(r, k.job(f"j{i}"), "entry").decode()  # type: ignore[union-attr]
               for i in range(n)}
    # B took over one entry in the middle and the second-to-last one (A's are now stale)
    stale = {"j500", f"j{n - 2}"}
    r.xclaim(k.stream, GROUP, "B", 0, [entries[j] for j in stale])
    batch = ["j0", "j500", "j999", f"j{n - 2}", f"j{n - 1}"]
    out = start_entries(r, k, "A", [(entries[j], j) for j in batch])
    codes = dict(zip(batch, out[::7], strict=True))
    assert codes == {j: (b"skip" if j in stale else b"run") for j in batch}
    for j in batch:
        rec = record(r, k.job(j))
        assert rec[b"state"] == (b"queued" if j in stale else b"active")
