"""Sentinel and ``min_replicas``, against real servers: a primary, a replica, three sentinels.

The shared set (module scope) serves the tests that leave it as they found it; the failover
test SIGKILLs the primary, so it gets a set of its own. Run alone with ``pytest -m sentinel``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import redis
from chaos.worker import Ledger, build_registry  # the chaos suite's ledger handlers
from helpers import eventually, fast, wait_until

from schedulers import Scheduler, SchedulerConfig
from streamq import (
    AsyncQueue,
    ConnectionSetupError,
    InvalidArgument,
    Job,
    JobInfo,
    JobSpec,
    Queue,
    QueueConfig,
    Registry,
    ReplicationTimeout,
    Worker,
    chain,
)
from streamq._core.retry import transient
from streamq._core.sentinels import SentinelSet
from streamq.admin import Admin, AsyncAdmin

pytestmark = pytest.mark.sentinel
TESTS = Path(__file__).parent


@pytest.fixture(scope="module")
def sentinels() -> Iterator[SentinelSet]:
    with SentinelSet() as s:
        yield s


@pytest.fixture
def surl(sentinels: SentinelSet) -> str:
    return sentinels.url()


def echo_registry() -> Registry:
    reg = Registry()

    @reg.handler("echo")
    async def echo(job: Job) -> Any:
        return job.payload

    return reg


def sched_config() -> SchedulerConfig:
    return SchedulerConfig(poll_interval_s=0.2, sweep_interval_s=0.5)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "streamq", *args], cwd=TESTS, env=env,
                          capture_output=True, text=True, timeout=60)


async def test_every_component_works_through_a_sentinel_url(surl: str, qname: str) -> None:
    cfg = QueueConfig(min_replicas=1, min_replicas_timeout_ms=5000)
    q = Queue.from_url(surl, qname, cfg)
    aq = AsyncQueue.from_url(surl, qname, cfg)
    worker = Worker(surl, [qname], echo_registry(), fast(promote=False), cfg)
    try:
        async with worker, Scheduler(surl, [qname], config=sched_config(), queue_config=cfg):
            assert (await aq.enqueue("echo", {"n": 1}, job_id="now")).status == "queued"
            later = q.enqueue("echo", {"n": 2}, job_id="later", delay=0.3)
            assert later.status == "scheduled"  # promoted by the scheduler, not the worker
            many = await aq.enqueue_many([{"type": "echo", "payload": i} for i in range(50)])
            assert {r.status for r in many} == {"queued"}
            assert await aq.enqueue_and_wait("echo", {"n": 3}, timeout=20) == {"n": 3}
            assert await asyncio.to_thread(
                q.enqueue_and_wait, "echo", {"n": 4}, timeout=20) == {"n": 4}
            await eventually(lambda: (i := q.get("later")) is not None
                             and i.state == "completed", timeout_s=20,
                             what="the scheduler to promote and a worker to run 'later'")
            assert await aq.result("now", timeout=20) == {"n": 1}
            await eventually(lambda: worker.stats.completed >= 54, timeout_s=20,
                             what="every job completed")
        admin = Admin.from_url(surl)
        try:
            assert admin.stats(qname).counters["completed"] >= 54
        finally:
            admin.close()
        aadmin = AsyncAdmin.from_url(surl)
        try:
            assert (await aadmin.stats(qname)).counters["completed"] >= 54
        finally:
            await aadmin.close()
        out = await asyncio.to_thread(cli, "stats", qname, "--url", surl, "--json")
        assert out.returncode == 0, out.stdout + out.stderr
        assert qname in out.stdout and "completed" in out.stdout
    finally:
        q.close()
        await aq.close()


async def test_the_dashboard_reads_through_a_sentinel_url(surl: str, qname: str) -> None:
    """create_app takes the same URL forms as everything else: pages and an action work
    behind Sentinel."""
    import httpx

    from streamq.dashboard import create_app

    with Queue.from_url(surl, qname) as q:
        q.enqueue("echo", {"n": 1}, job_id="shown")
    app = create_app(surl)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://dash") as http:
            overview = await http.get("/")
            assert overview.status_code == 200 and qname in overview.text
            job = await http.get("/job", params={"q": qname, "id": "shown"})
            assert job.status_code == 200 and "shown" in job.text
    finally:
        await app.state.dashboard.admin.close()


async def test_a_primary_name_no_sentinel_knows_is_one_clear_error(
        sentinels: SentinelSet, qname: str) -> None:
    url = sentinels.url().replace(f"/{sentinels.name}/", "/no-such-primary/")
    with pytest.raises(ConnectionSetupError, match="no-such-primary"):
        await Worker(url, [qname], echo_registry(), fast()).start()
    with pytest.raises(ConnectionSetupError, match="knows a primary named"):
        Queue.from_url(url, qname).enqueue("echo")
    for args in (("worker", "cli_jobs:registry", "--queue", qname), ("stats", qname)):
        out = await asyncio.to_thread(cli, *args, "--url", url)
        assert out.returncode != 0
        assert "knows a primary named 'no-such-primary'" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_min_replicas_is_validated() -> None:
    for bad in ({"min_replicas": -1}, {"min_replicas": 1.5}, {"min_replicas_timeout_ms": 0},
                {"min_replicas_timeout_ms": -5}):
        with pytest.raises(InvalidArgument):
            QueueConfig(**bad)
    assert QueueConfig().min_replicas == 0  # the default: no WAIT at all


async def test_fewer_replicas_than_asked_is_a_typed_error_and_the_jobs_stand(
        surl: str, qname: str, sentinels: SentinelSet) -> None:
    """Two replicas asked, one exists: every enqueue path raises ReplicationTimeout naming
    the jobs, which are written on the primary; sending them again is safe (dedup)."""
    cfg = QueueConfig(min_replicas=2, min_replicas_timeout_ms=50)
    q = Queue.from_url(surl, qname, cfg)
    aq = AsyncQueue.from_url(surl, qname, cfg)
    try:
        with pytest.raises(ReplicationTimeout) as one:
            q.enqueue("echo", job_id="j1")
        assert one.value.job_ids == ["j1"] and (one.value.replicas, one.value.wanted) == (1, 2)
        assert "written on the primary" in str(one.value)
        with pytest.raises(ReplicationTimeout) as many:
            q.enqueue_many([{"type": "echo", "job_id": f"m{i}"} for i in range(3)])
        assert many.value.job_ids == ["m0", "m1", "m2"]
        assert [r.status for r in many.value.results] == ["queued"] * 3
        with pytest.raises(ReplicationTimeout) as aone:
            await aq.enqueue("echo", job_id="a1")
        assert aone.value.job_ids == ["a1"]
        with pytest.raises(ReplicationTimeout):
            await aq.enqueue_many([{"type": "echo", "job_id": "a2"}])
        # auto-batched: concurrent single enqueues share one call and one WAIT
        got = await asyncio.gather(*(aq.enqueue("echo", job_id=f"b{i}") for i in range(20)),
                                   return_exceptions=True)
        assert all(isinstance(g, ReplicationTimeout) for g in got)
        assert {f"b{i}" for i in range(20)} <= {j for g in got for j in g.job_ids}  # type: ignore[union-attr]
        for jid in ("j1", "m0", "m2", "a1", "a2", "b0", "b19"):
            info = q.get(jid)
            assert info is not None and info.state == "queued", jid
        # the replica has them too (it was there, only slower than asked for)
        plain = Queue.from_url(surl, qname)
        try:
            assert plain.enqueue("echo", job_id="j1").status == "duplicate"
        finally:
            plain.close()
        replica = sentinels.node(next(n.port for n in sentinels.nodes
                                      if n.port != sentinels.primary_port()))
        r = redis.Redis(port=replica.port, protocol=2)
        try:
            wait_until(lambda: r.exists(q.keys.job("b19")), what="the replica to catch up")
        finally:
            r.close()
    finally:
        q.close()
        await aq.close()


def test_a_lagging_replica_times_the_wait_out_even_for_a_duplicate(
        surl: str, qname: str, sentinels: SentinelSet) -> None:
    """With the replica frozen (SIGSTOP), an enqueue is not confirmed: ReplicationTimeout,
    the job stands on the primary. Sent again by a fresh producer (a connection that wrote
    nothing) it answers duplicate and is still not confirmed: the WAIT covers the write it
    found, not only its own connection's. Once the replica runs again, it is confirmed."""
    replica = sentinels.node(next(n.port for n in sentinels.nodes
                                  if n.port != sentinels.primary_port()))
    assert replica.proc is not None
    cfg = QueueConfig(min_replicas=1, min_replicas_timeout_ms=100)
    replica.proc.send_signal(signal.SIGSTOP)
    try:
        with Queue.from_url(surl, qname, cfg) as first, pytest.raises(ReplicationTimeout):
            first.enqueue("echo", job_id="lagged")
        with Queue.from_url(surl, qname, cfg) as again:
            with pytest.raises(ReplicationTimeout) as told:
                again.enqueue("echo", job_id="lagged")
            assert [r.status for r in told.value.results] == ["duplicate"]
            info = again.get("lagged")
            assert info is not None and info.state == "queued"
    finally:
        replica.proc.send_signal(signal.SIGCONT)
    patient = attrs.evolve(cfg, min_replicas_timeout_ms=10_000)
    with Queue.from_url(surl, qname, patient) as later:
        assert later.enqueue("echo", job_id="lagged").status == "duplicate"  # confirmed now


