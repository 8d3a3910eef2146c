"""``QueueConfig.min_replicas`` on a real Redis Cluster (3 primaries + 3 replicas on loopback,
the session's ``redis_cluster``): each node's pipeline carries its own WAIT, after its calls,
on its connection; a producer is told (ReplicationTimeout) about the jobs of the nodes whose
replicas fell short, and only those; with min_replicas=1 a SIGKILLed primary loses no job the
producer was told was accepted. Run with the cluster set: ``pytest -m cluster``."""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from helpers import eventually, fast, wait_until

from streamq import (
    AsyncQueue,
    Job,
    JobSpec,
    Keys,
    Queue,
    QueueConfig,
    Registry,
    ReplicationTimeout,
    Worker,
    chain,
)
from streamq._core.cluster_server import ClusterServer
from streamq._core.keys import shard_of
from streamq._core.retry import transient

pytestmark = pytest.mark.cluster

CFG = QueueConfig(min_replicas=1, min_replicas_timeout_ms=5000)
SHORT = QueueConfig(min_replicas=1, min_replicas_timeout_ms=100)


def owners(cluster: ClusterServer, name: str, shards: int) -> list[int]:
    return [cluster.owner(Keys(name, shard=i).stream) for i in range(shards)]


def spread_name(cluster: ClusterServer, shards: int = 3) -> str:
    """A fresh queue name whose ``shards`` shards live on ``shards`` different primaries."""
    while True:
        name = f"d-{uuid.uuid4().hex[:10]}"
        if len(set(owners(cluster, name, shards))) == shards:
            return name


def registry(seen: list[str]) -> Registry:
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> int:
        seen.append(job.id)
        return 1

    return reg


@contextmanager
def frozen(cluster: ClusterServer, primary: int) -> Iterator[int]:
    """SIGSTOP the replica of ``primary`` (SIGCONT and a healthy cluster after)."""
    (replica,) = cluster.replicas_of(primary)
    proc = cluster.procs[replica]
    proc.send_signal(signal.SIGSTOP)
    try:
        yield replica
    finally:
        proc.send_signal(signal.SIGCONT)
        cluster.wait_healthy()


