"""Hand-off: an idle worker's ticket lets a producer start a new job for it inside the enqueue
call (enqueue.lua, ticket.lua; docs/performance.md#hand-off). What a user relies on: the job
runs once, where and as it would have otherwise; limits, pause and groups still hold; a
stopped worker is handed nothing; a job handed to a worker that died runs elsewhere."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import eventually, fast, start_entries, wait_until

from streamq import Job, Keys, Queue, QueueConfig, Registry, Worker
from streamq._core import sends
from streamq._core.keys import GROUP
from streamq._core.scripts import SCRIPTS
from streamq._producer import prepare as prod
from streamq._worker import fetch as fetch_mod
from streamq.admin import Admin

PROCS = Path(__file__).parent / "procs"


def _registry(running: list[int] | None = None, peak: list[int] | None = None) -> Registry:
    reg = Registry()

    @reg.handler("echo")
    async def echo(job: Job) -> Any:
        return job.payload

    @reg.handler("slow")
    async def slow(job: Job) -> None:
        assert running is not None and peak is not None
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            await asyncio.sleep(0.02)
        finally:
            running[0] -= 1

    return reg


def _tickets(r: redis.Redis, qname: str) -> int:
    return int(r.zcard(Keys(qname).tickets))


async def test_an_idle_worker_is_handed_started_jobs(url: str, qname: str) -> None:
    r = redis.Redis.from_url(url)
    async with Worker(url, [qname], _registry(), fast()) as w:
        with Queue.from_url(url, qname) as q:
            for i in range(5):
                await eventually(lambda: _tickets(r, qname) == 1, what="a posted ticket")
                got = await asyncio.to_thread(q.enqueue_and_wait, "echo", {"i": i}, timeout=10)
                assert got == {"i": i}
        assert w.stats.handed_over == 5
        await eventually(lambda: w.stats.completed == 5, what="5 settled")
        # inbox entries are acknowledged and deleted by the next ticket call
        inbox = Keys(qname).inbox(w._token_prefix)
        await eventually(lambda: r.xlen(inbox) == 0, what="an empty inbox")
    assert _tickets(r, qname) == 0  # withdrawn at stop


async def test_either_side_can_turn_it_off(url: str, qname: str) -> None:
    r = redis.Redis.from_url(url)
    off = QueueConfig(handoff=False)
    async with Worker(url, [qname], _registry(), fast()) as w:
        await eventually(lambda: _tickets(r, qname) == 1, what="a posted ticket")
        with Queue.from_url(url, qname, off) as q:  # a producer without hand-off (an old one)
            assert await asyncio.to_thread(q.enqueue_and_wait, "echo", 7, timeout=10) == 7
        assert w.stats.handed_over == 0
    other = qname + "-w"
    async with Worker(url, [other], _registry(), fast(), queue_config=off) as w:
        with Queue.from_url(url, other) as q:
            await eventually(lambda: w.stats.started == 0)  # running, idle
            assert await asyncio.to_thread(q.enqueue_and_wait, "echo", 8, timeout=10) == 8
            assert _tickets(r, other) == 0
        assert w.stats.handed_over == 0


async def test_a_paused_queue_hands_nothing_over(url: str, qname: str) -> None:
    r = redis.Redis.from_url(url)
    admin = Admin.from_url(url)
    async with Worker(url, [qname], _registry(), fast()) as w:
        await eventually(lambda: _tickets(r, qname) == 1, what="a posted ticket")
        admin.pause(qname)
        with Queue.from_url(url, qname) as q:
            jid = q.enqueue("echo", 1).job_id
            assert admin.job(qname, jid).state == "queued"
            assert w.stats.handed_over == 0
            admin.resume(qname)
            await eventually(lambda: admin.job(qname, jid).state == "completed", 15)


async def test_a_stopped_worker_is_handed_nothing(url: str, qname: str) -> None:
    r = redis.Redis.from_url(url)
    w = Worker(url, [qname], _registry(), fast(block_ms=5000))
    await w.start()
    await eventually(lambda: _tickets(r, qname) == 1, what="a posted ticket")
    await w.stop()
    assert _tickets(r, qname) == 0
    with Queue.from_url(url, qname) as q:
        jid = q.enqueue("echo", 1).job_id
    assert Admin.from_url(url).job(qname, jid).state == "queued"
    # withdrawing a ticket whose inbox is gone leaves no inbox behind (it would have no TTL)
    k = Keys(qname)
    r.delete(k.inbox("gone"))
    member = "|".join((k.job(""), k.inbox("gone"), "gone", "0", "60", "100", "c9"))
    assert SCRIPTS["ticket"](r, [k.tickets, k.inbox("gone")], [member, 0, GROUP, "c9"]) == [0]
    assert r.exists(k.inbox("gone")) == 0


async def test_concurrency_holds_with_hand_offs(url: str, qname: str) -> None:
    """Rounds of concurrent enqueues into an idle worker (concurrency 4): each round's first
    job is handed over, the rest come through the stream while it runs; never more than 4
    handlers at once."""
    r = redis.Redis.from_url(url)
    running, peak = [0], [0]
    async with Worker(url, [qname], _registry(running, peak), fast(concurrency=4)) as w:
        with Queue.from_url(url, qname) as q:
            for rnd in range(5):
                await eventually(lambda: _tickets(r, qname) == 1, what="an idle worker")

                def produce(k: int, rnd: int = rnd) -> None:
                    for i in range(6):
                        q.enqueue("slow", {"r": rnd, "k": k, "i": i})

                threads = [threading.Thread(target=produce, args=(k,)) for k in range(5)]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join()
                done = 30 * (rnd + 1)

                def all_done(d: int = done) -> bool:
                    return w.stats.completed == d

                await eventually(all_done, 30, f"{done} done")
        assert peak[0] <= 4, peak
        assert w.stats.handed_over >= 5
        assert w.stats.started == 150


def test_a_job_handed_to_a_killed_worker_runs_elsewhere(url: str, qname: str,
                                                        tmp_path: Path) -> None:
    """A worker SIGKILLed while idle leaves its ticket behind, but its connection closed:
    its inbox channel has no subscriber any more, so a producer hands it nothing and the job
    is read from the stream by the next worker, first attempt."""
    r = redis.Redis.from_url(url)
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    cfg = {"concurrency": 4, "block_ms": 20_000}
    procs: list[subprocess.Popen[bytes]] = []

    def worker(consumer: str) -> subprocess.Popen[bytes]:
        p = subprocess.Popen([sys.executable, str(PROCS / "worker_proc.py"), url, qname,
                              str(ledger), consumer, json.dumps(cfg)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(p)
        return p

    try:
        a = worker("a")
        wait_until(lambda: _tickets(r, qname) == 1, 20, "a's ticket")
        member: Any = r.zrange(Keys(qname).tickets, 0, 0)[0]
        inbox = member.split(b"|")[1].decode()
        assert r.pubsub_numsub(inbox) == [(inbox.encode(), 1)]
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        wait_until(lambda: r.pubsub_numsub(inbox)[0][1] == 0, 10, "a's connection to close")
        assert _tickets(r, qname) == 1  # its ticket is still there, within its hold
        with Queue.from_url(url, qname) as q:
            jid = q.enqueue("job", {}).job_id
            admin = Admin.from_url(url)
            assert admin.job(qname, jid).state == "queued"  # not handed to the dead worker
            assert _tickets(r, qname) == 0  # the dead worker's ticket was dropped
            worker("b")
            wait_until(lambda: admin.job(qname, jid).state == "completed", 30, "the job")
            got = q.result(jid, timeout=1)
            assert got["consumer"] == "b" and got["attempt"] == 1
        starts = [json.loads(x) for x in ledger.read_text().splitlines()]
        assert [s["consumer"] for s in starts if s["ev"] == "start"] == ["b"]
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
                p.wait(10)


def test_a_handed_over_grouped_entry_goes_through_its_gate(url: str, qname: str) -> None:
    """The entry a hand-off reads is the oldest one not yet delivered, which may be a grouped
    job's: it starts only if its group allows (here: paused), else it goes back to its
    group's wait list, no attempt counted."""
    r = redis.Redis.from_url(url)
    k = Keys(qname)
    off = QueueConfig(handoff=False)
    with Queue.from_url(url, qname, off) as q:
        r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
        gid = q.enqueue("echo", 1, group="g").job_id  # admitted: its entry is in the stream
        Admin.from_url(url).pause_group(qname, "g")
        # a worker's ticket (ticket.lua), as fetch.py posts it
        member = "|".join((k.job(""), k.inbox("tp"), "tp", "0", "60", "100", "c1"))
        reply = SCRIPTS["ticket"](r, [k.tickets, k.inbox("tp")], [member, 10_000, GROUP, "c1"])
        assert reply == [0]
        alive = r.pubsub()  # type: ignore[no-untyped-call]  # the worker's subscription to its inbox channel
        alive.subscribe(k.inbox("tp"))
        wait_until(lambda: r.pubsub_numsub(k.inbox("tp"))[0][1] == 1, 10, "subscribed")
        cfg = QueueConfig()
        p = prod.prepare(k, cfg, "echo", 2)
        SCRIPTS["enqueue"](r, *prod.enqueue_call(k, cfg, [p], handoff=True))
        inbox: Any = r.xrange(k.inbox("tp"))
        assert len(inbox) == 1
        fields = inbox[0][1]
        assert fields[b"id"].decode() == gid and fields[b"c"] == b"skip"
        info = Admin.from_url(url).job(qname, gid)
        assert info.state == "queued" and info.attempts == 0
        assert _tickets(r, qname) == 0  # the ticket was taken


