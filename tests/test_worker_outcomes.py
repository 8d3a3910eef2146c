"""Worker outcomes against a real redis-server: results, retries and backoff, dead letters and
their reasons, bad input, timeouts, concurrency, promotion, pause, several queues, versioned
handlers and config validation. Leases and recovery are in test_worker_leases.py."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
import redis
from helpers import eventually, fast, finished, running, state

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
        fetch = w._sup[f"fetch from {q.keys.tag}"]
        for _ in range(2):  # two whole fetch steps run while paused: neither took the job
            seen = fetch.last_progress

            def stepped(seen: float = seen) -> bool:
                return fetch.last_progress > seen

            await eventually(stepped, what="a fetch step")
        assert state(q, "p") == "queued" and w.stats.started == 0
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
