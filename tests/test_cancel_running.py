"""Cancel of running jobs, against a real redis-server.

A running job's cancel reaches its worker within a second (pub/sub; the lease renewal as the
fallback), cancels an async handler, sets ``job.cancel_requested`` for a sync one, and ends the
job 'cancelled' (never retried, never dead-lettered, never completed afterwards); a job that
finished first ends as it finished and the caller learns which. Handler-raised RateLimited is in
test_cancel_rate_limited.py."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import eventually, fast, field, finish, start_entries, started, state

from streamq import AsyncQueue, Job, JobFailed, Queue, QueueConfig, Registry, Worker
from streamq._core.cluster_server import ClusterServer
from streamq._core.keys import GROUP, shard_of
from streamq._core.scripts import SCRIPTS
from streamq.admin import Admin, AsyncAdmin

TESTS = Path(__file__).parent


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMQ_URL"}
    return subprocess.run([sys.executable, "-m", "streamq", *args, "--url", url], cwd=TESTS,
                          env=env, capture_output=True, text=True, timeout=60)


def events(r: redis.Redis, key: str) -> list[dict[bytes, bytes]]:
    raw: Any = r.xrange(key)
    return [fields for _id, fields in raw]


class Blocking:
    """An async handler that runs until cancelled and one sync handler that polls
    ``job.cancel_requested``; each records what it saw."""

    def __init__(self) -> None:
        self.reg = Registry()
        self.started: dict[str, threading.Event] = {}
        self.ended: dict[str, threading.Event] = {}
        self.runs: dict[str, int] = {}
        self.release = threading.Event()

        @self.reg.handler("block")
        async def block(job: Job) -> str:
            self._begin(job.id)
            try:
                await asyncio.sleep(3600)  # until cancelled
                return "done"
            finally:
                self.ended[job.id].set()

        @self.reg.handler("poll")
        def poll(job: Job) -> str:
            self._begin(job.id)
            try:
                while not job.cancel_requested and not self.release.is_set():
                    time.sleep(0.01)
                return "stopped early" if job.cancel_requested else "done"
            finally:
                self.ended[job.id].set()

    def _begin(self, job_id: str) -> None:
        self.runs[job_id] = self.runs.get(job_id, 0) + 1
        self.ended.setdefault(job_id, threading.Event()).clear()
        self.started.setdefault(job_id, threading.Event()).set()

    async def wait_started(self, job_id: str) -> None:
        await eventually(lambda: self.started.get(job_id, threading.Event()).is_set(),
                         what=f"{job_id} to start")


async def test_cancel_running_async_handler_stops_on_the_cancel_message(url: str, q: Queue
                                                                      ) -> None:
    b = Blocking()
    q.enqueue("block", job_id="a1")
    cfg = fast()
    # the other way a cancel reaches a worker, its next lease renewal, is renew_every_s
    # (10 s) after the start: a handler stopped within 5 s was stopped by the message
    assert cfg.renew_every_s >= 10
    async with Worker(url, [q.name], b.reg, cfg) as w:
        await b.wait_started("a1")
        assert state(q, "a1") == "active"
        res = await asyncio.to_thread(q.cancel, "a1")
        assert (res.code, res.cancelled, res.state, res.final_state) == (
            "cancel_requested", False, "active", "active")
        await eventually(lambda: b.ended["a1"].is_set(), timeout_s=5.0,
                         what="the handler's finally, told by the cancel message")
        await eventually(lambda: state(q, "a1") == "cancelled", timeout_s=2.0,
                         what="the job settled cancelled")
        await eventually(lambda: w.stats.cancelled == 1, what="the worker's count (taken"
                         " when Redis answers)")
        assert w.stats.completed == 0 and w.stats.retried == 0
    assert b.runs["a1"] == 1
    info = q.get("a1")
    assert info is not None and info.finished_at is not None
    counters = q.client.hgetall(q.keys.stats)
    assert int(counters[b"cancelled"]) == 1 and b"failed" not in counters
    assert q.client.xlen(q.keys.stream) == 0 and q.client.zcard(q.keys.delayed) == 0
    assert q.client.xlen(q.keys.dead) == 0
    evs = [f[b"ev"] for f in events(q.client, q.keys.events)]
    assert b"cancel_requested" in evs and b"cancelled" in evs
    with pytest.raises(JobFailed) as err:
        q.result("a1")
    assert err.value.state == "cancelled"


async def test_enqueue_and_wait_ends_with_job_failed_cancelled(url: str, qname: str) -> None:
    b = Blocking()
    aq = AsyncQueue.from_url(url, qname)
    try:
        async with Worker(url, [qname], b.reg, fast()):
            waiter = asyncio.create_task(aq.enqueue_and_wait("block", job_id="w1", timeout=20))
            await b.wait_started("w1")
            res = await aq.cancel("w1", wait_s=5)
            assert res.cancelled and res.code == "cancel_requested"
            assert res.final_state == "cancelled"
            with pytest.raises(JobFailed) as err:
                await asyncio.wait_for(waiter, 5)
            assert err.value.state == "cancelled"
    finally:
        await aq.close()


async def test_sync_handler_polls_cancel_requested(url: str, q: Queue) -> None:
    b = Blocking()
    q.enqueue("poll", job_id="s1")
    async with Worker(url, [q.name], b.reg, fast()) as w:
        await b.wait_started("s1")
        res = await asyncio.to_thread(q.cancel, "s1", wait_s=5)
        assert res.cancelled and res.final_state == "cancelled" and res.state == "active"
        assert b.ended["s1"].is_set()
        await eventually(lambda: w.stats.cancelled == 1,
                         what="the worker's counts (taken when Redis answers)")
    info = q.get("s1")
    assert info is not None and info.state == "cancelled" and info.result is None


async def test_cancel_is_safe_to_repeat(url: str, q: Queue) -> None:
    b = Blocking()
    q.enqueue("poll", job_id="r1")
    k = q.keys
    async with Worker(url, [q.name], b.reg, fast()) as w:
        await b.wait_started("r1")
        keys = [k.job("r1"), k.stream, k.delayed, k.stats, k.events]
        args = [GROUP, "r1", "1000", k.cancel_channel]
        # no worker hears these: the handler is blocked on release, the cx stays as first written
        first = SCRIPTS["cancel"](q.client, keys, args)
        cx = q.client.hget(k.job("r1"), "cx")
        second = SCRIPTS["cancel"](q.client, keys, args)
        assert first == second == [b"cancel_requested", b"active"]
        assert q.client.hget(k.job("r1"), "cx") == cx
        evs = [f[b"ev"] for f in events(q.client, k.events)]
        assert evs.count(b"cancel_requested") == 1
        await eventually(lambda: state(q, "r1") == "cancelled", what="cancelled")
        await eventually(lambda: w.stats.cancelled == 1,
                         what="the worker's counts (taken when Redis answers)")
    # once settled, a repeat answers as a retried cancel would read it
    assert SCRIPTS["cancel"](q.client, keys, args) == [b"not_cancellable", b"cancelled"]
    res = q.cancel("r1")
    assert res.code == "not_cancellable" and res.state == "cancelled"


@pytest.mark.parametrize("outcome", ["retry", "later", "dead", "cancel"])
def test_any_outcome_but_ok_after_a_cancel_ends_cancelled(r: redis.Redis, q: Queue,
                                                          outcome: str) -> None:
    r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    entry, token = started(r, q, "j1")
    assert q.cancel("j1").code == "cancel_requested"
    assert finish(r, q, "j1", entry, token, outcome, "reason" if outcome == "dead"
                  else 1000) == [b"cancelled"]
    assert field(r, q.keys.job("j1"), "state") == b"cancelled"
    assert r.zcard(q.keys.delayed) == 0 and r.xlen(q.keys.dead) == 0
    assert r.xlen(q.keys.stream) == 0 and r.xpending(q.keys.stream, GROUP)["pending"] == 0
    # a repeated finish (lost reply) answers the same and writes nothing more
    assert finish(r, q, "j1", entry, token, outcome) == [b"cancelled"]
    assert int(r.hget(q.keys.stats, "cancelled") or 0) == 1
    assert r.hget(q.keys.stats, "retried") is None and r.hget(q.keys.stats, "failed") is None


def test_ok_arriving_first_wins_and_the_waiting_caller_learns_completed(
        r: redis.Redis, q: Queue) -> None:
    r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    entry, token = started(r, q, "race")
    out: list[Any] = []
    caller = threading.Thread(target=lambda: out.append(q.cancel("race", wait_s=10)))
    caller.start()
    try:
        deadline = time.monotonic() + 5
        while r.hget(q.keys.job("race"), "cx") is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert finish(r, q, "race", entry, token, "ok") == [b"completed"]
    finally:
        caller.join(10)
    (res,) = out
    assert res.code == "cancel_requested" and not res.cancelled
    assert res.final_state == "completed" and "before the cancel" in res.reason
    assert q.result("race") == 42


def test_reclaim_of_a_cancelled_running_job_ends_it_cancelled(r: redis.Redis, q: Queue) -> None:
    """Its worker died: the entry is taken over (XAUTOCLAIM) and start.lua ends the job
    cancelled without running it; the dead worker's late outcome is fenced out."""
    r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    entry, token = started(r, q, "dead-worker", consumer="c1")
    assert q.cancel("dead-worker").code == "cancel_requested"
    r.xautoclaim(q.keys.stream, GROUP, "c2", 0, "0-0")
    reply = start_entries(r, q.keys, "c2", [(entry, "dead-worker")], token="tok-new")
    assert reply[0] == b"skip" and reply[3] == b"cancelled"
    assert field(r, q.keys.job("dead-worker"), "state") == b"cancelled"
    assert r.xlen(q.keys.stream) == 0 and r.xpending(q.keys.stream, GROUP)["pending"] == 0
    assert finish(r, q, "dead-worker", entry, token, "ok") == [b"lost"]
    assert field(r, q.keys.job("dead-worker"), "state") == b"cancelled"
    assert int(r.hget(q.keys.stats, "cancelled") or 0) == 1


