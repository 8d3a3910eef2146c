"""Worker leases against a real redis-server: fencing of stale outcomes and stale deliveries,
lease renewal while a handler blocks the loop, hand-back on a graceful stop, reclaim of lapsed
leases, a restarted worker's own pending entries, consumer pruning and batch starts."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
import redis
from helpers import eventually, fast, field, finished, record, running, start_entries, state

from streamq import Job, Queue, Registry, Worker
from streamq._core.keys import GROUP
from streamq._core.scripts import SCRIPTS


async def test_stale_completion_is_rejected_and_counted(url: str, q: Queue,
                                                        r: redis.Redis) -> None:
    """Fencing: a worker whose lease was taken over cannot overwrite the new owner's result."""
    reg = Registry()
    started = asyncio.Event()
    release = asyncio.Event()

    @reg.handler("t")
    async def t(job: Job) -> str:
        started.set()
        await release.wait()
        return "stale result"

    q.enqueue("t", job_id="j")
    async with running(url, q.name, reg, visibility_timeout_s=60) as w:
        await asyncio.wait_for(started.wait(), 10)
        k = q.keys
        # another consumer takes the entry over and starts it (what a reclaim does)
        entry: Any = field(r, k.job("j"), "entry")
        assert entry is not None
        r.xclaim(k.stream, GROUP, "other", 0, [entry], justid=True)
        reply: Any = start_entries(r, k, "other", [(entry.decode(), "j")])
        assert reply[0] == b"run" and reply[2] == 2
        release.set()
        await eventually(lambda: w.stats.lost == 1, what="stale finish to be rejected")
    rec = record(r, k.job("j"))
    assert rec[b"state"] == b"active" and rec[b"owner"] == b"other"
    assert rec[b"token"] == reply[1] and b"result" not in rec
    assert r.hget(k.stats, "lease_lost") == b"1"
    # the new owner settles normally
    done = SCRIPTS["finish"](r, [k.stream, k.delayed, k.dead, k.stats, k.events, k.job("j")],
                             [GROUP, 100, 3600, 1000, "", 1, "j", entry.decode(), reply[1],
                              "ok", b'"new result"', 0, ""])
    assert done == [b"completed"] and q.result("j") == "new result"
    # settling twice (a client retry) answers with the state and changes nothing
    again = SCRIPTS["finish"](r, [k.stream, k.delayed, k.dead, k.stats, k.events, k.job("j")],
                              [GROUP, 100, 3600, 1000, "", 1, "j", entry.decode(), reply[1],
                               "ok", b'"other"', 0, ""])
    assert again == [b"completed"] and q.result("j") == "new result"
    assert r.hget(k.stats, "completed") == b"1"


def test_lease_is_renewed_while_a_handler_blocks_the_event_loop(url: str, q: Queue,
                                                                r: redis.Redis) -> None:
    """A blocking async handler starves the loop, not the lease thread (streaq#146)."""
    reg = Registry()

    @reg.handler("blocker")
    async def blocker(job: Job) -> str:
        time.sleep(4.0)  # noqa: ASYNC251 - deliberately blocks the event loop
        return "done"

    q.enqueue("blocker", job_id="b")
    r.xgroup_create(q.keys.stream, GROUP, id="0")
    # renewed every 0.5 s: a lease lapses only if the lease thread is not scheduled for 1.5 s
    worker = Worker(url, [q.name], reg, fast(visibility_timeout_s=1.5))
    stop = threading.Event()

    async def serve() -> None:
        async with worker:
            await asyncio.to_thread(stop.wait)

    thread = threading.Thread(target=asyncio.run, args=(serve(),))
    thread.start()
    try:
        deadline = time.monotonic() + 10
        idle_seen: list[int] = []
        while state(q, "b") != "completed" and time.monotonic() < deadline:
            pending: Any = r.xpending_range(q.keys.stream, GROUP, "-", "+", 10)
            idle_seen += [p["time_since_delivered"] for p in pending]
            time.sleep(0.05)
    finally:
        stop.set()
        thread.join(15)
    assert state(q, "b") == "completed"
    info = q.get("b")
    assert info is not None and info.attempts == 1  # never reclaimed
    assert idle_seen and max(idle_seen) < 1500, f"lease lapsed: idle up to {max(idle_seen)} ms"
    assert r.hget(q.keys.stats, "lease_lost") is None


