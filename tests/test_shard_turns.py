"""A worker's fetch loops over many shards share its free slots by turns (``_worker/slots.py``,
docs/scaling.md#sharded-queues): the loop whose turn it is takes every free slot it may use,
so batches stay as large as an unsharded queue's, and no shard starves.

The budget alone (first come first served, greedy, blocking reads served first); then, on a
real server: a shard with one job among shards with thousands is served while the backlog is
still there (the job there before the worker, and arriving later into an idle shard); one
worker over 12 shards drains every one, and with fewer slots than shards an idle worker still
runs a job arriving in any shard; a worker killed over a sharded queue hands every shard's
jobs on after the visibility timeout, and one stopped gracefully hands them back without an
attempt."""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import eventually, fast
from test_faults import Procs, executions, read_ledger, registered, wait_completed, wait_until

from streamq import Job, Keys, Queue, QueueConfig, Registry, Worker
from streamq._core.cluster_server import ClusterServer
from streamq._core.keys import GROUP, shard_keys, shard_of
from streamq._worker.slots import Slots

# ------------------------------------------------------------------------- the budget alone


async def _queued(slots: Slots, n: int) -> None:
    """Let the waiting tasks reach their wait (``n`` of them)."""
    await eventually(lambda: slots.waiting == n, 5, f"{n} loops waiting")


async def test_the_loop_whose_turn_it_is_takes_every_free_slot() -> None:
    slots = Slots(10, loops=4)
    assert await slots.take_all(8, "a") == 8  # not 10 // 4: every free slot up to want
    b = asyncio.create_task(slots.take_all(8, "b"))
    await _queued(slots, 1)  # a's claim is in flight: b waits for it to end
    slots.release(1)
    slots.pass_turn("a")
    assert await b == 3
    slots.pass_turn("b")
    c = asyncio.create_task(slots.take_all(8, "c"))
    await _queued(slots, 1)
    slots.release(1)
    slots.release(5)  # (released one by one, as handlers end: taken when c runs)
    assert await c == 6
    assert slots.free == 0


async def test_turns_are_first_come_first_served() -> None:
    slots = Slots(0, loops=3)
    got: list[tuple[str, int]] = []
    tasks: list[asyncio.Task[None]] = []

    async def take(who: str) -> None:
        got.append((who, await slots.take_all(100, who)))
        slots.pass_turn(who)

    async def after_release(n: int) -> None:
        before = len(got)
        slots.release(n)
        await eventually(lambda: len(got) == before + 1)

    for i, who in enumerate("abc"):
        tasks.append(asyncio.create_task(take(who)))
        await _queued(slots, i + 1)
    await after_release(3)
    tasks.append(asyncio.create_task(take("a")))  # a claimed and comes back: behind b, c
    await _queued(slots, 3)
    for _ in range(3):
        await after_release(1)
    await asyncio.gather(*tasks)
    assert got == [("a", 3), ("b", 1), ("c", 1), ("a", 1)]


async def test_a_blocking_read_waits_its_turn_and_parks_one_slot_while_a_shard_is_busy(
        ) -> None:
    slots = Slots(10, loops=4)
    assert await slots.take_all(10, "busy") == 10
    slots.pass_turn("busy")
    claim = asyncio.create_task(slots.take_all(50, "busy"))
    await _queued(slots, 1)
    read = asyncio.create_task(slots.take_share(50, "idle"))
    await _queued(slots, 2)
    slots.release(6)
    assert await claim == 6  # first come, first served: a read jumps no queue
    slots.release(6)  # (and it need not wait for the claim in flight)
    assert await read == 1  # one slot: "busy" has a backlog
    assert slots.free == 5
    idle = Slots(100, loops=4)  # every loop idle: a share each, as a lone job's read needs
    assert await idle.take_share(75, "x") == 25