async def test_frozen_worker_taken_over_never_runs_the_cancelled_job(url: str, q: Queue) -> None:
    """A worker frozen past the visibility timeout (its lease lapses, it hears nothing): the
    cancel is recorded, another worker reclaims the entry and ends the job cancelled; the job
    never runs again."""
    b = Blocking()
    q.enqueue("poll", job_id="frozen")
    cfg = fast(visibility_timeout_s=0.6)
    w1 = Worker(url, [q.name], b.reg, cfg)
    await w1.start()
    try:
        await b.wait_started("frozen")
        # freeze w1's view of the job: its renewals and its subscription stop
        w1._leases.stop()
        for t in list(w1._loops):
            t.cancel()
        assert (await asyncio.to_thread(q.cancel, "frozen")).code == "cancel_requested"
        async with Worker(url, [q.name], b.reg, cfg) as w2:
            await eventually(lambda: state(q, "frozen") == "cancelled", what="reclaimed")
            assert w2.stats.started == 0
        assert b.runs["frozen"] == 1
    finally:
        b.release.set()
        await w1.stop()
    assert state(q, "frozen") == "cancelled" and b.runs["frozen"] == 1


async def test_lost_message_is_caught_by_the_lease_renewal(url: str, q: Queue) -> None:
    """The request recorded without a message (as if the pub/sub message were lost): the
    renewal reply tells the worker."""
    b = Blocking()
    q.enqueue("block", job_id="quiet")
    async with Worker(url, [q.name], b.reg, fast(visibility_timeout_s=0.6)) as w:
        await b.wait_started("quiet")
        q.client.hset(q.keys.job("quiet"), "cx", 1)
        await eventually(lambda: state(q, "quiet") == "cancelled", timeout_s=3,
                         what="cancelled through the renewal reply")
        await eventually(lambda: w.stats.cancelled == 1,
                         what="the worker's counts (taken when Redis answers)")


