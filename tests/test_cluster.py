"""Every component on a real Redis Cluster (3 primaries + 3 replicas on loopback, started once
per session by the ``redis_cluster`` fixture): producer, worker, scheduler, cron, admin, CLI,
dashboard, the demo, Spark; a standalone URL at a cluster node; scripts lost by a node; while
jobs flow: a failover, a SIGKILLed primary, a slot migration; calls on a half-moved slot.
Run this set alone with ``pytest -m cluster``."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import eventually, fast
from redis.exceptions import ClusterError, TryAgainError

from schedulers import Cron, Scheduler, SchedulerConfig
from streamq import (
    AsyncQueue,
    ConnectionSetupError,
    Fail,
    Job,
    Keys,
    Queue,
    Registry,
    RetryPolicy,
    Worker,
)
from streamq._core.cluster_server import ClusterServer
from streamq._core.conn import sync_client
from streamq._core.keys import GROUP
from streamq._core.retry import transient
from streamq.admin import Admin, AsyncAdmin

pytestmark = pytest.mark.cluster
TESTS = Path(__file__).parent


def spread_queues(cluster: ClusterServer, n: int) -> list[str]:
    """``n`` fresh queue names whose keys live on ``n`` different primaries."""
    by_node: dict[int, str] = {}
    while len(by_node) < n:
        name = f"c-{uuid.uuid4().hex[:10]}"
        by_node.setdefault(cluster.owner(Keys(name).stream), name)
    return list(by_node.values())


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMQ_URL"}
    return subprocess.run([sys.executable, "-m", "streamq", *args, "--url", url], cwd=TESTS,
                          env=env, capture_output=True, text=True, timeout=60)


def registry(seen: list[str] | None = None) -> Registry:
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> int:
        if seen is not None:
            seen.append(job.id)
        return 1

    @reg.handler("bad")
    async def bad(job: Job) -> None:
        raise Fail(f"bad {job.payload}")

    @reg.handler("flaky")
    async def flaky(job: Job) -> str:
        if job.attempt < 2:
            raise RuntimeError("first try fails")
        return "second"

    return reg


async def test_producer_worker_and_admin_across_nodes(redis_cluster: ClusterServer) -> None:
    url = redis_cluster.url
    names = spread_queues(redis_cluster, 3)
    assert len({redis_cluster.owner(Keys(n).stream) for n in names}) == 3
    seen: list[str] = []
    queues = [Queue.from_url(url, n) for n in names]
    try:
        for i, q in enumerate(queues):
            q.enqueue("ok", job_id=f"one-{i}")
            q.enqueue_many([{"type": "ok", "job_id": f"m{i}-{j}"} for j in range(20)])
            q.enqueue("bad", {"n": i}, job_id=f"bad-{i}")
            q.enqueue("flaky", job_id=f"flaky-{i}", max_attempts=3)
        cfg = fast(retry=RetryPolicy(base_s=0.05, cap_s=0.1))
        async with Worker(url, names, registry(seen), cfg) as w:
            await eventually(lambda: w.stats.completed == 3 * 22 and w.stats.failed >= 3,
                             timeout_s=30, what="every job settled")
            aq = AsyncQueue.from_url(url, names[1])
            try:
                assert await aq.enqueue_and_wait("ok", job_id="waited", timeout=20) == 1
            finally:
                await aq.close()
            assert await asyncio.to_thread(
                queues[2].enqueue_and_wait, "ok", job_id="waited-sync", timeout=20) == 1
        assert sorted(seen) == sorted([f"one-{i}" for i in range(3)]
                                      + [f"m{i}-{j}" for i in range(3) for j in range(20)]
                                      + ["waited", "waited-sync"])
        for i, q in enumerate(queues):
            assert q.result(f"flaky-{i}") == "second"
        admin = Admin.from_url(url)
        try:
            assert set(names) <= set(admin.queues())
            for i, n in enumerate(names):
                s = admin.stats(n)
                assert s.dead == 1 and s.counters["completed"] >= 22
                page = admin.dead(n)
                assert [e.job_id for e in page.items] == [f"bad-{i}"]
                assert admin.redrive(n, page.items) == {"redriven": 1}
                assert admin.stats(n).ready == 1
                admin.pause(n)
                assert admin.stats(n).paused
                admin.resume(n)
                assert admin.purge(n, "queued") == 1
        finally:
            admin.close()
    finally:
        for q in queues:
            q.close()


async def test_async_admin_pending_and_requeue(redis_cluster: ClusterServer) -> None:
    url = redis_cluster.url
    (name,) = spread_queues(redis_cluster, 1)
    q = Queue.from_url(url, name)
    client = sync_client(url)
    try:
        k = q.keys
        client.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
        q.enqueue_many([{"type": "ok", "job_id": f"p{i}"} for i in range(3)])
        client.xreadgroup(GROUP, "stuck", {k.stream: ">"}, count=2)
        admin = AsyncAdmin.from_url(url)
        try:
            page = await admin.pending(name)
            assert [p.job_id for p in page.items] == ["p0", "p1"]
            assert await admin.requeue(name, "p0") == "requeued"
            assert [p.job_id for p in (await admin.pending(name)).items] == ["p1"]
            s = await admin.stats(name)
            assert s.ready >= 1
        finally:
            await admin.close()
    finally:
        q.close()
        client.close()


async def test_scheduler_promotes_and_fires_cron(redis_cluster: ClusterServer) -> None:
    url = redis_cluster.url
    a, b = spread_queues(redis_cluster, 2)
    qa = Queue.from_url(url, a)
    try:
        qa.enqueue("ok", job_id="later", delay=0.3)
        every_second = Cron("tick", every=1, job_type="ok", queue=b)
        cfg = SchedulerConfig(poll_interval_s=30.0, sweep_interval_s=0.1)
        async with Scheduler(url, [a], cron=[every_second], config=cfg) as s:
            await eventually(lambda: qa.client.xlen(qa.keys.stream) == 1, timeout_s=15,
                             what="the delayed job promoted")
            await eventually(lambda: s.fired >= 1, timeout_s=15, what="a cron tick")
        info = qa.get("later")
        assert info is not None and info.state == "queued"
        assert qa.client.xlen(Keys(b).stream) >= 1
    finally:
        qa.close()


async def test_cli_stats_and_dead_list_with_a_cluster_url(
        redis_cluster: ClusterServer) -> None:
    url = redis_cluster.url
    (name,) = spread_queues(redis_cluster, 1)
    with Queue.from_url(url, name) as q:
        q.enqueue("bad", {"n": 1}, job_id="broken", max_attempts=1)
        async with Worker(url, [name], registry(), fast()) as w:
            await eventually(lambda: w.stats.failed == 1, what="the bad job dead-lettered")
        q.enqueue_many([{"type": "ok"} for _ in range(4)])
    stats = await asyncio.to_thread(cli, url, "--json", "stats", name)
    assert stats.returncode == 0, stats.stderr
    row = json.loads(stats.stdout)[0]
    assert (row["ready"], row["dead"]) == (4, 1)
    dead = await asyncio.to_thread(cli, url, "--json", "dead", "list", name)
    assert dead.returncode == 0, dead.stderr
    assert [e["job_id"] for e in json.loads(dead.stdout)["items"]] == ["broken"]
    # the old flag still works: one node's redis:// URL plus --cluster
    node = redis_cluster.node_url(redis_cluster.ports[-1]).removesuffix("/0")
    flagged = await asyncio.to_thread(cli, node, "--cluster", "--json", "stats", name)
    assert flagged.returncode == 0, flagged.stderr
    assert json.loads(flagged.stdout)[0]["ready"] == 4


def test_a_standalone_url_at_a_cluster_node_is_one_clear_error(
        redis_cluster: ClusterServer) -> None:
    node = redis_cluster.node_url(redis_cluster.ports[0])
    with pytest.raises(ConnectionSetupError, match="redis\\+cluster://"):
        Admin.from_url(node).check_server()
    proc = cli(node, "stats")
    assert proc.returncode == 1 and "redis+cluster://" in proc.stderr, proc.stderr

    async def start_worker() -> None:
        async with Worker(node, ["x"], registry(), fast()):
            pass
    with pytest.raises(ConnectionSetupError):
        asyncio.run(start_worker())
    # a producer has no start-up check: the first call that meets MOVED says the same
    elsewhere = next(n for n in (f"c-{uuid.uuid4().hex[:10]}" for _ in range(1000))
                     if redis_cluster.owner(Keys(n).stream) != redis_cluster.ports[0])
    with Queue.from_url(node, elsewhere) as q, \
            pytest.raises(ConnectionSetupError, match="redis\\+cluster://"):
        q.enqueue("ok")


async def test_dashboard_with_a_cluster_url(redis_cluster: ClusterServer) -> None:
    import httpx

    from streamq.dashboard import create_app

    url = redis_cluster.url
    (name,) = spread_queues(redis_cluster, 1)
    with Queue.from_url(url, name) as q:
        q.enqueue("ok", job_id="shown")
    app = create_app(url)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as http:
        page = await http.get("/queue", params={"q": name})
        assert page.status_code == 200, page.text
        job = await http.get("/job", params={"q": name, "id": "shown"})
        assert job.status_code == 200 and "shown" in job.text
    await app.state.dashboard.admin.close()


class Ledger:
    """Ids the producer got accepted, ids the handler ran, and the errors met on the way."""

    def __init__(self) -> None:
        self.accepted: list[str] = []
        self.accepted_at: dict[str, float] = {}
        self.ran: list[str] = []
        self.ran_at: list[tuple[str, float]] = []
        self.producer_errors: list[str] = []
        self.stop = False

    async def produce(self, q: AsyncQueue, prefix: str) -> None:
        """Enqueue ``prefix-0``, ``prefix-1``, … until told to stop. An enqueue that raised
        may or may not have been stored, so the same job id is sent again until one reply
        says accepted (enqueue.lua is safe to repeat with one id: the second is a duplicate)."""
        i = 0
        while not self.stop:
            job_id = f"{prefix}-{i}"
            while True:
                try:
                    await q.enqueue("ok", job_id=job_id)
                    break
                except Exception as exc:  # noqa: BLE001 - the ledger records what happened
                    self.producer_errors.append(f"{type(exc).__name__}: {exc}")
                    await asyncio.sleep(0.05)
            self.accepted.append(job_id)
            self.accepted_at[job_id] = time.monotonic()
            i += 1
            await asyncio.sleep(0.002)

    def check(self, q: Queue) -> dict[str, int]:
        """Every accepted job ran and completed; a job that ran twice was started twice (its
        record counts the attempts): an at-least-once re-run, not a lost or invented one."""
        missing = set(self.accepted) - set(self.ran)
        assert not missing, f"{len(missing)} accepted jobs never ran, e.g. {sorted(missing)[:5]}"
        assert set(self.ran) <= set(self.accepted), "a job ran that nobody enqueued"
        counts = collections.Counter(self.ran)
        for job_id in self.accepted:
            info = q.get(job_id)
            assert info is not None and info.state == "completed", (job_id, info)
            assert info.attempts >= counts[job_id], (job_id, info.attempts, counts[job_id])
        return {"accepted": len(self.accepted), "ran": len(self.ran),
                "duplicates": sum(c - 1 for c in counts.values()),
                "producer_errors": len(self.producer_errors)}


def ledger_registry(ledger: Ledger) -> Registry:
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> None:
        ledger.ran.append(job.id)
        ledger.ran_at.append((job.id, time.monotonic()))
        await asyncio.sleep(0.005)

    return reg


async def flow_while(action: Any, redis_cluster: ClusterServer, name: str,
                     before: int = 150, after: int = 150) -> dict[str, int]:
    """Run a worker and a producer on ``name``; once ``before`` jobs are accepted run the
    blocking ``action()`` in a thread; after ``after`` more, stop producing and wait until every
    accepted job completed. Returns the ledger's figures (checked)."""
    url = redis_cluster.url
    ledger = Ledger()
    producer_q = AsyncQueue.from_url(url, name)
    check_q = Queue.from_url(url, name)
    try:
        async with Worker(url, [name], ledger_registry(ledger), fast()) as w:
            producer = asyncio.create_task(ledger.produce(producer_q, "j"))
            await eventually(lambda: len(ledger.accepted) >= before, timeout_s=30,
                             what=f"{before} jobs accepted")
            await asyncio.to_thread(action)
            mark = len(ledger.accepted)
            await eventually(lambda: len(ledger.accepted) >= mark + after, timeout_s=60,
                             what=f"{after} more jobs accepted after the change")
            ledger.stop = True
            await producer
            await eventually(lambda: set(ledger.ran) >= set(ledger.accepted), timeout_s=60,
                             what="every accepted job to run")
            await eventually(lambda: w.stats.completed >= len(set(ledger.accepted)),
                             timeout_s=30, what="every run settled")
        return ledger.check(check_q)
    finally:
        await producer_q.close()
        check_q.close()