async def test_min_replicas_on_a_healthy_cluster(redis_cluster: ClusterServer) -> None:
    """Single, many and auto-batched enqueues (sync and asyncio), over a queue of one shard and
    one of three shards on three nodes, are confirmed; a worker settles with a WAIT per batch
    and every outcome is confirmed too; a duplicate sent again is confirmed (the barrier)."""
    url = redis_cluster.url
    one = spread_name(redis_cluster, 1)
    three = spread_name(redis_cluster, 3)
    sharded = QueueConfig(shards=3, min_replicas=1, min_replicas_timeout_ms=5000)
    with Queue.from_url(url, one, CFG) as q, Queue.from_url(url, three, sharded) as qs:
        assert q.enqueue("ok", job_id="a").status == "queued"
        assert {r.status for r in q.enqueue_many(
            [{"type": "ok", "job_id": f"m{i}"} for i in range(50)])} == {"queued"}
        assert q.enqueue("ok", job_id="a").status == "duplicate"
        results = qs.enqueue_many([{"type": "ok", "job_id": f"s{i}"} for i in range(60)])
        assert {r.status for r in results} == {"queued"}
        assert len({shard_of(f"s{i}", 3) for i in range(60)}) == 3
        threads = [threading.Thread(target=qs.enqueue, args=("ok",),
                                    kwargs={"job_id": f"t{i}"}) for i in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    async with AsyncQueue.from_url(url, three, sharded) as aq:
        got = await asyncio.gather(*(aq.enqueue("ok", job_id=f"x{i}") for i in range(16)))
        assert {r.status for r in got} == {"queued"}
        assert {r.status for r in await aq.enqueue_many(
            [{"type": "ok", "job_id": f"y{i}"} for i in range(30)])} == {"queued"}
    seen: list[str] = []
    async with Worker(url, [one], registry(seen), fast(), CFG) as w:
        await eventually(lambda: w.stats.completed == 51, timeout_s=30,
                         what="the 51 jobs to complete")
        assert w._settler is not None and w._settler.unreplicated.jobs == 0
    async with Worker(url, [three], registry(seen), fast(), sharded) as w:
        await eventually(lambda: w.stats.completed == 60 + 16 + 16 + 30, timeout_s=30,
                         what="the sharded queue's jobs to complete")
        assert w._settler is not None and w._settler.unreplicated.jobs == 0


async def test_a_frozen_replica_names_only_its_nodes_jobs(redis_cluster: ClusterServer) -> None:
    """The replica of shard 0's primary is SIGSTOPped: an enqueue there raises
    ReplicationTimeout and the job stands; sent again (a duplicate: the keyed barrier) it is
    still not confirmed; enqueue_many over three shards on three nodes names exactly the jobs
    of shard 0; auto-batched single enqueues raise only for those jobs. After SIGCONT the
    same enqueue is confirmed."""
    url = redis_cluster.url
    name = spread_name(redis_cluster, 3)
    cfg = QueueConfig(shards=3, min_replicas=1, min_replicas_timeout_ms=100)
    primary = owners(redis_cluster, name, 3)[0]
    ids = [f"j{i}" for i in range(30)]
    mine = {j for j in ids if shard_of(j, 3) == 0}
    assert mine and len(mine) < len(ids)
    first = sorted(mine)[0]
    other = next(j for j in ids if j not in mine)
    with Queue.from_url(url, name, cfg) as q:
        with frozen(redis_cluster, primary):
            with pytest.raises(ReplicationTimeout) as told:
                q.enqueue("ok", job_id=first)
            assert told.value.job_ids == [first]
            info = q.get(first)
            assert info is not None and info.state == "queued"  # it stands on the primary
            with Queue.from_url(url, name, cfg) as fresh, \
                    pytest.raises(ReplicationTimeout) as again:
                fresh.enqueue("ok", job_id=first)  # a connection that wrote nothing
            assert [r.status for r in again.value.results] == ["duplicate"]
            assert q.enqueue("ok", job_id=other).status == "queued"  # another node: confirmed
            with pytest.raises(ReplicationTimeout) as many:
                q.enqueue_many([{"type": "ok", "job_id": j} for j in ids])
            assert set(many.value.job_ids) == mine
            assert [r.job_id for r in many.value.results] == ids  # every job, caller's order
            assert {r.status for r in many.value.results} <= {"queued", "duplicate"}
            singles = [f"k{i}" for i in range(24)]
            outcome: dict[str, str] = {}

            def send(job_id: str) -> None:
                try:
                    outcome[job_id] = q.enqueue("ok", job_id=job_id).status
                except ReplicationTimeout as exc:
                    assert exc.job_ids == [job_id]
                    outcome[job_id] = "unconfirmed"
            threads = [threading.Thread(target=send, args=(j,)) for j in singles]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert {j for j, s in outcome.items() if s == "unconfirmed"} == {
                j for j in singles if shard_of(j, 3) == 0}
            assert {s for j, s in outcome.items() if shard_of(j, 3) != 0} == {"queued"}
        patient = QueueConfig(shards=3, min_replicas=1, min_replicas_timeout_ms=10_000)
        with Queue.from_url(url, name, patient) as later:
            assert later.enqueue("ok", job_id=first).status == "duplicate"  # confirmed now


class Producer(threading.Thread):
    """Enqueues one job at a time with ``min_replicas=1`` (the auto-batched path). A job
    whose outcome is unknown (a transient error) or not confirmed (ReplicationTimeout) is sent
    again under the same id until it is; only then is it accepted."""

    def __init__(self, url: str, queue: str) -> None:
        super().__init__(name="cluster-durable-producer", daemon=True)
        self.url, self.queue = url, queue
        self.stop = threading.Event()
        self.accepted: list[str] = []
        self.unconfirmed: set[str] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        q = Queue.from_url(self.url, self.queue, QueueConfig(min_replicas=1,
                                                             min_replicas_timeout_ms=300))
        try:
            i = 0
            while not self.stop.is_set():
                job_id = f"p{i:06d}"
                self.send(q, job_id)
                i += 1
                time.sleep(0.005)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
        finally:
            q.close()

    def send(self, q: Queue, job_id: str) -> None:
        give_up = time.monotonic() + 60
        while True:
            try:
                r = q.enqueue("ok", job_id=job_id)
                break
            except ReplicationTimeout:
                self.unconfirmed.add(job_id)
            except Exception as exc:
                if not transient(exc) or time.monotonic() > give_up:
                    raise
            self.stop.wait(0.05)
        assert r.status in ("queued", "duplicate"), r
        self.accepted.append(job_id)


async def test_sigkill_of_the_primary_loses_no_accepted_job(
        redis_cluster: ClusterServer) -> None:
    """A producer (min_replicas=1) and a worker run; the primary of the queue's slot is
    SIGKILLed and its replica promoted. Until the old primary is back as the new one's replica
    the WAITs time out (no replica): the producer is told and sends those jobs again under the
    same ids. Every job the producer was told was accepted completes: zero lost."""
    url = redis_cluster.url
    name = spread_name(redis_cluster, 1)
    primary = owners(redis_cluster, name, 1)[0]
    (replica,) = redis_cluster.replicas_of(primary)
    seen: list[str] = []
    producer = Producer(url, name)
    check = Queue.from_url(url, name)
    try:
        async with Worker(url, [name], registry(seen),
                          fast(visibility_timeout_s=3.0, reclaim_interval_s=0.25), SHORT):
            producer.start()
            await eventually(lambda: len(producer.accepted) >= 100 or producer.error,
                             timeout_s=30, what="100 jobs accepted before the kill")
            await asyncio.to_thread(redis_cluster.kill, primary)
            await asyncio.to_thread(redis_cluster.wait_promoted, replica)
            await eventually(lambda: producer.unconfirmed or producer.error, timeout_s=30,
                             what="a ReplicationTimeout on the promoted replica")
            await asyncio.to_thread(redis_cluster.restart, primary)  # its replica now
            mark = len(producer.accepted)
            await eventually(lambda: len(producer.accepted) >= mark + 100 or producer.error,
                             timeout_s=30, what="100 more jobs accepted after the rejoin")
            producer.stop.set()
            await asyncio.to_thread(producer.join, 30)
            assert producer.error is None, repr(producer.error)
            accepted = sorted(set(producer.accepted))

            def unfinished() -> list[str]:
                return [j for j in accepted
                        if (i := check.get(j)) is None or i.state != "completed"]
            await eventually(lambda: not unfinished(), timeout_s=60,
                             what="every accepted job to complete")
        assert set(seen) >= set(accepted)
        assert producer.unconfirmed <= set(accepted)  # told, sent again, completed
        print("cluster kill with min_replicas=1:", {
            "accepted": len(accepted), "lost": 0, "told ReplicationTimeout":
            len(producer.unconfirmed), "ran": len(seen),
            "duplicates": len(seen) - len(set(seen))})
    finally:
        producer.stop.set()
        check.close()
        if primary in redis_cluster.down:
            redis_cluster.restart(primary)
        if redis_cluster.info(primary, "replication").get("role") != "master":
            redis_cluster.failover(primary)
        wait_until(lambda: redis_cluster.owner(Keys(name).stream) == primary, timeout_s=30,
                   what="the roles restored")


async def test_a_flow_over_two_nodes_waits_on_each(redis_cluster: ClusterServer) -> None:
    """A chain whose steps live in queues on two primaries: with the replicas up it is
    confirmed; with the second node's replica frozen, ReplicationTimeout names the flow's jobs
    (which stand), sync and asyncio; after SIGCONT the same flow again is confirmed."""
    url = redis_cluster.url
    first = spread_name(redis_cluster, 1)
    primary = owners(redis_cluster, first, 1)[0]
    second = next(n for n in (f"e-{uuid.uuid4().hex[:10]}" for _ in range(1000))
                  if owners(redis_cluster, n, 1)[0] != primary)
    flow = chain(JobSpec("ok"), JobSpec("ok", queue=second))
    with Queue.from_url(url, first, CFG) as q:
        assert len(q.enqueue_flow(flow, flow_id="ok1").job_ids) == 2
        with frozen(redis_cluster, owners(redis_cluster, second, 1)[0]):
            with Queue.from_url(url, first, SHORT) as qs, \
                    pytest.raises(ReplicationTimeout) as told:
                qs.enqueue_flow(flow, flow_id="cut1")
            assert told.value.job_ids == ["cut1.0", "cut1.1"]
            async with AsyncQueue.from_url(url, first, SHORT) as aq:
                with pytest.raises(ReplicationTimeout):
                    await aq.enqueue_flow(flow, flow_id="cut2")
            info = q.get("cut1.0")
            assert info is not None and info.state == "queued"  # it stands on the primary
        assert q.enqueue_flow(flow, flow_id="cut1").job_ids == ["cut1.0", "cut1.1"]