def test_a_reshard_waits_for_the_replica(surl: str, qname: str) -> None:
    """``Admin.reshard`` / ``reshard_finish`` with ``min_replicas``: the replica confirms the
    reshard's writes, so the call answers; asked for two, it raises ReplicationTimeout naming
    the one that confirmed (the reshard stands on the primary)."""
    with Queue.from_url(surl, qname, QueueConfig(shards=2)) as q:
        q.enqueue("echo", job_id="x")
    one = Admin.from_url(surl, QueueConfig(shards=2, min_replicas=1,
                                           min_replicas_timeout_ms=5000))
    two = Admin.from_url(surl, QueueConfig(shards=2, min_replicas=2,
                                           min_replicas_timeout_ms=50))
    try:
        assert one.reshard(qname, 3).shards == 3
        assert one.reshard_finish(qname).done
        with pytest.raises(ReplicationTimeout) as told:
            two.reshard(qname, 2)
        assert (told.value.replicas, told.value.wanted) == (1, 2)
        assert one.reshard_status(qname).shards == 2
    finally:
        one.close()
        two.close()


async def test_a_worker_whose_wait_times_out_warns_and_goes_on(
        surl: str, qname: str, caplog: pytest.LogCaptureFixture) -> None:
    Queue.from_url(surl, qname).enqueue_many([{"type": "echo", "payload": i}
                                              for i in range(20)])
    cfg = QueueConfig(min_replicas=2, min_replicas_timeout_ms=20)
    with caplog.at_level(logging.WARNING, logger="streamq.worker"):
        async with Worker(surl, [qname], echo_registry(), fast(), cfg) as worker:
            await eventually(lambda: worker.stats.completed == 20, timeout_s=20,
                             what="the jobs to complete despite the short WAIT")
            unconfirmed = worker._settler.unreplicated.jobs if worker._settler else 0
    assert unconfirmed >= 1
    warnings = [r.getMessage() for r in caplog.records if "replica" in r.getMessage()]
    assert len(warnings) == 1, warnings  # rate-limited: one line for many batches
    # one replica or none within 20 ms, as the machine's load decides: the line says which
    assert re.search(r"confirmed by [01] of 2 replica\(s\)", warnings[0]), warnings[0]
    assert "run again" in warnings[0]