async def test_failover_while_jobs_flow_loses_nothing(redis_cluster: ClusterServer) -> None:
    (name,) = spread_queues(redis_cluster, 1)
    primary = redis_cluster.owner(Keys(name).stream)
    replica = redis_cluster.replicas_of(primary)[0]
    try:
        figures = await flow_while(lambda: redis_cluster.failover(replica), redis_cluster, name)
        assert redis_cluster.owner(Keys(name).stream) == replica  # the slot did change hands
        print("failover ledger:", figures)
    finally:  # the old primary takes its role back: later tests see the starting layout
        if redis_cluster.info(primary, "replication").get("role") != "master":
            redis_cluster.failover(primary)


async def test_slot_migration_while_a_worker_runs_loses_nothing(
        redis_cluster: ClusterServer) -> None:
    (name,) = spread_queues(redis_cluster, 1)
    stream = Keys(name).stream
    source = redis_cluster.owner(stream)
    target = next(p for p in redis_cluster.primary_ports() if p != source)
    with redis_cluster.node(source) as c:
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", stream))
    moved: list[int] = []

    def migrate() -> None:  # small batches: the queue's keys are split between the two nodes
        moved.append(redis_cluster.migrate_slot(slot, target, batch=20, pause_s=0.02))

    figures = await flow_while(migrate, redis_cluster, name)
    assert redis_cluster.owner(stream) == target and moved[0] > 20
    print("migration ledger:", figures, "keys moved:", moved[0])