async def test_a_turn_held_too_long_lapses() -> None:
    """A claim that gets no answer (its node away) holds the other loops up no longer than
    HOLD_MAX_S; its late pass_turn passes nobody else's turn."""
    slots = Slots(10, loops=2)
    assert await slots.take_all(4, "stuck") == 4
    other = asyncio.create_task(slots.take_all(10, "other"))
    assert await asyncio.wait_for(other, 30) == 6  # (the lapse: HOLD_MAX_S)
    slots.release(4)
    third = asyncio.create_task(slots.take_all(10, "third"))
    await _queued(slots, 1)
    slots.pass_turn("stuck")  # late: "other" still holds the turn
    await asyncio.sleep(0)
    assert not third.done()
    slots.pass_turn("other")
    assert await third == 4


async def test_a_cancelled_wait_passes_the_turn_on() -> None:
    slots = Slots(0, loops=2)
    first = asyncio.create_task(slots.take_all(10, "a"))
    await _queued(slots, 1)
    second = asyncio.create_task(slots.take_all(10, "b"))
    await _queued(slots, 2)
    slots.release(4)  # a is woken, then cancelled before it runs
    first.cancel()
    assert await second == 4
    with pytest.raises(asyncio.CancelledError):
        await first
    assert slots.waiting == 0


# ------------------------------------------------------------------------- on a real server


def fresh(cluster: ClusterServer | None, shards: int) -> str:
    while True:
        name = f"st-{uuid.uuid4().hex[:10]}"
        if cluster is None or len({cluster.owner(k.stream)
                                   for k in shard_keys(name, shards)}) == min(shards, 3):
            return name


def ids_for(shard: int, shards: int, n: int, tag: str) -> list[str]:
    out: list[str] = []
    i = 0
    while len(out) < n:
        jid = f"{tag}-{i}"
        i += 1
        if shard_of(jid, shards) == shard:
            out.append(jid)
    return out


@pytest.mark.parametrize("arrives", ["before the worker", "into an idle shard"])
async def test_a_shard_with_one_job_among_shards_with_thousands_is_served(
        url: str, arrives: str) -> None:
    """Three shards hold 900 jobs each, the fourth one job: it runs while most of the
    backlog still waits, whether it was there when the worker started (its loop takes its
    turn among the busy ones) or arrived later into a shard the worker found drained (its
    blocking read is served before the turns)."""
    shards = 4
    name = fresh(None, shards)
    cfg = QueueConfig(shards=shards)
    backlog = [j for s in range(3) for j in ids_for(s, shards, 900, f"b{s}")]
    [lone] = ids_for(3, shards, 1, "lone")
    done: list[str] = []
    when: list[int] = []
    reg = Registry()

    @reg.handler("work")
    async def work(job: Job) -> None:
        await asyncio.sleep(0.002)  # (a drain of some seconds: room to see the order)
        if job.id == lone:
            when.append(len(done))
        done.append(job.id)

    with Queue.from_url(url, name, cfg) as q:
        q.enqueue_many([{"type": "work", "job_id": j} for j in backlog])
        if arrives == "before the worker":
            q.enqueue("work", job_id=lone)
        async with Worker(url, [name], reg, fast(concurrency=8, promote=False), cfg):
            if arrives != "before the worker":
                await eventually(lambda: len(done) >= 20, 30, "the backlog being worked off")
                await asyncio.to_thread(q.enqueue, "work", job_id=lone)
            await eventually(lambda: when, 60, "the lone shard's job")
            assert when[0] < len(backlog) // 2, f"it ran after {when[0]} backlog jobs"
            await eventually(lambda: len(done) == len(backlog) + 1, 120, "everything done")


