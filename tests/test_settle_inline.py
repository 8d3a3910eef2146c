"""A lone job sends its own outcome (finish.lua) when its lane's settling loop is idle;
under load the settling loop batches outcomes; a failed send of a lone job's outcome is
left to the settling loop, which sends it again (streamq/_worker/settle.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from helpers import eventually, running

from streamq import Job, Queue, Registry
from streamq._core.scripts import SCRIPTS, Script


def _record_finish(monkeypatch: pytest.MonkeyPatch, senders: list[asyncio.Task[Any] | None],
                   lose: list[int] | None = None) -> None:
    """Note the task that sends each finish.lua call; with ``lose``, the reply of the first
    lose[0] calls is lost after the script ran (a connection error instead)."""
    orig = Script.run_async

    async def noted(self: Script, client: Any, keys: Any, args: Any, **kw: Any) -> Any:
        if self is not SCRIPTS["finish"]:
            return await orig(self, client, keys, args, **kw)
        senders.append(asyncio.current_task())
        reply = await orig(self, client, keys, args, **kw)
        if lose is not None and lose[0] > 0:
            lose[0] -= 1
            raise redis.ConnectionError("reply of finish.lua lost (test)")
        return reply

    monkeypatch.setattr(Script, "run_async", noted)
    monkeypatch.setattr(Script, "packable", lambda self, client: False)  # (unpacked)


async def test_a_lone_job_sends_its_own_outcome(url: str, q: Queue,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    senders: list[asyncio.Task[Any] | None] = []
    _record_finish(monkeypatch, senders)
    reg = Registry()
    tasks: list[asyncio.Task[Any] | None] = []

    @reg.handler("t")
    async def t(job: Job) -> str:
        tasks.append(asyncio.current_task())
        return job.id

    async with running(url, q.name, reg) as w:
        for n in range(3):
            jid = q.enqueue("t").job_id
            await eventually(lambda jid=jid: q.get(jid).state == "completed",  # type: ignore[union-attr, misc]
                             what=f"job {n} to complete")
            assert q.result(jid) == jid
        await eventually(lambda: w.stats.completed == 3, what="the outcomes counted")
        assert senders == tasks  # each from the job's own task, not the settling loop's
        assert not any(s in w._flushers for s in senders)


async def test_outcomes_of_many_jobs_ending_together_are_batched(
        url: str, q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    senders: list[asyncio.Task[Any] | None] = []
    _record_finish(monkeypatch, senders)
    reg = Registry()
    gate = asyncio.Event()
    started = [0]

    @reg.handler("t")
    async def t(job: Job) -> None:
        started[0] += 1
        await gate.wait()

    async with running(url, q.name, reg, concurrency=64) as w:
        q.enqueue_many([{"type": "t"} for _ in range(40)])
        await eventually(lambda: started[0] == 40, what="40 jobs running")
        gate.set()  # they all end in the same event-loop turn
        await eventually(lambda: w.stats.completed == 40, what="40 outcomes settled")
        assert len(senders) <= 2  # one batch (two if the first call was under way)
        assert all(s in w._flushers for s in senders)


async def test_a_lone_jobs_lost_finish_reply_is_settled_by_the_settling_loop(
        url: str, q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    senders: list[asyncio.Task[Any] | None] = []
    _record_finish(monkeypatch, senders, lose=[1])
    reg = Registry()
    runs: list[int] = []

    @reg.handler("t")
    async def t(job: Job) -> int:
        runs.append(job.attempt)
        return job.attempt

    async with running(url, q.name, reg) as w:
        jid = q.enqueue("t").job_id
        await eventually(lambda: w.stats.completed == 1, what="the outcome settled")
        assert len(senders) == 2 and senders[1] in w._flushers  # sent again by the loop
    info = q.get(jid)
    assert info is not None and info.state == "completed" and q.result(jid) == 1
    assert runs == [1] and w.stats.lost == 0
