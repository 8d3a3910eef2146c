"""Progress and job logs from handlers (issue 19 item 9): in the record, the events stream, the
admin API and `streamq job`; followed by a waiter; bounded; fenced by the lease token."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import threading
import time
from typing import Any

import pytest
import redis
from helpers import eventually, fast

from streamq import InvalidArgument, Job, Queue, Registry, Worker
from streamq._core.scripts import SCRIPTS, Script
from streamq.admin import Admin
from streamq.cli.main import main as cli


async def test_progress_and_log_lines_are_visible_while_the_job_runs(url: str, q: Queue,
                                                                    r: redis.Redis) -> None:
    reg = Registry()
    gate = asyncio.Event()

    @reg.handler("import")
    async def run_import(job: Job) -> str:
        job.log("reading the file")
        await job.progress({"done": 2, "of": 3})
        await gate.wait()
        return "ok"

    q.enqueue("import", job_id="imp-1")
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: (q.get("imp-1").progress  # type: ignore[union-attr]
                                  == {"done": 2, "of": 3}), what="the progress in the record")
        info = Admin.from_url(url).job(q.name, "imp-1")
        assert info.state == "active" and [ln["m"] for ln in info.logs] == ["reading the file"]
        events: Any = r.xrange(q.keys.events)
        details = [e[1][b"d"] for e in events if e[1][b"ev"] == b"progress"]
        assert b'{"done":2,"of":3}' in details
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert cli(["--url", url, "job", q.name, "imp-1"]) == 0
        assert 'progress     {"done": 2, "of": 3}' in out.getvalue()
        assert "reading the file" in out.getvalue()
        gate.set()
        await eventually(lambda: q.get("imp-1").state == "completed",  # type: ignore
                         what="the job to complete")


async def test_a_sync_handler_reports_without_await_and_its_last_report_is_kept(
        url: str, q: Queue) -> None:
    reg = Registry()

    @reg.handler("resize")
    def resize(job: Job) -> int:
        for i in range(1, 4):
            job.progress(i * 33)
            job.log(f"tile {i}")
        job.progress(100)  # reported just before returning: still written
        return 1

    q.enqueue("resize", job_id="rs")
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: q.get("rs").state == "completed",  # type: ignore[union-attr]
                         what="the job to complete")
    info = q.get("rs")
    assert info is not None and info.progress == 100
    assert [ln["m"] for ln in info.logs] == ["tile 1", "tile 2", "tile 3"]
    assert [ln["n"] for ln in info.logs] == [1, 2, 3]


async def test_reports_made_while_a_write_is_under_way_are_written_too(
        url: str, q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync handler reports on while the writer's batch is in flight: those reports stay
    pending and are written (a bug dropped them: the writer compared its batch with itself).
    Each step waits for the one before it (events, the writer's own count), no sleeps."""
    sent, reported = threading.Event(), threading.Event()
    orig = Script.run_async
    calls = [0]

    async def held(self: Script, client: Any, keys: Any, args: Any, **kw: Any) -> Any:
        reply = await orig(self, client, keys, args, **kw)
        if self is SCRIPTS["progress"] and calls[0] == 0:  # the first write: (1, ["a"])
            calls[0] += 1
            sent.set()
            await asyncio.to_thread(reported.wait, 5)  # the handler reported more meanwhile
        return reply

    monkeypatch.setattr(Script, "run_async", held)
    monkeypatch.setattr(Script, "packable", lambda self, client: False)  # (unpacked)
    reg = Registry()
    worker: list[Worker] = []

    @reg.handler("steps")
    def steps(job: Job) -> int:
        job.progress(1)
        job.log("a")
        assert sent.wait(5)
        job.progress(2)
        job.log("b")
        reported.set()
        prog = worker[0]._progress
        assert prog is not None
        end = time.monotonic() + 5
        while prog._written < 2 and time.monotonic() < end:  # the first write's step is over
            time.sleep(0.005)
        job.progress(3)
        return 1

    q.enqueue("steps", job_id="st")
    async with Worker(url, [q.name], reg, fast()) as w:
        worker.append(w)
        await eventually(lambda: q.get("st").state == "completed",  # type: ignore[union-attr]
                         what="the job to complete")
    info = q.get("st")
    assert info is not None and info.progress == 3
    assert [ln["m"] for ln in info.logs] == ["a", "b"]