@pytest.mark.parametrize("concurrency", [3, 32])
async def test_a_worker_over_twelve_shards_drains_every_one(
        where: tuple[str, ClusterServer | None], concurrency: int) -> None:
    """Every shard drained by one worker, also with fewer slots than shards (3); then, the
    worker idle, a job arriving in any shard runs (the idle reads take turns at the slots)."""
    url, cluster = where
    shards = 12
    name = fresh(cluster, shards)
    cfg = QueueConfig(shards=shards)
    ids = [j for s in range(shards) for j in ids_for(s, shards, 15, f"d{s}")]
    done: set[str] = set()
    reg = Registry()

    @reg.handler("work")
    async def work(job: Job) -> None:
        done.add(job.id)

    with Queue.from_url(url, name, cfg) as q:
        q.enqueue_many([{"type": "work", "job_id": j} for j in ids])
        async with Worker(url, [name], reg, fast(concurrency=concurrency, block_ms=100,
                                                  promote=False), cfg):
            await eventually(lambda: done >= set(ids), 60, "every shard drained")
            client: Any = q.client
            streams = [k.stream for k in shard_keys(name, shards)]
            await eventually(lambda: not any(client.xlen(s) for s in streams), 10, "settled")
            for s in range(shards):  # idle now: one job into each shard in turn
                [late] = ids_for(s, shards, 1, "late")
                await asyncio.to_thread(q.enqueue, "work", job_id=late)
                await eventually(functools.partial(set.__contains__, done, late), 30,
                                 f"shard {s}'s job")
        for k in shard_keys(name, shards):
            assert client.xlen(k.stream) == 0
            assert int(client.xpending(k.stream, GROUP)["pending"]) == 0


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.close()


FAST = {"heartbeat_interval_s": 0.5, "promote_interval_s": 0.2, "shards": 3}


def test_a_killed_worker_hands_every_shard_on_after_the_visibility_timeout(
        url: str, r: redis.Redis, procs: Procs) -> None:
    name = fresh(None, 3)
    cfg = QueueConfig(shards=3)
    ids = [ids_for(s, 3, 1, "k")[0] for s in range(3)]
    q = Queue.from_url(url, name, cfg)
    procs.worker(url, name, "w-a", visibility_timeout_s=30, **FAST)
    wait_until(lambda: registered(r, Keys(name), "w-a"), 15, "worker A is up",
               procs.diagnostics)
    for jid in ids:
        q.enqueue("job", {"sleep_first": 30}, job_id=jid)
    wait_until(lambda: all(executions(procs.ledger)[j] == 1 for j in ids), 15,
               "worker A started a job in every shard", procs.diagnostics)
    procs.sigkill("w-a")
    procs.worker(url, name, "w-b", visibility_timeout_s=1, reclaim_interval_s=0.2, **FAST)
    for jid in ids:
        info = wait_completed(q, jid, 30, f"worker B finished {jid}", procs.diagnostics)
        assert info.attempts == 2 and info.result["consumer"] == "w-b"
    q.close()


def test_a_stopped_worker_hands_every_shard_back_without_an_attempt(
        url: str, r: redis.Redis, procs: Procs) -> None:
    name = fresh(None, 3)
    cfg = QueueConfig(shards=3)
    ids = [j for s in range(3) for j in ids_for(s, 3, 2, "g")]
    q = Queue.from_url(url, name, cfg)
    procs.worker(url, name, "w-a", grace_period_s=0.2, **FAST)
    wait_until(lambda: registered(r, Keys(name), "w-a"), 15, "worker A is up",
               procs.diagnostics)
    for jid in ids:
        q.enqueue("job", {"sleep_first": 60}, job_id=jid, max_attempts=1)
    wait_until(lambda: all(executions(procs.ledger)[j] == 1 for j in ids), 15,
               "worker A started every job", procs.diagnostics)
    procs.stop(["w-a"], 30)
    procs.worker(url, name, "w-b", **FAST)
    for jid in ids:  # max_attempts=1: the hand-back counted no attempt
        info = wait_completed(q, jid, 30, f"worker B finished {jid}", procs.diagnostics)
        assert info.attempts == 1 and info.result["consumer"] == "w-b"
    assert {(rec["job"], rec["attempt"]) for rec in read_ledger(procs.ledger)
            if rec["consumer"] == "w-b"} == {(j, 1) for j in ids}
    q.close()