async def test_a_demoted_primary_is_dropped_for_the_new_one(
        surl: str, qname: str, sentinels: SentinelSet) -> None:
    """SENTINEL FAILOVER: the old primary lives on as a replica, answering READONLY to writes
    (and UNBLOCKED to a blocked XREADGROUP). The same producer, worker and scheduler objects,
    whose pools and subscriptions hold connections to it, carry on with the new primary."""
    cfg = QueueConfig(min_replicas=1, min_replicas_timeout_ms=5000)
    q = Queue.from_url(surl, qname, cfg)
    aq = AsyncQueue.from_url(surl, qname, cfg)
    worker = Worker(surl, [qname], echo_registry(), fast(promote=False), cfg)
    try:
        async with worker, Scheduler(surl, [qname], config=sched_config(), queue_config=cfg):
            # connections to the current primary: pools, the blocked fetch, both subscribers
            assert await aq.enqueue_and_wait("echo", 1, timeout=20) == 1
            assert await asyncio.to_thread(q.enqueue_and_wait, "echo", 2, timeout=20) == 2
            old = await asyncio.to_thread(sentinels.failover)
            new = await asyncio.to_thread(sentinels.wait_failover, old)
            await asyncio.to_thread(sentinels.wait_ready)  # the old one is an in-sync replica
            after = await asyncio.to_thread(q.enqueue, "echo", 3, job_id="after")
            assert after.status == "queued"
            assert await aq.enqueue_and_wait("echo", 4, timeout=20) == 4
            assert await asyncio.to_thread(q.enqueue_and_wait, "echo", 5, timeout=20) == 5
            await asyncio.to_thread(q.enqueue, "echo", 6, job_id="later", delay=0.2)
            await eventually(lambda: (i := q.get("later")) is not None
                             and i.state == "completed", timeout_s=20,
                             what="the scheduler and the worker on the new primary")
            assert await aq.result("after", timeout=20) == 3
        r = redis.Redis(port=new, protocol=2)
        try:
            info = Queue(r, qname).get("after")
            assert info is not None and info.state == "completed"
        finally:
            r.close()
    finally:
        q.close()
        await aq.close()