async def test_a_waiter_follows_progress(url: str, q: Queue) -> None:
    reg = Registry()
    step = threading.Event()

    @reg.handler("steps")
    async def steps(job: Job) -> str:
        for pct in (25, 50, 75):
            await job.progress(pct)
            await asyncio.to_thread(step.wait, 5)
            step.clear()
        return "done"

    seen: list[Any] = []

    def on_progress(value: Any) -> None:
        seen.append(value)
        step.set()  # the handler moves on once the waiter saw this step

    async with Worker(url, [q.name], reg, fast()):
        result = await asyncio.to_thread(q.enqueue_and_wait, "steps", timeout=20,
                                         on_progress=on_progress)
    assert result == "done" and seen == [25, 50, 75]


async def test_reports_are_bounded(url: str, q: Queue) -> None:
    reg = Registry()
    refused: list[str] = []

    @reg.handler("chatty")
    async def chatty(job: Job) -> None:
        for i in range(150):
            job.log(f"line {i} " + "x" * 2000)
        try:
            job.progress({"blob": "y" * 5000})
        except InvalidArgument as exc:
            refused.append(str(exc))
        try:
            job.progress({1, 2})
        except InvalidArgument as exc:
            refused.append(str(exc))

    q.enqueue("chatty", job_id="c")
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: q.get("c").state == "completed",  # type: ignore[union-attr]
                         what="the job to complete")
    info = q.get("c")
    assert info is not None and len(info.logs) == 100
    assert info.logs[0]["m"].startswith("line 50 ") and len(info.logs[0]["m"]) == 1000
    assert len(refused) == 2 and "over 2048" in refused[0] and "plain JSON" in refused[1]


def test_progress_is_fenced_and_safe_to_repeat(q: Queue, r: redis.Redis) -> None:
    k = q.keys
    q.enqueue("t", job_id="j")
    r.hset(k.job("j"), mapping={"s": "a", "k": "tok"})  # active under lease "tok"
    lines = json.dumps([{"n": 1, "t": 1, "m": "a"}, {"n": 2, "t": 2, "m": "b"}])

    def report(token: str) -> Any:
        return SCRIPTS["progress"](r, [k.events, k.job("j")],
                                   [100, 100, 1, "j", token, "7", lines])

    assert report("stale") == [0] and r.hget(k.job("j"), "progress") is None
    assert report("tok") == [1]
    assert report("tok") == [1]  # a repeated call (lost reply) appends nothing
    info = q.get("j")
    assert info is not None and info.progress == 7 and [x["m"] for x in info.logs] == ["a", "b"]


async def test_workers_write_the_charts_time_series(url: str, q: Queue) -> None:
    """The dashboard's charts read what running workers write: completed and failed counts
    and wait/run times per minute (flushed on a timer and when the worker stops)."""
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> None:
        return None

    @reg.handler("bad", max_attempts=1)
    async def bad(job: Job) -> None:
        raise ValueError("no")

    q.enqueue_many([{"type": "ok", "job_id": f"o{i}"} for i in range(7)]
                   + [{"type": "bad", "job_id": f"b{i}"} for i in range(2)])
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: all(q.get(f"o{i}").state == "completed"  # type: ignore
                                     for i in range(7)), what="the jobs to finish")
        await eventually(lambda: all(q.get(f"b{i}").state == "failed"  # type: ignore
                                     for i in range(2)), what="the failures to settle")
    points = Admin.from_url(url).series(q.name)
    assert sum(p.completed for p in points) == 7 and sum(p.failed for p in points) == 2
    assert any(p.run_p50_ms is not None and p.wait_p95_ms is not None for p in points)
