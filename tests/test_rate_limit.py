"""The queue-wide rate limit (docs/fairness.md#queue-wide-rate-limit) against a real
redis-server: GCRA inside claim.lua and start.lua, never more than the limit in any window."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from helpers import eventually, fast

from streamq import InvalidArgument, Job, Queue, QueueConfig, Registry, Worker
from streamq._core.config import RateLimit
from streamq._core.keys import GROUP, Keys
from streamq._core.scripts import SCRIPTS
from streamq._worker.calls import claim_call, claim_read


def test_rate_limit_is_validated() -> None:
    for bad in ({"limit": 0}, {"limit": 5, "burst": 6}, {"limit": 5, "period_s": 0},
                {"limit": 5, "period_s": float("inf")}, {"limit": True}):
        with pytest.raises(InvalidArgument):
            RateLimit(**bad)
    with pytest.raises(InvalidArgument, match="at least 4"):
        QueueConfig(shards=4, rate_limit=RateLimit(3))
    with pytest.raises(InvalidArgument):
        QueueConfig(rate_limit=(10, 1.0))  # type: ignore[arg-type]
    # shards divide the limit: 10 over 3 shards is 4 + 3 + 3
    rl = RateLimit(10, 1.0)
    assert [round(1_000_000 / rl.gcra(i, 3)[0]) for i in range(3)] == [4, 3, 3]
    assert rl.gcra(0, 1) == (100_000, 0)
    assert RateLimit(10, 1.0, burst=5).gcra(0, 1) == (166_667, 4 * 166_667)


def test_claim_reads_only_what_the_rate_allows(r: redis.Redis, qname: str, url: str) -> None:
    k = Keys(qname)
    cfg = QueueConfig(rate_limit=RateLimit(3, 10.0, burst=3))
    with Queue.from_url(url, qname) as q:
        q.enqueue_many([{"type": "t", "job_id": f"j{i}"} for i in range(10)])
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    reply: Any = SCRIPTS["claim"](r, *claim_call(k, "c", cfg, "p", 1, 10))
    assert reply[0] == b"ok" and reply[2] == 3 and claim_read(reply) == 3
    assert 9990 <= reply[3] <= 10000  # all 3 of the period went at once: the next in 10 s
    again: Any = SCRIPTS["claim"](r, *claim_call(k, "c", cfg, "p", 20, 10))
    assert again[0] == b"limited" and len(again) == 4 and again[3] > 9000
    assert r.xpending(k.stream, GROUP)["pending"] == 3  # nothing more was read
    assert r.pttl(k.rate) > 0  # the limiter's state expires on its own


async def test_never_over_the_limit_in_any_window_with_several_workers(
        url: str, qname: str, r: redis.Redis) -> None:
    """Three workers on a 2-shard queue limited to 12 starts per 500 ms (burst 4): over the
    start times the server recorded, no window of 500 ms holds more than 12."""
    limit, period_ms, jobs = 12, 500, 60
    cfg = QueueConfig(shards=2, rate_limit=RateLimit(limit, period_ms / 1000, burst=4))
    done: list[str] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        done.append(job.id)

    with Queue.from_url(url, qname, config=cfg) as q:
        q.enqueue_many([{"type": "t", "job_id": f"j{i}"} for i in range(jobs)])
        workers = [Worker(url, [qname], reg, fast(concurrency=8), cfg, consumer=f"w{i}")
                   for i in range(3)]
        for w in workers:
            await w.start()
        try:
            await eventually(lambda: len(done) == jobs, timeout_s=30, what="every job")
        finally:
            for w in workers:
                await w.stop()
        starts = sorted(int(r.hget(q.keys.for_job(f"j{i}", 2).job(f"j{i}"), "a") or 0)
                        for i in range(jobs))
        assert sorted(done) == sorted(f"j{i}" for i in range(jobs))
        assert all(q.get(f"j{i}").attempts == 1 for i in range(jobs))  # type: ignore
    worst = max(sum(1 for t in starts[i:] if t < s + period_ms) for i, s in enumerate(starts))
    assert worst <= limit, (worst, starts)
    assert worst >= limit // 2  # and the limiter is not far stricter than asked


async def test_a_start_over_the_rate_is_handed_back_without_an_attempt(
        url: str, qname: str, r: redis.Redis) -> None:
    """An idle worker's blocking read takes the entry; start.lua finds the rate spent (the
    limiter's state set 1.5 s ahead): the job goes back to the stream, no attempt counted,
    and runs once the rate allows it."""
    cfg = QueueConfig(rate_limit=RateLimit(1000, 1.0))
    ran: list[int] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        ran.append(job.attempt)

    k = Keys(qname)
    with Queue.from_url(url, qname, config=cfg) as q:
        async with Worker(url, [qname], reg, fast(), cfg) as w:
            await eventually(lambda: w._qs[qname].idle, what="the worker to wait idle")
            sec, usec = r.time()
            ahead = int(sec) * 1_000_000 + int(usec) + 1_500_000
            r.set(k.rate, ahead, px=5000)
            q.enqueue("t", job_id="x")
            await eventually(lambda: int(r.hget(k.stats, "released") or 0) >= 1,
                             what="the start handed back")
            assert ran == [] and q.get("x").attempts == 0  # type: ignore[union-attr]
            await eventually(lambda: ran == [1], timeout_s=10, what="the job to run")
            started = int(r.hget(k.job("x"), "a") or 0)
            assert started * 1000 >= ahead - 1000  # not before the rate allowed it
        assert q.get("x").attempts == 1  # type: ignore[union-attr]
    await asyncio.sleep(0)