# --------------------------------------------------------------------------- failover


def test_what_a_sigkill_loses_with_and_without_min_replicas(qname: str) -> None:
    """The replica is cut off (its link killed, and a password set on the primary so that it
    cannot reconnect: a replica that lags), then the primary is SIGKILLed and the replica
    promoted. An enqueue the primary acknowledged with min_replicas=0 is gone, and nothing
    said so; with min_replicas=1 the lost enqueue raised ReplicationTimeout; one that a
    replica confirmed survives."""
    with SentinelSet() as s:
        url = s.url()
        plain = Queue.from_url(url, qname)
        careful = Queue.from_url(url, qname, QueueConfig(min_replicas=1,
                                                         min_replicas_timeout_ms=100))
        try:
            assert careful.enqueue("echo", job_id="confirmed").status == "queued"
            assert plain.get("confirmed") is not None  # both pools hold a connection now
            port = s.primary_port()
            assert port is not None
            primary = redis.Redis(port=port, protocol=2)
            primary.config_set("requirepass", "lag")  # open connections stay signed in
            primary.execute_command("CLIENT", "KILL", "TYPE", "replica")  # type: ignore[no-untyped-call]
            primary.close()
            assert plain.enqueue("echo", job_id="acknowledged").status == "queued"
            with pytest.raises(ReplicationTimeout) as told:
                careful.enqueue("echo", job_id="told")
            assert told.value.job_ids == ["told"] and told.value.replicas == 0
            victim = s.kill_primary()
            s.wait_failover(victim.port)
            assert plain.get("confirmed") is not None  # through the sentinels: the new primary
            assert plain.get("acknowledged") is None  # lost without a word
            assert plain.get("told") is None  # lost too, but its producer was told
        finally:
            plain.close()
            careful.close()

