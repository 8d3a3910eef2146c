"""A handler whose lease another worker took over is stopped, not left running beside the new
owner (where it would hold a second slot of its group and repeat side effects)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from helpers import eventually, fast

from streamq import Job, Queue, Registry, Worker
from streamq._core.keys import GROUP


def _take_over(q: Queue, job_id: str) -> None:
    """What a reclaim by another worker does: the entry moves to that worker's pending list
    (XCLAIM) and the record gets its new lease token."""
    pending: Any = q.client.xpending_range(q.keys.stream, GROUP, "-", "+", 10)
    assert len(pending) == 1
    q.client.xclaim(q.keys.stream, GROUP, "another-worker", 0, [pending[0]["message_id"]],
                    justid=True)
    q.client.hset(q.keys.job(job_id), "k", "another-worker-1")


async def test_an_async_handler_whose_lease_was_taken_over_is_stopped(url: str, q: Queue
                                                                      ) -> None:
    started, ended = asyncio.Event(), asyncio.Event()
    reg = Registry()

    @reg.handler("block")
    async def block(job: Job) -> str:
        started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            ended.set()
        return "never"

    q.enqueue("block", job_id="z1")
    async with Worker(url, [q.name], reg, fast(visibility_timeout_s=1.5)) as w:
        await eventually(started.is_set, what="the handler to start")
        _take_over(q, "z1")
        await eventually(ended.is_set, timeout_s=5.0,
                         what="the handler stopped after its renewal found the lease lost")
        await eventually(lambda: w.stats.lost == 1, what="its outcome refused as lost")
        assert w.stats.completed == 0 and w.stats.cancelled == 0
    # nothing was written over the new owner's lease
    assert q.client.hget(q.keys.job("z1"), "k") == b"another-worker-1"
    assert q.client.hget(q.keys.job("z1"), "s") == b"a"


async def test_a_sync_handler_whose_lease_was_taken_over_sees_cancel_requested(
        url: str, q: Queue) -> None:
    started, ended = threading.Event(), threading.Event()
    reg = Registry()

    @reg.handler("poll")
    def poll(job: Job) -> str:
        started.set()
        try:
            for _ in range(1000):  # at most 10 s
                if job.cancel_requested:
                    return "stopped"
                threading.Event().wait(0.01)
            return "ran on"
        finally:
            ended.set()

    q.enqueue("poll", job_id="z2")
    async with Worker(url, [q.name], reg, fast(visibility_timeout_s=1.5)) as w:
        await eventually(started.is_set, what="the handler to start")
        _take_over(q, "z2")
        await eventually(ended.is_set, timeout_s=5.0, what="the handler to see the flag")
        await eventually(lambda: w.stats.lost == 1, what="its outcome refused as lost")
        assert w.stats.completed == 0
    assert q.client.hget(q.keys.job("z2"), "k") == b"another-worker-1"

