"""Invariant 15: an attempt is counted only for a handler that started. A hand-back (graceful
stop, a start whose reply the worker never read, pause, rate limit, group gate) never consumes
an attempt, so a deploy (a graceful stop of every worker) dead-letters nothing, whatever the
jobs' ``max_attempts``; a job handed back at stop is the next worker's first attempt."""

from __future__ import annotations

import asyncio
from typing import Any

import redis
from helpers import eventually, fast, field, start_entries, state

from streamq import Job, Queue, QueueConfig, Registry, Worker
from streamq._core.keys import GROUP


def _registry(runs: dict[str, list[int]], gate: asyncio.Event | None = None) -> Registry:
    reg = Registry()

    @reg.handler("once", max_attempts=1)
    async def once(job: Job) -> int:
        runs.setdefault(job.id, []).append(job.attempt)
        if gate is not None:
            await gate.wait()
        return job.attempt

    return reg


async def _unread_start(r: redis.Redis, q: Queue, w: Worker, job_id: str, token: str) -> None:
    """Read ``job_id``'s entry into the worker's pending list and start it under ``token``,
    as a start.lua call whose reply the worker never read would have (the worker's one slot
    is busy, so it reads nothing itself meanwhile)."""
    got: Any = r.xreadgroup(GROUP, w.consumer, {q.keys.stream: ">"}, count=1)
    assert got, "the entry is there"
    entry = got[0][1][0][0].decode()
    assert got[0][1][0][1][b"id"] == job_id.encode()
    assert start_entries(r, q.keys, w.consumer, [(entry, job_id)], token=token)[0] == b"run"
    assert field(r, q.keys.job(job_id), "attempts") == b"1"


async def test_a_start_the_worker_never_read_is_handed_back_without_its_attempt(
        url: str, q: Queue, r: redis.Redis) -> None:
    """A start whose reply the worker never read (lost, or its fetch cancelled at stop) is in
    the worker's pending list under a token of this run of the worker: the graceful stop hands
    it back and refunds the attempt, so a max_attempts=1 job runs on the next worker, as its
    first attempt (before: dead-lettered unrun, 'attempts exhausted (lease lapsed)')."""
    runs: dict[str, list[int]] = {}
    gate = asyncio.Event()
    reg = _registry(runs, gate)
    qc = QueueConfig(handoff=False)
    w = Worker(url, [q.name], reg, fast(concurrency=1), qc)
    await w.start()
    try:
        q.enqueue("once", job_id="busy")
        await eventually(lambda: "busy" in runs, what="the worker's one slot taken")
        q.enqueue("once", job_id="j1", max_attempts=1)
        await _unread_start(r, q, w, "j1", f"{w._token_prefix}ffff")
    finally:
        gate.set()
        await w.stop()
    assert field(r, q.keys.job("j1"), "state") == b"queued"
    assert field(r, q.keys.job("j1"), "attempts") in (None, b"0")
    async with Worker(url, [q.name], reg, fast(), qc):
        await eventually(lambda: state(q, "j1") == "completed", what="j1 completed")
    assert runs["j1"] == [1] and runs["busy"] == [1]
    assert r.xlen(q.keys.dead) == 0


async def test_a_start_of_an_earlier_run_keeps_its_attempt(url: str, q: Queue,
                                                             r: redis.Redis) -> None:
    """A job started under the same consumer name by an earlier run of the worker (that run
    may have run the handler before it died) is handed back with its attempt kept."""
    runs: dict[str, list[int]] = {}
    gate = asyncio.Event()
    reg = _registry(runs, gate)
    reg.register("twice", lambda job: runs.setdefault(job.id, []).append(job.attempt),
                 max_attempts=2)
    qc = QueueConfig(handoff=False)
    w = Worker(url, [q.name], reg, fast(concurrency=1), qc, consumer="stable-name")
    await w.start()
    try:
        q.enqueue("once", job_id="busy")
        await eventually(lambda: "busy" in runs, what="the worker's one slot taken")
        q.enqueue("twice", job_id="j2")
        await _unread_start(r, q, w, "j2", "earlier-run-1")
    finally:
        gate.set()
        await w.stop()
    assert field(r, q.keys.job("j2"), "attempts") == b"1"
    async with Worker(url, [q.name], reg, fast(), qc):
        await eventually(lambda: state(q, "j2") == "completed", what="j2 completed")
    assert runs["j2"] == [2]