KINDS = ("instant", "instant", "instant", "delayed", "retry", "slow")


def spec(i: int) -> dict[str, Any]:
    kind = KINDS[i % len(KINDS)]
    s: dict[str, Any] = {"type": f"chaos.{kind}", "job_id": f"{kind}-{i:06d}",
                         "max_attempts": 25, "payload": {}}
    if kind == "delayed":
        s["delay"] = 0.2 + (i % 7) / 10
    elif kind == "retry":
        s["payload"] = {"fails": 1, "d": 0.2}
    elif kind == "slow":
        s["payload"] = {"s": 0.2 + (i % 4) / 10}
    return s


class Producer(threading.Thread):
    """Enqueues batches through the sentinel URL with ``min_replicas=1``; a batch whose
    outcome is unknown (a dropped connection) or not confirmed by a replica
    (ReplicationTimeout) is sent again with the same ids until it is; only then is it
    accepted."""

    def __init__(self, url: str, queue: str, rate: float) -> None:
        super().__init__(name="sentinel-producer", daemon=True)
        self.url, self.queue, self.rate = url, queue, rate
        self.cfg = QueueConfig(min_replicas=1, min_replicas_timeout_ms=300)
        self.stop = threading.Event()
        self.accepted: list[str] = []
        self.unconfirmed = 0
        self.resent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        q = Queue.from_url(self.url, self.queue, self.cfg, socket_timeout_s=5.0)
        try:
            i = 0
            t0 = time.monotonic()
            while not self.stop.is_set():
                due = int((time.monotonic() - t0) * self.rate)
                if due <= i:
                    time.sleep(0.02)
                    continue
                batch = [spec(i + k) for k in range(min(due - i, 25))]
                self.send(q, batch)
                i += len(batch)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            q.close()

    def send(self, q: Queue, batch: list[dict[str, Any]]) -> None:
        give_up = time.monotonic() + 60
        while True:
            try:
                results = q.enqueue_many(batch)
                break
            except ReplicationTimeout:
                self.unconfirmed += 1
            except Exception as exc:
                if not transient(exc) or time.monotonic() > give_up:
                    raise
            self.resent += 1
            time.sleep(0.05)
        assert {r.status for r in results} <= {"queued", "scheduled", "duplicate"}, results
        self.accepted.extend(s["job_id"] for s in batch)