def test_demo_with_a_cluster_url(redis_cluster: ClusterServer) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STREAMQ_URL"}
    proc = subprocess.run([sys.executable, "-m", "streamq", "demo", "--url", redis_cluster.url,
                           "--jobs", "100"], cwd=TESTS, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "nothing was lost" in proc.stdout


async def test_scripts_are_loaded_again_on_a_node_that_lost_them(
        redis_cluster: ClusterServer) -> None:
    """A promoted replica or a restarted node has an empty script cache: bulk calls (pipelined
    per node), single calls and admin operations load the script and run only the calls that
    met NOSCRIPT again."""
    url = redis_cluster.url
    (name,) = spread_queues(redis_cluster, 1)

    def flush() -> None:
        for port in redis_cluster.primary_ports():
            with redis_cluster.node(port) as c:
                c.script_flush()

    flush()
    with Queue.from_url(url, name) as q:
        q.enqueue_many([{"type": "ok", "job_id": f"s{i}"} for i in range(20)])
        flush()
        q.enqueue("ok", job_id="single")
    flush()
    aq = AsyncQueue.from_url(url, name)
    try:
        await aq.enqueue_many([{"type": "ok", "job_id": f"a{i}"} for i in range(20)])
        # the same ids again: duplicates, nothing enqueued twice
        again = await aq.enqueue_many([{"type": "ok", "job_id": f"a{i}"} for i in range(20)])
        assert all(r.status == "duplicate" for r in again)
    finally:
        await aq.close()
    flush()
    admin = Admin.from_url(url)
    try:
        assert admin.stats(name).ready == 41
        assert admin.purge(name, "queued") == 41
    finally:
        admin.close()


async def test_a_primary_killed_while_jobs_flow(redis_cluster: ClusterServer) -> None:
    """SIGKILL the primary of the queue's slot; its replica takes over after the node timeout
    (2 s here). Replication is asynchronous, so writes the dead primary acknowledged in its last
    moments may be gone: a job accepted just before the kill may be lost, and a job whose start
    or settle was lost runs again. Everything else completes exactly as accepted."""
    url = redis_cluster.url
    (name,) = spread_queues(redis_cluster, 1)
    primary = redis_cluster.owner(Keys(name).stream)
    replica = redis_cluster.replicas_of(primary)[0]
    window_s = 1.0
    """How far before the kill an acknowledged write may not have reached the replica (on
    loopback it is well under a millisecond; the bound is generous)."""
    ledger = Ledger()
    marks: dict[str, float] = {}

    before: dict[str, Any] = {}

    def kill() -> None:
        # the claim below is about asynchronous replication's last moments, so the replica
        # must be streaming from the primary when it dies (not, say, still in a full resync
        # after an earlier test's failover): wait until it has what the primary had just now
        wanted = int(redis_cluster.info(primary, "replication")["master_repl_offset"])
        end = time.monotonic() + 30

        def replica_state() -> dict[str, Any]:
            repl = redis_cluster.info(replica, "replication")
            return {k: repl.get(k) for k in ("role", "master_link_status", "slave_repl_offset",
                                             "master_sync_in_progress")}
        while True:
            before.update(replica_state(), wanted=wanted)
            if (before["master_link_status"] == "up"
                    and int(before["slave_repl_offset"] or 0) >= wanted):
                break
            assert time.monotonic() < end, f"the replica never caught up: {before}"
            time.sleep(0.05)
        marks["kill"] = time.monotonic()
        redis_cluster.kill(primary)
        redis_cluster.wait_promoted(replica)
        marks["promoted"] = time.monotonic()

    producer_q = AsyncQueue.from_url(url, name)
    check_q = Queue.from_url(url, name)
    try:
        async with Worker(url, [name], ledger_registry(ledger),
                          fast(visibility_timeout_s=3.0)) as w:
            producer = asyncio.create_task(ledger.produce(producer_q, "k"))
            await eventually(lambda: len(ledger.accepted) >= 150, timeout_s=30,
                             what="150 jobs accepted")
            await asyncio.to_thread(kill)
            mark = len(ledger.accepted)
            await eventually(lambda: len(ledger.accepted) >= mark + 150, timeout_s=60,
                             what="150 more jobs accepted after the promotion")
            ledger.stop = True
            await producer
            maybe_lost = {j for j, t in ledger.accepted_at.items()
                          if marks["kill"] - window_s <= t <= marks["kill"]}
            must = set(ledger.accepted) - maybe_lost

            def completed() -> bool:
                return all((i := check_q.get(j)) is not None and i.state == "completed"
                           for j in must)
            try:
                await eventually(lambda: set(ledger.ran) >= must, timeout_s=60,
                                 what="every job accepted outside the window to run")
            except AssertionError as exc:
                missing = sorted(must - set(ledger.ran))
                seen = {j: (i.state if (i := check_q.get(j)) is not None else None)
                        for j in missing[:10]}
                raise AssertionError(f"{exc}: {len(missing)} not run, e.g. {seen}; the replica"
                                     f" before the kill: {before}; marks: {marks}") from None
            await eventually(lambda: asyncio.to_thread(completed), timeout_s=60,
                             what="every job accepted outside the window to complete")
            del w
        assert set(ledger.ran) <= set(ledger.accepted), "a job ran that nobody enqueued"
        lost = sorted(maybe_lost - set(ledger.ran))
        counts = collections.Counter(ledger.ran)
        late = {j for j, t in ledger.ran_at if t >= marks["kill"] - window_s}
        unexplained = [j for j, c in counts.items() if c > 1 and j not in late]
        assert not unexplained, f"jobs ran twice with no run near the kill: {unexplained[:5]}"
        print("kill ledger:", {"accepted": len(ledger.accepted), "ran": len(ledger.ran),
                               "lost (acknowledged in the window)": len(lost),
                               "duplicates": sum(c - 1 for c in counts.values()),
                               "producer errors": len(ledger.producer_errors),
                               "promotion s": round(marks["promoted"] - marks["kill"], 1)})
    finally:
        await producer_q.close()
        check_q.close()
        if primary in redis_cluster.down:  # back as a replica, then primary again
            redis_cluster.restart(primary)
        if redis_cluster.info(primary, "replication").get("role") != "master":
            redis_cluster.failover(primary)


async def test_calls_follow_ask_while_a_queues_slot_is_half_moved(
        redis_cluster: ClusterServer) -> None:
    """Mid-migration (the slot MIGRATING on its owner, IMPORTING on the target, the queue's
    keys already moved): reads are answered ASK by the owner and run on the target behind
    ASKING (admin operations, sync and asyncio, pipelined per node; single reads). A write that
    creates a key meets TRYAGAIN until the slot is handed over (Redis refuses a multi-key call
    with a missing key there): it is transient, so an enqueue sent meanwhile waits it out and
    lands once. A read of several keys where some do not exist meets TRYAGAIN too."""
    url = redis_cluster.url
    (name,) = spread_queues(redis_cluster, 1)
    k = Keys(name)
    with redis_cluster.node(redis_cluster.ports[0]) as c:
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", k.stream))
    source = redis_cluster.slot_owner(slot)
    target = next(p for p in redis_cluster.primary_ports() if p != source)
    with Queue.from_url(url, name) as q:
        q.enqueue_many([{"type": "ok", "job_id": f"b{i}"} for i in range(5)])
        q.enqueue("ok", job_id="later", delay=3600)
        redis_cluster.begin_migration(slot, target)
        try:
            assert redis_cluster.migrate_keys(slot, source, target, 10_000) >= 7
            admin = Admin.from_url(url)
            aadmin = AsyncAdmin.from_url(url)
            try:
                assert admin.dead(name).items == []
                assert [p.job_id for p in (await aadmin.pending(name)).items] == []
                info = q.get("b1")
                assert info is not None and info.state == "queued"
                assert (await aadmin.job(name, "later")).state == "scheduled"
                # stats asks EXISTS of four keys, some of which do not exist: Redis answers
                # TRYAGAIN on a half-moved slot, a transient error (the CLI says try again)
                with pytest.raises(TryAgainError) as exc:
                    admin.stats(name)
                assert transient(exc.value)
                # what redis-py raises when it gives up following redirects: also transient
                assert transient(ClusterError("TTL exhausted."))
            finally:
                admin.close()
                await aadmin.close()
            writer = asyncio.create_task(asyncio.to_thread(
                q.enqueue_many, [{"type": "ok", "job_id": f"m{i}"} for i in range(5)]
                + [{"type": "ok", "job_id": "b0"}]))
        finally:
            redis_cluster.finish_migration(slot, target)
        results = await writer
        assert [r.status for r in results] == ["queued"] * 5 + ["duplicate"]
        assert redis_cluster.owner(k.stream) == target
        admin = Admin.from_url(url)
        try:
            assert admin.stats(name).ready == 10
        finally:
            admin.close()


@pytest.mark.spark
@pytest.mark.slow
def test_spark_enqueue_and_read_with_a_cluster_url(redis_cluster: ClusterServer,
                                                   spark: Any) -> None:
    """Spark's executors build their clients from the URL: a redis+cluster:// URL needs no
    flag; cluster=True with one node's redis:// URL is the older spelling of the same."""
    from streamq import QueueConfig
    from streamq._core.config import ALL_EVENTS
    from streamq.spark import enqueue_dataframe, read_events, read_jobs

    url = redis_cluster.url
    (name,) = spread_queues(redis_cluster, 1)
    df = spark.createDataFrame([(f"r{i}", i) for i in range(2000)], ["id", "n"])
    every_event = QueueConfig(event_kinds=ALL_EVENTS)
    counts = enqueue_dataframe(df, url=url, queue=name, job_type="ok", id_col="id",
                               payload_cols=["n"], queue_config=every_event)
    assert (counts.enqueued, counts.duplicates, counts.total_rejected) == (2000, 0, 0)
    one_node = redis_cluster.node_url(redis_cluster.ports[-1]).removesuffix("/0")
    again = enqueue_dataframe(df, url=one_node, queue=name, job_type="ok", id_col="id",
                              payload_cols=["n"], cluster=True)
    assert (again.enqueued, again.duplicates) == (0, 2000)
    events = read_events(spark, url=url, queue=name, partitions=4)
    assert events.select("job_id").distinct().count() == 2000
    jobs = read_jobs(spark, url=one_node, queue=name, cluster=True)
    assert {r["state"]: r["count"] for r in jobs.groupBy("state").count().collect()} == {
        "queued": 2000}