async def test_a_lost_reply_of_the_blocking_read_runs_the_job_once(
        url: str, qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection drops just as the idle worker's read returns a handed-over job: the job
    is in the worker's pending list under its lease, and the worker's read of its own pending
    entries runs it once, at once (no wait for its lease to lapse)."""
    r = redis.Redis.from_url(url)
    runs: list[int] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> int:
        runs.append(job.attempt)
        return job.attempt

    async with Worker(url, [qname], reg, fast(visibility_timeout_s=60.0)) as w:
        assert w._client is not None
        orig = sends.xreadgroup  # the worker's blocking read (no redis-py command layer)
        lost = [0]
        inbox = Keys(qname).inbox(w._token_prefix)

        async def lossy(*a: Any, **kw: Any) -> Any:
            reply: Any = await orig(*a, **kw)
            if reply and not lost[0] and any(s.decode() == inbox for s, _ in reply):
                lost[0] += 1
                raise redis.ConnectionError("reply of the blocking read lost (test)")
            return reply

        monkeypatch.setattr(fetch_mod, "xreadgroup", lossy)
        await eventually(lambda: _tickets(r, qname) == 1, what="a posted ticket")
        with Queue.from_url(url, qname) as q:
            jid = q.enqueue("t", max_attempts=1).job_id
            await eventually(lambda: q.get(jid).state == "completed",  # type: ignore[union-attr]
                             10, "the job to run once and complete")
            assert q.result(jid) == 1
        assert lost == [1] and runs == [1]


def _stall_on_first_hand_off(monkeypatch: pytest.MonkeyPatch, inbox: list[str], stall_s: float,
                             during: Any = None) -> list[bytes]:
    """The worker's event loop stalls for stall_s just as its blocking read returns the first
    job handed over (a handler blocking the loop, a long GC pause): the reply waits in the
    socket meanwhile. ``during(entry, job id)`` runs at the end of the stall (another worker's
    move). Returns the stream entries of the stalled hand-offs."""
    orig = sends.xreadgroup
    seen: list[bytes] = []

    async def stalling(*a: Any, **kw: Any) -> Any:
        reply: Any = await orig(*a, **kw)
        for stream, entries in reply or []:
            if stream.decode() == inbox[0] and entries and not seen:
                fields = entries[0][1]
                seen.append(fields[b"e"])
                time.sleep(stall_s)  # noqa: ASYNC251 - the stall: the whole loop waits
                if during is not None:
                    during(fields[b"e"].decode(), fields[b"id"].decode())
        return reply

    monkeypatch.setattr(fetch_mod, "xreadgroup", stalling)
    return seen


async def test_a_job_handed_over_during_a_stall_starts_with_a_fresh_lease(
        url: str, qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant 13 for hand-offs: a producer starts the job (its lease counts from then) while
    the worker's loop is stalled for ~3/4 of the visibility timeout. The worker learns of it
    late, so it starts it again as its own (start.lua: same lease, same attempt, idle time
    reset) instead of running it on a lease that would lapse before its first renewal."""
    r = redis.Redis.from_url(url)
    k = Keys(qname)
    runs: list[tuple[int, int]] = []  # (attempt, idle ms of its entry when its handler began)
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> int:
        pending: Any = r.xpending_range(k.stream, GROUP, "-", "+", 10)
        runs.append((job.attempt, int(pending[0]["time_since_delivered"])))
        return job.attempt

    async with Worker(url, [qname], reg, fast(visibility_timeout_s=3.0)) as w:
        inbox = [k.inbox(w._token_prefix)]
        seen = _stall_on_first_hand_off(monkeypatch, inbox, 2.2)
        await eventually(lambda: _tickets(r, qname) == 1, what="a posted ticket")
        with Queue.from_url(url, qname) as q:
            jid = q.enqueue("t").job_id
            await eventually(lambda: q.get(jid).state == "completed",  # type: ignore[union-attr]
                             10, "the job to run and complete")
        assert len(seen) == 1  # it was handed over, during the stall
        assert len(runs) == 1 and runs[0][0] == 1
        assert runs[0][1] < 1000, runs  # its lease began fresh, not 2.2 s spent


async def test_a_job_handed_over_before_a_stall_past_its_lease_runs_once(
        url: str, qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The stall outlasts the visibility timeout and another worker takes the job over (its
    lease lapsed) meanwhile: the stalled worker must not run it too, as a job it read itself
    and started with start.lua would not (start.lua finds the entry is not its own any more)."""
    r = redis.Redis.from_url(url)
    k = Keys(qname)
    runs: list[int] = []
    taken: list[Any] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        runs.append(job.attempt)

    def take_over(entry: str, jid: str) -> None:  # another worker's reclaim of the lapsed lease
        assert r.xautoclaim(k.stream, GROUP, "other", 2000, "0-0", justid=True) == [
            entry.encode()]
        taken.append(start_entries(r, k, "other", [(entry, jid)]))

    async with Worker(url, [qname], reg, fast(visibility_timeout_s=2.0)) as w:
        inbox = [k.inbox(w._token_prefix)]
        seen = _stall_on_first_hand_off(monkeypatch, inbox, 2.3, take_over)
        qs = w._qs[k.tag]
        await eventually(lambda: _tickets(r, qname) == 1, what="a posted ticket")
        with Queue.from_url(url, qname) as q:
            jid = q.enqueue("t").job_id
            # the worker goes through what it was handed and waits for work again
            await eventually(lambda: seen and _tickets(r, qname) == 1 and qs.own_cursor is None
                             and not qs.starting and not qs.handed, 15, "an idle worker again")
            assert taken and taken[0][0] == b"run" and taken[0][2] == 2
            assert 1 not in runs  # the lapsed lease's attempt never ran
            info = q.get(jid)
            assert info is not None and info.attempts == 2