async def test_sigkill_of_the_primary_loses_no_accepted_job(tmp_path: Path, qname: str) -> None:
    """Workers, a scheduler and a producer run through the sentinel URL; the primary is
    SIGKILLed; the sentinels promote the replica, whose WAITs then time out (no replica of its
    own: the producer is told and sends those batches again) until the old primary comes back
    as its replica. Every job the producer got accepted (min_replicas=1) completes; every
    handler run whose outcome was not applied started before the new primary took over (a
    lease or a start the failover lost: at-least-once)."""
    ledger = tmp_path / "ledger.jsonl"
    with SentinelSet() as s:
        url = s.url()
        cfg = QueueConfig(min_replicas=1, min_replicas_timeout_ms=300)
        wcfg = fast(concurrency=8, visibility_timeout_s=3.0, promote=False,
                    reclaim_interval_s=0.25)
        workers = [Worker(url, [qname], build_registry(Ledger(str(ledger), f"w{n}")), wcfg,
                          cfg, consumer=f"w{n}") for n in range(2)]
        sched = Scheduler(url, [qname], config=sched_config(), queue_config=cfg)
        waiting = Queue.from_url(url, qname)  # its waiter subscriber must follow the failover
        producer = Producer(url, qname, rate=150)
        direct = redis.Redis(port=s.primary.port, protocol=2)
        try:
            for w in workers:
                await w.start()
            await sched.start()
            producer.start()
            await eventually(lambda: len(_ends(ledger)) >= 150, timeout_s=30,
                             what="jobs to flow before the kill")
            res = await asyncio.to_thread(
                waiting.enqueue_and_wait, "chaos.instant", timeout=20, job_id="waited-1")
            assert res["a"] == 1
            victim = await asyncio.to_thread(s.kill_primary)
            killed_at = time.time()
            new_port = await asyncio.to_thread(s.wait_failover, victim.port)
            took_over = time.time()
            # no replica now: the producer's WAITs time out, it is told, and sends again
            await eventually(lambda: producer.unconfirmed >= 2 or producer.error,
                             timeout_s=30, what="ReplicationTimeouts without a replica")
            await asyncio.to_thread(s.rejoin, victim)
            direct.close()
            direct = redis.Redis(port=new_port, protocol=2)
            before = len(producer.accepted)
            await eventually(lambda: len(producer.accepted) >= before + 150 or producer.error,
                             timeout_s=30, what="the producer to go on after the failover")
            producer.stop.set()
            await asyncio.to_thread(producer.join, 30)
            assert producer.error is None, repr(producer.error)
            # the subscriber of a waiting queue and of the scheduler moved to the new primary
            res = await asyncio.to_thread(
                waiting.enqueue_and_wait, "chaos.instant", timeout=20, job_id="waited-2")
            assert res["a"] == 1
            assert waiting._waiters is not None
            await eventually(lambda: _subscribers(direct, waiting._waiters.channel) == 1,  # type: ignore[union-attr]
                             timeout_s=10, what="the waiter subscriber on the new primary")
            await eventually(lambda: _subscribers(direct, waiting.keys.wake_channel) >= 1,
                             timeout_s=10, what="the scheduler's wake-up subscription")
            accepted = sorted(set(producer.accepted))
            await eventually(lambda: all(i is not None and i.state == "completed" for i in
                                         _read(direct, qname, accepted).values()),
                             timeout_s=60, what="every accepted job to finish")
            records = _read(direct, qname, accepted)
        finally:
            producer.stop.set()
            for w in workers:
                await w.stop()
            await sched.stop()
            waiting.close()
            direct.close()
    _check_ledger(ledger, accepted, records, took_over)
    assert killed_at < took_over
    print(f"producer: {producer.resent} batch(es) sent again, {producer.unconfirmed} of them"
          " after a ReplicationTimeout")
    assert producer.unconfirmed >= 2


def _subscribers(r: redis.Redis, channel: str) -> int:
    reply: Any = r.pubsub_numsub(channel)
    return int(reply[0][1])