async def test_graceful_stop_finishes_short_jobs_and_hands_back_long_ones(
    url: str, q: Queue, r: redis.Redis
) -> None:
    reg = Registry()
    started: set[str] = set()

    @reg.handler("short")
    async def short(job: Job) -> str:
        started.add(job.id)
        await asyncio.sleep(0.2)
        return "short done"

    @reg.handler("long")
    async def long(job: Job) -> str:
        started.add(job.id)
        await asyncio.sleep(60)
        return "never"

    q.enqueue("short", job_id="s")
    q.enqueue("long", job_id="l")
    worker = Worker(url, [q.name], reg, fast(grace_period_s=0.5, visibility_timeout_s=60))
    await worker.start()
    await eventually(lambda: started == {"s", "l"}, what="both started")
    await worker.stop()
    assert state(q, "s") == "completed"
    info = q.get("l")
    assert info is not None and info.state == "queued" and info.attempts == 0  # refunded
    assert r.xlen(q.keys.stream) == 1
    assert r.xpending(q.keys.stream, GROUP)["pending"] == 0
    assert worker.stats.released == 1


async def test_lapsed_leases_are_reclaimed_and_counted(url: str, q: Queue,
                                                       r: redis.Redis) -> None:
    """Entries held by a dead consumer are found with XAUTOCLAIM and re-run."""
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    for i in range(250):
        q.enqueue("t", job_id=f"j{i}")
    q.enqueue("t", job_id="once", max_attempts=1)
    # a consumer that died: it read everything; it started 'once' and j0 before dying
    r.xreadgroup(GROUP, "dead-consumer", {k.stream: ">"}, count=1000)
    for jid in ("once", "j0"):
        entry: Any = field(r, k.job(jid), "entry")
        assert entry is not None
        start_entries(r, k, "dead-consumer", [(entry.decode(), jid)])
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> int:
        return job.attempt

    ids = [f"j{i}" for i in range(250)]
    async with running(url, q.name, reg, concurrency=64, visibility_timeout_s=0.3,
                       reclaim_interval_s=0.05) as w:
        await eventually(lambda: finished(q, *ids, "once"), timeout_s=20, what="reclaim all")
    assert q.result("j0") == 2 and q.result("j1") == 1
    once = q.get("once")
    assert once is not None and once.state == "failed"
    assert once.reason == "attempts exhausted (lease lapsed)"
    assert w.stats.reclaimed >= 250
    assert r.xpending(k.stream, GROUP)["pending"] == 0


async def test_restarted_worker_takes_back_its_own_pending_entries_at_once(
    url: str, q: Queue, r: redis.Redis
) -> None:
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="mine")
    r.xreadgroup(GROUP, "host:1:0", {k.stream: ">"}, count=10)  # delivered, then the process died
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> str:
        return "ok"

    async with Worker(url, [q.name], reg, fast(visibility_timeout_s=3600), consumer="host:1:0"):
        await eventually(lambda: state(q, "mine") == "completed", timeout_s=5,
                         what="own pending entry to run without waiting for the timeout")


def test_prune_keeps_consumers_with_pending_entries(q: Queue, r: redis.Redis) -> None:
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t")
    r.xreadgroup(GROUP, "holding", {k.stream: ">"}, count=1)
    r.xgroup_createconsumer(k.stream, GROUP, "empty")
    r.xgroup_createconsumer(k.stream, GROUP, "alive-empty")
    r.zadd(k.workers, {"alive-empty": int(time.time() * 1000)})

    def prune(name: str) -> Any:
        return SCRIPTS["prune"](r, [k.stream, k.workers], [GROUP, 60_000, name])

    assert prune("holding") == []
    assert prune("alive-empty") == []
    assert prune("empty") == [b"empty"]
    names = {c["name"] for c in r.xinfo_consumers(k.stream, GROUP)}
    assert names == {b"holding", b"alive-empty"}