@pytest.mark.parametrize("timeout", [None, 30.0])
async def test_handler_that_swallows_its_cancellation_still_ends_cancelled(
        url: str, q: Queue, timeout: float | None) -> None:
    reg = Registry()
    began = asyncio.Event()

    @reg.handler("stubborn", timeout=timeout)
    async def stubborn(job: Job) -> str:
        began.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            return "swallowed"
        return "slept"

    @reg.handler("after")
    async def after(job: Job) -> str:
        await asyncio.sleep(0.01)  # the worker's task machinery still works after an uncancel
        return "fine"

    q.enqueue("stubborn", job_id="st")
    async with Worker(url, [q.name], reg, fast(concurrency=1)) as w:
        await eventually(began.is_set, what="started")
        res = await asyncio.to_thread(q.cancel, "st", wait_s=5)
        assert res.cancelled and res.final_state == "cancelled"
        q.enqueue("after", job_id="af")
        await eventually(lambda: state(q, "af") == "completed", what="the next job")
        await eventually(lambda: w.stats.cancelled == 1 and w.stats.completed == 1,
                         what="the worker's counts (taken when Redis answers)")
    assert q.result("af") == "fine"


async def test_a_heard_cancel_of_an_earlier_job_of_that_id_does_not_stop_a_new_one(
        url: str, q: Queue) -> None:
    """A message for a job id this worker does not run is remembered a little while (its start
    reply may still be on the way); a job of that id started later is stopped only when its
    own record has the request."""
    reg = Registry()

    @reg.handler("quick")
    async def quick(job: Job) -> str:
        await asyncio.sleep(0.05)
        return "ran"

    async with Worker(url, [q.name], reg, fast()) as w:
        assert w._cancels is not None
        w._cancels.deliver(q.keys.tag, "reused")  # as if published for an earlier 'reused'
        q.enqueue("quick", job_id="reused")
        await eventually(lambda: state(q, "reused") == "completed", what="completed")
        assert w.stats.cancelled == 0
    assert q.result("reused") == "ran"


