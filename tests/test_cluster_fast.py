"""The worker's fast paths on a Redis Cluster (issue 32): script calls and the idle blocking
read are packed by streamq (hiredis) and sent to the slot's node on a connection streamq holds,
not through redis-py's cluster command layer, and an idle read sends no ``COMMAND GETKEYS``
before it; a slot that moves while a worker holds jobs (its kept connections point at the old
owner: MOVED) still settles every job. Run with the cluster set: ``pytest -m cluster``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
import redis.asyncio.cluster
from helpers import eventually

from streamq import Job, Keys, Queue, Registry, Worker, WorkerConfig
from streamq._core.cluster_server import ClusterServer
from streamq._core.keys import GROUP

pytestmark = pytest.mark.cluster


def stat(cluster: ClusterServer, port: int, section: str, name: str, field: str) -> int:
    got = cluster.info(port, section).get(name)
    return int(got[field]) if got else 0


def drained(cluster: ClusterServer, name: str) -> bool:
    """The queue's stream holds no entry and its group none pending."""
    stream = Keys(name).stream
    with cluster.node(cluster.owner(stream)) as c:
        pending: Any = c.xpending(stream, GROUP)
        return bool(c.xlen(stream) == 0 and pending["pending"] == 0)


def calls(cluster: ClusterServer, port: int, command: str) -> int:
    return stat(cluster, port, "commandstats", f"cmdstat_{command}", "calls")


def getkeys_calls(cluster: ClusterServer) -> int:
    return sum(calls(cluster, p, "command|getkeys") for p in cluster.primary_ports())


async def test_a_worker_on_a_cluster_packs_its_calls_and_reads_without_getkeys(
        redis_cluster: ClusterServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """No script call of the worker goes through redis-py's cluster client (the calls are
    packed by streamq for the slot's node), and while the worker waits idle, its blocking
    reads reach the node with no COMMAND GETKEYS round trip before each."""
    through_redis_py: list[str] = []
    original = redis.asyncio.cluster.RedisCluster.execute_command

    async def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        through_redis_py.append(str(args[0]).upper())
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(redis.asyncio.cluster.RedisCluster, "execute_command", spy)
    name = f"fast-{uuid.uuid4().hex[:10]}"
    port = redis_cluster.owner(Keys(name).stream)
    n = 300
    done: list[str] = []
    reg = Registry()

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        done.append(job.id)

    with Queue.from_url(redis_cluster.url, name) as q:
        q.enqueue_many([{"type": "noop"} for _ in range(n)])
        async with Worker(redis_cluster.url, [name], reg,
                          WorkerConfig(concurrency=20, block_ms=50)) as w:
            await eventually(lambda: w.stats.completed >= n, timeout_s=60,
                             what="every job settled")
            assert "EVALSHA" not in through_redis_py
            # idle now: the worker waits in blocking reads
            # (redis-py sends its COMMAND GETKEYS to whichever node its command table came from)
            reads, getkeys = calls(redis_cluster, port, "xreadgroup"), getkeys_calls(redis_cluster)
            spied = len(through_redis_py)
            await eventually(lambda: calls(redis_cluster, port, "xreadgroup") >= reads + 10,
                             timeout_s=30, what="ten idle blocking reads")
            # redis-py's path sends one GETKEYS per read (10 or more); this one none (the
            # bound leaves room for another client of the session's cluster)
            assert getkeys_calls(redis_cluster) - getkeys < 5
            assert "XREADGROUP" not in through_redis_py[spied:]
        assert sorted(set(done)) == sorted(done) and len(done) == n
        assert drained(redis_cluster, name)


async def test_a_slot_moved_mid_drain_still_settles_every_job(
        redis_cluster: ClusterServer) -> None:
    """A worker settles 100 jobs (its settling and reading connections now point at the
    queue's primary) and then holds 10 more in handlers; the queue's slot moves to another
    primary; released, the held jobs settle through MOVED on the kept connection, and the rest
    of the backlog drains on the new owner: every job completes once."""
    name = f"fast-{uuid.uuid4().hex[:10]}"
    stream = Keys(name).stream
    source = redis_cluster.owner(stream)
    target = next(p for p in redis_cluster.primary_ports() if p != source)
    with redis_cluster.node(source) as c:
        slot = int(c.execute_command("CLUSTER", "KEYSLOT", stream))
    n, first, conc = 400, 100, 10
    ran: list[str] = []
    gate = asyncio.Event()
    reg = Registry()

    @reg.handler("step")
    async def step(job: Job) -> None:
        if job.payload["i"] >= first:
            await gate.wait()
        ran.append(job.id)

    with Queue.from_url(redis_cluster.url, name) as q:
        ids = [r.job_id for r in q.enqueue_many(
            [{"type": "step", "payload": {"i": i}} for i in range(n)])]
        async with Worker(redis_cluster.url, [name], reg,
                          WorkerConfig(concurrency=conc, fetch_batch=conc)) as w:
            await eventually(lambda: w.stats.completed >= first and w.stats.started
                             >= first + conc, timeout_s=60, what="100 settled, 10 held")
            moved0 = stat(redis_cluster, source, "errorstats", "errorstat_MOVED", "count")
            await asyncio.to_thread(redis_cluster.migrate_slot, slot, target)
            assert redis_cluster.owner(stream) == target
            gate.set()
            await eventually(lambda: w.stats.completed >= n, timeout_s=60,
                             what="every job settled after the move")
        assert stat(redis_cluster, source, "errorstats", "errorstat_MOVED", "count") > moved0
        assert sorted(ran) == sorted(ids)  # each ran once: no lease lapsed, none lost
        assert all(q.get(i).state == "completed" for i in ids[:: 37])  # type: ignore[union-attr]
        assert drained(redis_cluster, name)


def test_a_producer_packs_lone_enqueues_and_follows_a_moved_slot(
        redis_cluster: ClusterServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone enqueue on a cluster client is packed by streamq for the slot's node (not
    through redis-py's cluster command layer); after the queue's slot moves behind the
    producer's back (its slot map is stale: MOVED), enqueues go on and nothing is lost."""
    import redis.cluster

    through_redis_py: list[str] = []
    original = redis.cluster.RedisCluster.execute_command

    def spy(self: Any, *args: Any, **kwargs: Any) -> Any:
        through_redis_py.append(str(args[0]).upper())
        return original(self, *args, **kwargs)  # type: ignore[no-untyped-call]

    monkeypatch.setattr(redis.cluster.RedisCluster, "execute_command", spy)
    name = f"fast-{uuid.uuid4().hex[:10]}"
    stream = Keys(name).stream
    source = redis_cluster.owner(stream)
    target = next(p for p in redis_cluster.primary_ports() if p != source)
    with Queue.from_url(redis_cluster.url, name) as q:
        before = [q.enqueue("noop", {"i": i}).job_id for i in range(5)]
        assert "EVALSHA" not in through_redis_py
        with redis_cluster.node(source) as c:
            slot = int(c.execute_command("CLUSTER", "KEYSLOT", stream))
        moved0 = stat(redis_cluster, source, "errorstats", "errorstat_MOVED", "count")
        redis_cluster.migrate_slot(slot, target)
        after = [q.enqueue("noop", {"i": i}).job_id for i in range(5)]
        assert stat(redis_cluster, source, "errorstats", "errorstat_MOVED", "count") > moved0
        for job_id in before + after:
            info = q.get(job_id)
            assert info is not None and info.state == "queued", (job_id, info)
        with redis_cluster.node(target) as c:
            assert c.xlen(stream) == 10