async def test_graceful_stops_mid_drain_dead_letter_nothing(url: str, q: Queue,
                                                             r: redis.Redis) -> None:
    """A deploy: max_attempts=1 jobs drained by workers stopped gracefully one after another
    while jobs are being fetched, started and run. Nothing is dead-lettered, every job
    completes, and a job that ran more than once did so only after a hand-back of its
    unsettled run (at-least-once), each time as attempt 1."""
    runs: dict[str, list[int]] = {}
    reg = _registry(runs)
    n = 1500
    q.enqueue_many([{"type": "once", "payload": {"i": i}, "job_id": f"d{i}"}
                    for i in range(n)])
    for stop_after in (100, 300, 600, 900):
        def ran_enough(m: int = stop_after) -> bool:
            return len(runs) >= m

        async with Worker(url, [q.name], reg, fast(concurrency=50, grace_period_s=0.5)):
            await eventually(ran_enough, what=f"{stop_after} jobs ran")
    async with Worker(url, [q.name], reg, fast(concurrency=50)):
        await eventually(lambda: len(runs) >= n, timeout_s=60, what="every job ran")
        await eventually(lambda: all(state(q, f"d{i}") == "completed" for i in range(n)),
                         timeout_s=30, what="every job completed")
    assert r.xlen(q.keys.dead) == 0
    assert len(runs) == n
    assert all(set(a) == {1} for a in runs.values())


async def test_a_job_interrupted_at_stop_is_the_next_workers_first_attempt(
        url: str, q: Queue, r: redis.Redis) -> None:
    """A handler still running when the grace period ends is cancelled and handed back with
    its attempt refunded: the next worker runs it as attempt 1, even with max_attempts=1."""
    runs: dict[str, list[int]] = {}
    gate = asyncio.Event()
    reg = _registry(runs, gate)
    q.enqueue("once", job_id="slow")
    async with Worker(url, [q.name], reg, fast(grace_period_s=0.1)):
        await eventually(lambda: "slow" in runs, what="the handler started")
    assert field(r, q.keys.job("slow"), "state") == b"queued"
    gate.set()
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: state(q, "slow") == "completed", what="slow completed")
    assert runs["slow"] == [1, 1]
    assert r.xlen(q.keys.dead) == 0


async def test_an_unread_start_goes_back_before_the_grace_period(url: str, q: Queue,
                                                                  r: redis.Redis) -> None:
    """Nothing renews the lease of a start the worker never read, so a stopping worker hands
    it back at once, not after the grace period (which may be longer than the visibility
    timeout: its lease would lapse first, and a reclaim would count its attempt)."""
    runs: dict[str, list[int]] = {}
    gate = asyncio.Event()
    reg = _registry(runs, gate)
    qc = QueueConfig(handoff=False)
    w = Worker(url, [q.name], reg, fast(concurrency=1, grace_period_s=60.0), qc)
    await w.start()
    stopping: asyncio.Task[None] | None = None
    try:
        q.enqueue("once", job_id="slow")
        await eventually(lambda: "slow" in runs, what="the slow handler started")
        q.enqueue("once", job_id="unread")
        await _unread_start(r, q, w, "unread", f"{w._token_prefix}fffe")
        stopping = asyncio.create_task(w.stop())
        await eventually(lambda: field(r, q.keys.job("unread"), "state") == b"queued",
                         what="the unread start handed back during the grace period")
        assert not stopping.done() and runs["slow"] == [1]  # still in its grace period
        assert field(r, q.keys.job("unread"), "attempts") in (None, b"0")
    finally:
        gate.set()
        if stopping is None:
            await w.stop()
        else:
            await stopping
    async with Worker(url, [q.name], reg, fast(), qc):
        await eventually(lambda: state(q, "unread") == "completed", what="unread completed")
    assert runs["unread"] == [1] and runs["slow"] == [1]