def _ends(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [rec for rec in map(json.loads, path.read_text().splitlines()) if rec["ev"] == "e"]


def _read(r: redis.Redis, queue: str, ids: list[str]) -> dict[str, JobInfo | None]:
    """The records, read from the primary ``r`` itself."""
    q = Queue(r, queue)
    return {jid: q.get(jid) for jid in ids}


def _check_ledger(path: Path, accepted: list[str], records: dict[str, JobInfo | None],
                  took_over: float) -> None:
    starts: dict[str, list[dict[str, Any]]] = {}
    ends: dict[str, dict[str, Any]] = {}
    for rec in map(json.loads, path.read_text().splitlines()):
        if rec["ev"] == "s":
            starts.setdefault(rec["job"], []).append(rec)
        elif rec["ev"] == "e":
            ends[rec["x"]] = rec
    unknown = set(starts) - set(accepted) - {"waited-1", "waited-2"}
    assert not unknown, ("runs of jobs never accepted", sorted(unknown)[:5])
    duplicates = 0
    for jid in accepted:
        info = records[jid]
        assert info is not None and info.state == "completed", (jid, info)
        result = info.result
        final = ends.get(result["x"])
        assert final is not None and final["job"] == jid and final["o"] == "ok", (jid, result)
        retried = {int(e["attempt"]) for e in info.errors if e.get("type") == "Retry"}
        applied = {result["x"]}
        for a in retried:  # the run that ended in the Retry the record holds
            runs = [e for e in starts[jid] if e["a"] == a
                    and ends.get(e["x"], {}).get("o") == "retry"]
            assert runs, ("a retry applied that no run ended in", jid, a)
            applied.add(runs[-1]["x"])
        for run in starts[jid]:
            if run["x"] in applied:
                continue
            duplicates += 1
            # a run whose outcome was not applied: its start or its lease was lost with the
            # old primary, so it began before the new primary took over
            assert run["t"] < took_over, ("a duplicate run the failover does not explain",
                                          jid, run, starts[jid])
    print(f"sentinel failover: {len(accepted)} accepted, all completed, {duplicates} duplicate"
          " run(s), each begun before the new primary took over")


async def test_workflow_writes_wait_for_min_replicas_too(surl: str, qname: str) -> None:
    """``depends_on``, ``enqueue_flow``, ``add_children`` and a batch's open and add (sync and
    asyncio) follow their last write with a barrier and a WAIT: with the one replica there is
    they are confirmed; asking for two raises ReplicationTimeout naming the jobs written, which
    stand on the primary, and repeating the call is safe."""
    ok = QueueConfig(min_replicas=1, min_replicas_timeout_ms=5000)
    short = QueueConfig(min_replicas=2, min_replicas_timeout_ms=50)
    with Queue.from_url(surl, qname, ok) as q:
        assert q.enqueue("echo", job_id="d0").status == "queued"
        assert q.enqueue("echo", job_id="w0", depends_on=["d0"]).status == "waiting"
        out = q.enqueue_flow(chain(JobSpec("echo"), JobSpec("echo")), flow_id="f0")
        assert [r.status for r in out.results] == ["queued", "waiting"]
        batch = q.batch(on_complete=JobSpec("echo"), batch_id="b0")
        assert len(batch.add([JobSpec("echo"), JobSpec("echo")]).job_ids) == 2
    with Queue.from_url(surl, qname, short) as q:
        with pytest.raises(ReplicationTimeout) as one:
            q.enqueue("echo", job_id="w1", depends_on=["d0"])
        assert one.value.job_ids == ["w1"] and (one.value.replicas, one.value.wanted) == (1, 2)
        with pytest.raises(ReplicationTimeout) as flow:
            q.enqueue_flow(chain(JobSpec("echo"), JobSpec("echo")), flow_id="f1")
        assert len(flow.value.job_ids) == 2
        assert [r.status for r in flow.value.results] == ["queued", "waiting"]
        for jid in ["w1", *flow.value.job_ids]:
            info = q.get(jid)
            assert info is not None and info.state in ("queued", "waiting"), jid
        with pytest.raises(ReplicationTimeout) as opened:
            q.batch(on_success=JobSpec("echo"), batch_id="b1")
        assert len(opened.value.job_ids) == 1
        with pytest.raises(ReplicationTimeout) as again:  # repeating writes nothing new
            q.enqueue_flow(chain(JobSpec("echo"), JobSpec("echo")), flow_id="f1")
        assert again.value.job_ids == flow.value.job_ids
    async with AsyncQueue.from_url(surl, qname, short) as aq:
        with pytest.raises(ReplicationTimeout) as aflow:
            await aq.enqueue_flow(chain(JobSpec("echo"), JobSpec("echo")), flow_id="f2")
        assert len(aflow.value.job_ids) == 2
        with pytest.raises(ReplicationTimeout) as awaiting:
            await aq.enqueue("echo", job_id="w2", depends_on=["d0"])
        assert awaiting.value.job_ids == ["w2"]
    async with AsyncQueue.from_url(surl, qname, ok) as aq:
        abatch = await aq.batch(on_complete=JobSpec("echo"), batch_id="b2")
        assert len((await abatch.add([JobSpec("echo")])).job_ids) == 1
