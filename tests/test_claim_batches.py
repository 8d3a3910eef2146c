"""Claims stay full batches when the settling calls are the bottleneck (fetch.py: a claim
short of slots that outcomes waiting to be settled hold waits for the lane's settling call),
so script calls per job stay at their floor; an idle worker still starts a lone job at once."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from helpers import eventually, fast

from streamq import Job, Queue, Registry, Worker
from streamq._core.config import QueueConfig
from streamq._core.scripts import SCRIPTS, Script

_N_ARG = 8
"""claim.lua's ARGV index (0-based) of n, the slots reserved for the call (claim_call)."""


def _note_calls(monkeypatch: pytest.MonkeyPatch, claims: list[int], finishes: list[int]
                ) -> None:
    """Record each claim.lua call's n and each finish.lua call; finish.lua calls are made
    slow (a few event-loop rounds before each), so that outcomes wait to be settled."""
    orig = Script.run_async

    async def noted(self: Script, client: Any, keys: Any, args: Any, **kw: Any) -> Any:
        if self is SCRIPTS["claim"]:
            claims.append(int(args[_N_ARG]))
        elif self is SCRIPTS["finish"]:
            finishes.append(1)
            for _ in range(5):
                await asyncio.sleep(0)
        return await orig(self, client, keys, args, **kw)

    monkeypatch.setattr(Script, "run_async", noted)
    monkeypatch.setattr(Script, "packable", lambda self, client: False)  # (unpacked)


async def test_claims_under_a_settling_backlog_are_full_batches(
        url: str, qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quick jobs, slow settling: every claim asks for a full batch (three quarters of
    concurrency), none for the few slots left over while outcomes wait to be settled; every
    job completes once."""
    claims: list[int] = []
    finishes: list[int] = []
    _note_calls(monkeypatch, claims, finishes)
    done: list[str] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        done.append(job.id)

    n = 120
    with Queue.from_url(url, qname) as q:
        q.enqueue_many([{"type": "t", "job_id": f"j{i}"} for i in range(n)])
        async with Worker(url, [qname], reg, fast(concurrency=4),
                          queue_config=QueueConfig(handoff=False)) as w:
            await eventually(lambda: w.stats.completed == n, what="the backlog to complete")
        assert sorted(done) == sorted(f"j{i}" for i in range(n))
    assert claims and set(claims) == {3}, claims  # 4 * 3 // 4
    assert len(claims) <= n // 3 + 2


async def test_an_idle_worker_starts_a_lone_job_while_outcomes_settle(
        url: str, qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wait for settling never holds up an idle worker: after a backlog, a lone job is
    read and run by the blocking read, with finish.lua still slow."""
    claims: list[int] = []
    finishes: list[int] = []
    _note_calls(monkeypatch, claims, finishes)
    done: list[str] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        done.append(job.id)

    with Queue.from_url(url, qname) as q:
        q.enqueue_many([{"type": "t", "job_id": f"b{i}"} for i in range(30)])
        async with Worker(url, [qname], reg, fast(concurrency=4),
                          queue_config=QueueConfig(handoff=False)) as w:
            await eventually(lambda: w.stats.completed == 30, what="the backlog")
            q.enqueue("t", job_id="lone")
            await eventually(lambda: q.get("lone").state == "completed",  # type: ignore
                             what="the lone job")
        assert done.count("lone") == 1


async def test_claims_go_out_on_the_fetch_loops_kept_connection(
        url: str, qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every claim.lua call of a backlog is sent on the connection the shard's fetch loop
    keeps (its blocking reads' own: one call at a time), not on one taken from the pool and
    given back per claim; every job completes once."""
    orig = Script.run_async
    kept: list[Any] = []

    async def noted(self: Script, client: Any, keys: Any, args: Any, **kw: Any) -> Any:
        if self is SCRIPTS["claim"]:
            kept.append(kw.get("kept"))
        return await orig(self, client, keys, args, **kw)

    monkeypatch.setattr(Script, "run_async", noted)
    monkeypatch.setattr(Script, "packable", lambda self, client: False)  # (unpacked)
    done: list[str] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        done.append(job.id)

    n = 60
    with Queue.from_url(url, qname) as q:
        q.enqueue_many([{"type": "t", "job_id": f"j{i}"} for i in range(n)])
        async with Worker(url, [qname], reg, fast(concurrency=4),
                          queue_config=QueueConfig(handoff=False)) as w:
            await eventually(lambda: w.stats.completed == n, what="the backlog to complete")
            (qs,) = w._qs.values()
            assert len(kept) >= n // 3  # (claims of at most three slots)
            assert all(k is qs.reads for k in kept)
            assert qs.reads.conn is not None
        assert sorted(done) == sorted(f"j{i}" for i in range(n))
