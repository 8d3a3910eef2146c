"""The autoscaling gauges (``streamq.queue.backlog`` and ``streamq.queue.saturation``): what a
worker would have to run, of every priority level, shard and group, and the load on the live
workers' slots (docs/production.md#autoscaling)."""

from __future__ import annotations

import asyncio

import redis.asyncio as aredis
from helpers import eventually, fast

from streamq import Job, Queue, QueueConfig, Registry, Worker
from streamq._core.driver import adrive
from streamq._core.keys import shard_keys
from streamq._ops import metrics as m


async def gauges(url: str, queue: str, cfg: QueueConfig | None = None) -> dict[str, float]:
    """The queue's gauges as a worker reports them: per shard, then merged."""
    cfg = cfg or QueueConfig()
    client = aredis.Redis.from_url(url)
    try:
        parts = [(k.queue, await adrive(client, m.gauges(k)))
                 for k in shard_keys(queue, cfg.shards, cfg.key_prefix)]
    finally:
        await client.aclose()
    ((_, merged),) = m.merge_shards(parts)
    return merged


async def test_backlog_counts_due_delayed_grouped_waiting_and_every_priority(
        url: str, qname: str) -> None:
    q = Queue.from_url(url, qname)
    q.enqueue("t", job_id="low", priority=0)  # the lowest level: its own stream
    q.enqueue("t", job_id="normal")
    q.enqueue("t", job_id="g1", group="tenant")  # takes the group's one slot: in the stream
    q.enqueue("t", job_id="g2", group="tenant")  # waits for the slot: not in any stream
    q.enqueue("t", job_id="soon", delay=0.05)  # due in 50 ms: nothing promotes it here
    q.enqueue("t", job_id="later", delay=3600)  # not due: not work to do yet
    await asyncio.sleep(0.2)  # (the server's clock decides what is due)
    g = await gauges(url, qname)
    assert (g["ready"], g["pending"], g["group_waiting"], g["delayed"]) == (3, 0, 1, 2)
    assert g["backlog"] == 3 + 1 + 1  # ready (levels 0 and 2), the waiting g2, the due one
    assert g["workers"] == 0 and g["slots"] == 0
    assert g["saturation"] == 3  # no live worker: (0 + 3) / 1, saturated


async def test_backlog_adds_up_over_shards(url: str, qname: str) -> None:
    cfg = QueueConfig(shards=2)
    q = Queue.from_url(url, qname, cfg)
    for n in range(6):
        q.enqueue("t", job_id=f"j{n}")
    q.enqueue("t", job_id="d", delay=0.05)
    await asyncio.sleep(0.2)  # (the server's clock decides what is due)
    g = await gauges(url, qname, cfg)
    assert g["ready"] == 6 and g["backlog"] == 7


async def test_saturation_of_a_known_state(url: str, qname: str) -> None:
    """Two slots, both running, one more ready: (2 running + 1 ready) / 2 slots = 1.5."""
    reg = Registry()
    release = asyncio.Event()
    running = 0

    @reg.handler("hold")
    async def hold(job: Job) -> None:
        nonlocal running
        running += 1
        await release.wait()

    q = Queue.from_url(url, qname)
    for n in range(3):
        q.enqueue("hold", job_id=f"h{n}")
    worker = Worker(url, [qname], reg, fast(concurrency=2, heartbeat_interval_s=0.2))
    async with worker:
        await eventually(lambda: running == 2, what="both slots busy")
        g = await gauges(url, qname)
        assert (g["pending"], g["ready"], g["slots"], g["workers"]) == (2, 1, 2, 1)
        assert g["saturation"] == 1.5
        assert g["backlog"] == 3
        release.set()
        await eventually(lambda: worker.stats.completed == 3, what="the three jobs")