async def test_requests_missed_while_unsubscribed_are_read_on_resubscribing(
        url: str, q: Queue, r: redis.Redis) -> None:
    """The subscriber's connection is killed and the request is recorded without a message
    (as if published while it was away): the worker reads 'cx' of its running jobs when it
    subscribes again (long before a renewal, with a 30 s visibility timeout)."""
    b = Blocking()
    q.enqueue("block", job_id="missed")
    async with Worker(url, [q.name], b.reg, fast(visibility_timeout_s=30)) as w:
        await b.wait_started("missed")
        r.hset(q.keys.job("missed"), "cx", 1)
        r.client_kill_filter(_type="pubsub")
        await eventually(lambda: state(q, "missed") == "cancelled", timeout_s=3,
                         what="cancelled after resubscribing")
        await eventually(lambda: w.stats.cancelled == 1 and w._leases.renewed == 0,
                         what="the worker's counts (taken when Redis answers)")


async def test_cancel_before_launch_never_runs_the_handler(url: str, q: Queue) -> None:
    """A job handed back with its cancel recorded (its worker stopped while it ran) is ended
    by the next start without running."""
    b = Blocking()
    q.enqueue("poll", job_id="handed")
    w1 = Worker(url, [q.name], b.reg, fast(grace_period_s=0.1))
    await w1.start()
    await b.wait_started("handed")
    w1._cancels = None
    w1._leases.on_cancel = None
    for t in list(w1._loops):
        t.cancel()
    assert q.cancel("handed").code == "cancel_requested"
    w1.hurry()
    await w1.stop()
    assert state(q, "handed") == "queued"
    async with Worker(url, [q.name], b.reg, fast()):
        await eventually(lambda: state(q, "handed") == "cancelled", what="cancelled at start")
    b.release.set()
    assert b.runs["handed"] == 1


