"""Misbehaving handlers and extreme accepted options (DESIGN.md invariant 9): unserialisable
results, BaseException subclasses and hangs past the timeout are job failures with a reason, and
whatever ``enqueue`` accepts (huge TTLs, far deadlines, a deadline before 1970) settles cleanly;
neighbours and later jobs complete and the worker keeps running.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
from helpers import eventually, fast
from sec_support import (
    bad_input_queue,  # noqa: F401 - the q fixture
    reason_of,
    server_ms,
    settled,
    state,
    still_working,
)
from sec_support import bad_input_registry as registry

from streamq import InvalidArgument, Job, Queue, RetryPolicy, Worker

# ------------------------------------------------------------------ misbehaving handlers


class Raising(dict[str, Any]):
    """A mapping whose serialisation raises something else than TypeError/ValueError."""

    def items(self) -> Any:
        raise KeyError("items() exploded")


def _cyclic() -> Any:
    a: list[Any] = []
    a.append(a)
    return a


def _deep() -> Any:
    x: Any = []
    for _ in range(100_000):
        x = [x]
    return x


UNSERIALISABLE: dict[str, Callable[[], Any]] = {
    "object": object, "set": lambda: {1, 2}, "bytes": lambda: b"raw", "nan": lambda: math.nan,
    "inf": lambda: {"x": -math.inf}, "cyclic": _cyclic, "deep": _deep,
    "surrogate": lambda: "\udc80", "huge-int": lambda: 10**5000,
    "tuple-key": lambda: {(1, 2): 3}, "raising-mapping": lambda: Raising(a=1),
    "complex": lambda: 1 + 2j, "exception": lambda: ValueError("x"),
}


@pytest.mark.parametrize("kind", sorted(UNSERIALISABLE))
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_unserialisable_results_go_to_the_retry_policy(
    url: str, q: Queue, r: redis.Redis, kind: str, sync: bool
) -> None:
    """The side effects already ran, so the handler's policy decides (as for any failure);
    once attempts are exhausted the dead letter says why."""
    reg = registry()
    make = UNSERIALISABLE[kind]
    fast_retry = RetryPolicy(base_s=0.01, cap_s=0.01)
    if sync:
        reg.register("bad", lambda job: make(), max_attempts=3, retry=fast_retry)
    else:
        async def bad(job: Job) -> Any:
            return make()
        reg.register("bad", bad, max_attempts=3, retry=fast_retry)
    q.enqueue("ok", job_id="n1")
    q.enqueue("bad", job_id="victim")
    q.enqueue("ok", job_id="n2")
    async with Worker(url, [q.name], reg, fast()) as w:
        await eventually(lambda: settled(r, q, "n1", "n2", "victim"), timeout_s=8,
                         what=f"the {kind} result to settle")
        await still_working(r, q, w)
    info = q.get("victim")
    assert info is not None and info.state == "failed"
    assert info.reason == "result not serialisable" and info.attempts == 3
    assert info.error is not None and info.error["type"] == "SerializationError"


class CustomBase(BaseException):
    pass


def _raise(kind: str) -> None:
    exc: BaseException = {
        "SystemExit": SystemExit(3), "KeyboardInterrupt": KeyboardInterrupt(),
        "GeneratorExit": GeneratorExit(), "CustomBase": CustomBase("custom"),
        "CancelledError": asyncio.CancelledError(),
    }[kind]
    raise exc


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "GeneratorExit",
                                  "CustomBase", "CancelledError"])
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_base_exceptions_from_handlers_are_job_failures(
    url: str, q: Queue, r: redis.Redis, kind: str, sync: bool
) -> None:
    reg = registry()
    if sync:
        reg.register("bad", lambda job: _raise(kind), max_attempts=2,
                     retry=RetryPolicy(base_s=0.01, cap_s=0.01))
    else:
        async def bad(job: Job) -> None:
            _raise(kind)
        reg.register("bad", bad, max_attempts=2, retry=RetryPolicy(base_s=0.01, cap_s=0.01))
    q.enqueue("ok", job_id="n1")
    q.enqueue("bad", job_id="victim")
    async with Worker(url, [q.name], reg, fast()) as w:
        await eventually(lambda: settled(r, q, "n1", "victim"), timeout_s=6,
                         what=f"the job raising {kind} to settle")
        await still_working(r, q, w)
    info = q.get("victim")
    assert info is not None and info.state == "failed" and info.attempts == 2
    assert info.reason == "attempts exhausted"
    assert info.error is not None and info.error["type"] == kind
    assert [e["type"] for e in info.errors] == [kind, kind]


async def test_handlers_hanging_past_their_timeout_fail_with_a_reason(
    url: str, q: Queue, r: redis.Redis
) -> None:
    reg = registry()
    release = threading.Event()

    @reg.handler("sleeps", timeout=0.2, max_attempts=1)
    async def sleeps(job: Job) -> None:
        await asyncio.sleep(60)

    @reg.handler("blocks", timeout=0.2, max_attempts=1)
    def blocks(job: Job) -> None:
        release.wait(30)

    @reg.handler("stubborn", timeout=0.2, max_attempts=1)
    async def stubborn(job: Job) -> str:
        end = time.monotonic() + 4.0  # ignores cancellation for 4 s
        while time.monotonic() < end:
            try:
                await asyncio.sleep(end - time.monotonic())
            except asyncio.CancelledError:
                continue
        return "too late"

    try:
        for t in ("sleeps", "blocks", "stubborn"):
            q.enqueue(t, job_id=t)
        async with Worker(url, [q.name], reg, fast()) as w:
            await eventually(lambda: settled(r, q, "sleeps", "blocks"), timeout_s=5,
                             what="the hanging jobs")
            await still_working(r, q, w)
            q.enqueue("sync-ok", "still", job_id="sync-after")  # a pool thread is still free
            await eventually(lambda: state(r, q, "sync-after") == "completed",
                             what="a sync job after the hung one")
            await eventually(lambda: settled(r, q, "stubborn"), timeout_s=2.5,
                             what="the handler that ignores cancellation to be timed out")
        for jid in ("sleeps", "blocks", "stubborn"):
            info = q.get(jid)
            assert info is not None and info.state == "failed", (jid, info)
            assert info.error is not None and info.error["type"] == "TimeoutError", jid
            assert "0.2" in info.error["message"]
    finally:
        release.set()


# ------------------------------------------------------------------ extreme accepted options


async def test_extreme_options_that_are_accepted_also_run(url: str, q: Queue,
                                                          r: redis.Redis) -> None:
    """Whatever enqueue accepts must settle cleanly: a result TTL Redis's EXPIRE refuses, or a
    deadline no integer can hold, must be refused at the door, not break a worker's batch."""
    seen: dict[str, int] = {}
    reg = registry()

    @reg.handler("t")
    async def t(job: Job) -> str:
        seen[job.id] = job.deadline_ms
        return "done"

    candidates: dict[str, dict[str, Any]] = {
        "ttl-1e16": {"result_ttl": 1e16}, "ttl-1e300": {"result_ttl": 1e300},
        "ttl-timedelta-max": {"result_ttl": dt.timedelta.max},
        "deadline-1e300": {"deadline": 1e300}, "deadline-1e13": {"deadline": 1e13},
        "deadline-timedelta-max": {"deadline": dt.timedelta.max},
        "attempts-max": {"max_attempts": 10_000},
    }
    accepted = []
    for jid, options in candidates.items():
        try:
            q.enqueue("t", job_id=jid, **options)
            accepted.append(jid)
        except InvalidArgument:
            pass
    q.enqueue("t", job_id="neighbour")
    async with Worker(url, [q.name], reg, fast(visibility_timeout_s=2.0)) as w:
        await eventually(lambda: settled(r, q, "neighbour", *accepted), timeout_s=8,
                         what="accepted extreme jobs")
        await still_working(r, q, w)
    assert w.stats.lost == 0, "a settle batch failed"
    now = server_ms(r)
    for jid in [*accepted, "neighbour"]:
        info = q.get(jid)
        assert info is not None and info.state == "completed" and info.attempts == 1, info
        assert seen[jid] == 0 or now < seen[jid] < 2**53, (jid, seen[jid])
        ttl: Any = r.ttl(q.keys.job(jid))
        assert ttl > 0, f"{jid}: a finished record must expire"


async def test_a_deadline_before_1970_is_already_passed(url: str, q: Queue, r: redis.Redis) -> None:
    ran: list[str] = []
    reg = registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        ran.append(job.id)

    try:
        q.enqueue("t", job_id="old", deadline=dt.datetime(1960, 1, 1, tzinfo=dt.UTC))
    except InvalidArgument:
        return
    async with Worker(url, [q.name], reg, fast()) as w:
        await eventually(lambda: settled(r, q, "old"), what="the expired job")
        await still_working(r, q, w)
    assert ran == [] and reason_of(r, q, "old") == "deadline passed"