def test_a_stale_delivery_cannot_restart_a_job_under_a_live_lease(q: Queue,
                                                                   r: redis.Redis) -> None:
    """B read an entry, stalled; A took it over and started it. B's late start is skipped."""
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="s")
    r.xreadgroup(GROUP, "B", {k.stream: ">"}, count=1)
    entry: Any = field(r, k.job("s"), "entry")
    r.xclaim(k.stream, GROUP, "A", 0, [entry])

    def start(consumer: str) -> Any:
        return start_entries(r, k, consumer, [(entry.decode(), "s")])

    a = start("A")
    assert a[0] == b"run"
    assert start("B")[0] == b"skip"  # not B's entry any more
    rec = record(r, k.job("s"))
    assert rec[b"owner"] == b"A" and rec[b"attempts"] == b"1"
    assert rec[b"token"] == a[1]


def test_a_batch_start_runs_exactly_the_callers_own_entries(q: Queue, r: redis.Redis) -> None:
    """In one start.lua batch, entries another consumer took over are skipped and left alone;
    the caller's own entries start, however many others it holds."""
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    n = 1_010
    q.enqueue_many([{"type": "t", "job_id": f"j{i}"} for i in range(n)])
    r.xreadgroup(GROUP, "A", {k.stream: ">"}, count=n)
    entries = {f"j{i}": field(r, k.job(f"j{i}"), "entry").decode()  # type: ignore[union-attr]
               for i in range(n)}
    # B took over one entry in the middle and the second-to-last one (A's are now stale)
    stale = {"j500", f"j{n - 2}"}
    r.xclaim(k.stream, GROUP, "B", 0, [entries[j] for j in stale])
    batch = ["j0", "j500", "j999", f"j{n - 2}", f"j{n - 1}"]
    out = start_entries(r, k, "A", [(entries[j], j) for j in batch])
    codes = dict(zip(batch, out[::7], strict=True))
    assert codes == {j: (b"skip" if j in stale else b"run") for j in batch}
    for j in batch:
        rec = record(r, k.job(j))
        assert rec[b"state"] == (b"queued" if j in stale else b"active")


def test_a_renewal_that_meets_its_own_settled_outcome_is_quiet(
        url: str, q: Queue, r: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """A renewal sent while the lease's own outcome is being settled finds the job done under
    its own token: not a lease lost to another worker (no warning, the handler is not
    stopped); one whose job another worker took over is still lost, and says so."""
    from streamq._worker.lease import Lease, LeaseKeeper

    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    for j in ("mine", "taken"):
        q.enqueue("t", job_id=j)
    got: Any = r.xreadgroup(GROUP, "w", {k.stream: ">"}, count=2)  # delivered to "w"
    by_job = {j: (field(r, k.job(j), "entry") or b"").decode() for j in ("mine", "taken")}
    assert sorted(by_job.values()) == sorted(eid.decode() for eid, _ in got[0][1])
    for j, tok in (("mine", "tok-mine"), ("taken", "tok-taken")):
        assert start_entries(r, k, "w", [(by_job[j], j)], token=tok)[0] == b"run"
    # "mine" settles (its reply not read yet); "taken" is started again by another worker
    assert SCRIPTS["finish"](r, [k.stream, k.delayed, k.dead, k.stats, k.events, k.job("mine")],
                             [GROUP, 100, 3600, 1000, "", 1, "mine", by_job["mine"], "tok-mine",
                              "ok", b'"done"', 0, ""]) == [b"completed"]
    r.xclaim(k.stream, GROUP, "other", 0, [by_job["taken"]], justid=True)
    assert start_entries(r, k, "other", [(by_job["taken"], "taken")])[0] == b"run"
    assert SCRIPTS["renew"](r, [k.stream, k.job("mine"), k.job("taken")],
                            [GROUP, "w", by_job["mine"], "tok-mine", by_job["taken"],
                             "tok-taken"]) == [3, 0]

    keeper = LeaseKeeper(lambda: r, "w", 1.0)
    stopped: list[str] = []
    keeper.on_lost = lambda lease: stopped.append(lease.job_id)
    leases = {j: Lease(k, j, by_job[j], f"tok-{j}", started=0.0) for j in ("mine", "taken")}
    for lease in leases.values():
        keeper.add(lease)
    with caplog.at_level(logging.WARNING, logger="streamq"):
        keeper.renew_once(r)
    warned = [rec.getMessage() for rec in caplog.records if "lease lost" in rec.getMessage()]
    assert stopped == ["taken"] and len(warned) == 1 and "taken" in warned[0]
    assert leases["mine"].lost and leases["taken"].lost  # neither is renewed again
    assert keeper.lost == 1 and keeper.renewed == 0