async def test_cli_and_admin_cancel_a_running_job(url: str, qname: str) -> None:
    b = Blocking()
    q = Queue.from_url(url, qname)
    admin = Admin.from_url(url)
    aadmin = AsyncAdmin.from_url(url)
    try:
        for j in ("c1", "c2", "c3"):
            q.enqueue("poll", job_id=j)
        async with Worker(url, [qname], b.reg, fast()):
            for j in ("c1", "c2", "c3"):
                await b.wait_started(j)
            out = await asyncio.to_thread(cli, url, "cancel", qname, "c1")
            assert out.returncode == 0 and "cancel requested" in out.stdout
            out = await asyncio.to_thread(cli, url, "cancel", qname, "c2", "--wait", "5",
                                          "--json")
            got = json.loads(out.stdout)
            assert out.returncode == 0 and got["cancelled"] is True
            assert got["code"] == "cancel_requested" and got["final_state"] == "cancelled"
            res = await aadmin.cancel(qname, "c3", who="ops@test", wait_s=5)
            assert res.cancelled and res.final_state == "cancelled"
            await eventually(lambda: state(q, "c1") == "cancelled", what="c1 cancelled")
        res2 = await asyncio.to_thread(admin.cancel, qname, "c3")
        assert not res2.cancelled and res2.code == "not_cancellable"
        out = await asyncio.to_thread(cli, url, "cancel", qname, "c3")
        assert out.returncode == 1 and "not cancelled" in out.stdout
        details = [f.get(b"d", b"") for f in events(q.client, q.keys.events)]
        assert b"cancel by ops@test: cancel requested (running)" in details
    finally:
        q.close()
        admin.close()
        await aadmin.close()


async def test_cancel_running_jobs_of_a_sharded_queue(
        where: tuple[str, ClusterServer | None]) -> None:
    url, _cluster = where
    name = f"cx-{uuid.uuid4().hex[:10]}"
    cfg = QueueConfig(shards=3)
    ids = [f"j{i}" for i in range(12)]
    assert {shard_of(j, 3) for j in ids} == {0, 1, 2}
    b = Blocking()
    aq = AsyncQueue.from_url(url, name, cfg)
    try:
        for j in ids:
            await aq.enqueue("block", job_id=j)
        wcfg = fast()
        # within 5 s, before any lease renewal (10 s): by the cancel channel, or where the
        # client has no cluster pub/sub (redis-py before 8.0, make test-floor) by the
        # worker's reading of the running jobs' records every second
        assert wcfg.renew_every_s >= 10
        async with Worker(url, [name], b.reg, wcfg, cfg) as w:
            for j in ids:
                await b.wait_started(j)
            results = await asyncio.gather(*(aq.cancel(j, wait_s=5) for j in ids))
            assert all(r.cancelled and r.final_state == "cancelled" for r in results)
            await eventually(lambda: w.stats.cancelled == len(ids),
                             what="the worker's counts (taken when Redis answers)")
        for j in ids:
            info = await aq.get(j)
            assert info is not None and info.state == "cancelled"
            assert b.ended[j].is_set() and b.runs[j] == 1
    finally:
        await aq.close()


def test_make_job_cancel_requested_for_unit_tests() -> None:
    from streamq.testing import make_job

    assert not make_job().cancel_requested
    assert make_job(cancel_requested=True).cancel_requested


# ------------------------------------------------------------- under faults, with a ledger


