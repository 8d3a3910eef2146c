"""Handler-raised RateLimited, against a real redis-server: it puts a job back for
``retry_after`` seconds without counting an attempt (with ``group=True``, its whole group), and
an invalid ``retry_after`` is an ordinary failure. Cancel is in test_cancel_running.py."""

from __future__ import annotations

import itertools
import math
import time
from typing import Any

import pytest
import redis
from helpers import eventually, fast, field, finish, started, state

from streamq import Job, Queue, RateLimited, Registry, StreamqError, Worker
from streamq._core.keys import GROUP


def test_rate_limited_is_a_streamq_error() -> None:
    exc = RateLimited(retry_after=2.5)
    assert isinstance(exc, StreamqError) and exc.retry_after == 2.5


async def test_rate_limited_comes_back_later_without_counting_an_attempt(
        url: str, q: Queue) -> None:
    reg = Registry()
    calls: list[tuple[int, float]] = []

    @reg.handler("api", max_attempts=1)
    async def api(job: Job) -> str:
        calls.append((job.attempt, time.monotonic()))
        if len(calls) <= 2:
            raise RateLimited(retry_after=0.3)
        return "ok"

    q.enqueue("api", job_id="rl", headers={"h": "v"})
    async with Worker(url, [q.name], reg, fast()) as w:
        await eventually(lambda: state(q, "rl") == "completed", what="completed")
        await eventually(lambda: w.stats.rate_limited == 2 and w.stats.retried == 0,
                         what="the worker's counts (taken when Redis answers)")
    assert q.result("rl") == "ok"
    assert [a for a, _t in calls] == [1, 1, 1]
    assert all(b - a >= 0.29 for (_x, a), (_y, b) in itertools.pairwise(calls))
    info = q.get("rl")
    assert info is not None and info.attempts == 1 and info.errors == []
    assert info.envelope is not None and info.envelope.headers == {"h": "v"}
    counters = q.client.hgetall(q.keys.stats)
    assert int(counters[b"rate_limited"]) == 2 and b"retried" not in counters
    assert int(counters.get(b"retrying_now", 0)) == 0


def test_rate_limited_puts_the_job_in_the_delayed_set(r: redis.Redis, q: Queue) -> None:
    r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    entry, token = started(r, q, "later")
    now_ms = int(r.time()[0]) * 1000
    assert finish(r, q, "later", entry, token, "later", 5000) == [b"retrying"]
    due = r.zscore(q.keys.delayed, "later")
    assert due is not None and now_ms + 4000 <= due <= now_ms + 7000
    assert field(r, q.keys.job("later"), "attempts") == b"0"
    assert finish(r, q, "later", entry, token, "later", 5000) == [b"retrying"]  # repeat
    assert field(r, q.keys.job("later"), "attempts") == b"0"


@pytest.mark.parametrize("bad", [0, -1, math.nan, math.inf, 86401, "5", True, None])
async def test_invalid_retry_after_is_an_ordinary_failure(url: str, q: Queue, bad: Any) -> None:
    reg = Registry()

    @reg.handler("api", max_attempts=1)
    async def api(job: Job) -> None:
        raise RateLimited(retry_after=bad)

    q.enqueue("api", job_id="bad")
    async with Worker(url, [q.name], reg, fast()) as w:
        await eventually(lambda: state(q, "bad") == "failed", what="dead-lettered")
        assert w.stats.rate_limited == 0
    info = q.get("bad")
    assert info is not None and info.error is not None
    assert info.error["type"] == "InvalidArgument" and "retry_after" in info.error["message"]


HOLD_S = 3.0
"""RateLimited's retry_after in the whole-group test."""


@pytest.mark.parametrize("whole_group", [True, False])
async def test_rate_limited_group_holds_the_whole_group_back(url: str, q: Queue,
                                                             whole_group: bool) -> None:
    """RateLimited(group=True): no job of the group starts until retry_after has passed;
    another group goes on meanwhile. Without it, the group's next job starts at once."""
    reg = Registry()
    starts: dict[str, list[float]] = {}
    limited_at: list[float] = []

    @reg.handler("api")
    async def api(job: Job) -> str:
        starts.setdefault(job.id, []).append(time.monotonic())
        if job.id == "a" and not limited_at:
            limited_at.append(time.monotonic())
            raise RateLimited(retry_after=HOLD_S, group=whole_group)
        return job.id

    q.enqueue("api", job_id="a", group="g1")
    q.enqueue("api", job_id="b", group="g1")
    async with Worker(url, [q.name], reg, fast()) as w:
        await eventually(lambda: bool(limited_at), what="a rate limited")
        q.enqueue("api", job_id="other", group="g2")
        await eventually(lambda: all(state(q, j) == "completed" for j in ("a", "b", "other")),
                         what="all completed")
        await eventually(lambda: w.stats.rate_limited == 1, what="the worker's count")
    t0 = limited_at[0]
    # held: not before HOLD_S; not held: well before it (a wide margin: a loaded machine)
    assert starts["other"][0] - t0 < HOLD_S - 1.0  # another group is not held
    if whole_group:
        assert starts["b"][0] - t0 >= HOLD_S - 0.05 and starts["a"][1] - t0 >= HOLD_S - 0.05
    else:
        assert starts["b"][0] - t0 < HOLD_S - 1.0
    info = q.get("a")
    assert info is not None and info.attempts == 1