def test_cancelled_running_jobs_never_complete_or_retry_under_faults(
        url: str, qname: str, r: redis.Redis, tmp_path: Path) -> None:
    """Worker processes record every handler start and end in a ledger outside Redis. With one
    worker SIGKILLed and one frozen (SIGSTOP) past the visibility timeout, every job is
    cancelled while the others run or wait: each ends 'cancelled', no handler ever ends
    (completes), nothing is retried or dead-lettered, and no job starts after its cancel was
    requested (the events stream orders both, written inside the scripts). The frozen worker,
    thawed, has its late outcomes fenced out."""
    from test_faults import FAST, Procs, executions, read_ledger, registered, wait_until

    procs = Procs(tmp_path)
    q = Queue.from_url(url, qname, QueueConfig(event_kinds=frozenset(
        {"started", "cancel_requested", "cancelled", "retrying", "failed", "completed"})))
    keys = q.keys
    cfg: dict[str, Any] = {"visibility_timeout_s": 1, "reclaim_interval_s": 0.2,
                           "concurrency": 4, **FAST}
    try:
        for name in ("w-a", "w-b"):
            procs.worker(url, qname, name, **cfg)
        for name in ("w-a", "w-b"):
            wait_until(lambda n=name: registered(r, keys, n), 15,  # type: ignore[misc]
                       f"{name} is up", procs.diagnostics)
        ids = [f"k{i}" for i in range(12)]
        for j in ids:
            q.enqueue("job", {"sleep": 60}, job_id=j)
        wait_until(lambda: len(executions(procs.ledger)) >= 8, 15, "8 jobs running",
                   procs.diagnostics)
        procs.sigkill("w-a")
        procs.signal("w-b", signal.SIGSTOP)
        on_b = {x["job"] for x in read_ledger(procs.ledger) if x["consumer"] == "w-b"}
        codes = collections.Counter(q.cancel(j).code for j in ids)
        assert codes == {"cancel_requested": 8, "cancelled": 4}
        procs.worker(url, qname, "w-c", **cfg)
        wait_until(lambda: all(state(q, j) == "cancelled" for j in ids), 30,
                   "every job cancelled", procs.diagnostics)
        procs.signal("w-b", signal.SIGCONT)  # thawed: its outcomes come too late
        wait_until(lambda: int(r.hget(keys.stats, "lease_lost") or 0) >= len(on_b), 15,
                   "the frozen worker's outcomes fenced out", procs.diagnostics)
        procs.stop(["w-b", "w-c"], 20)
    finally:
        procs.close()
        q.close()
    assert all(state(q, j) == "cancelled" for j in ids)
    assert executions(procs.ledger, "end") == collections.Counter()  # nothing completed
    evs: Any = r.xrange(keys.events)
    asked: dict[str, bytes] = {}
    for eid, f in evs:
        job = f[b"job"].decode()
        assert f[b"ev"] not in (b"retrying", b"failed", b"completed"), (job, f)
        if f[b"ev"] == b"cancel_requested":
            asked[job] = eid
        elif f[b"ev"] == b"started":
            assert job not in asked, f"{job} started after its cancel was requested"
    assert len(asked) == 8
    counters = r.hgetall(keys.stats)
    assert int(counters[b"cancelled"]) == 12
    assert b"retried" not in counters and b"failed" not in counters
    assert r.xlen(keys.stream) == 0 and r.zcard(keys.delayed) == 0 and r.xlen(keys.dead) == 0


async def test_dashboard_cancels_a_running_job(url: str, q: Queue) -> None:
    """The dashboard's job page offers cancel for an active job; its POST answers
    'cancel requested' and the worker stops the job."""
    from test_dashboard import client, post

    b = Blocking()
    q.enqueue("block", job_id="d1")
    async with Worker(url, [q.name], b.reg, fast()), client(url, q.name) as c:
        await b.wait_started("d1")
        page = f"/job?q={q.name}&id=d1"
        assert "/action/cancel" in (await c.get(page)).text
        resp = await post(c, "cancel", page, q=q.name, id="d1")
        assert resp.status_code == 200 and "cancel requested" in resp.text
        await eventually(lambda: state(q, "d1") == "cancelled", what="cancelled")
