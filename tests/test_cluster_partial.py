"""A multi-job write answers per job on a real Redis Cluster (DESIGN.md invariant 16): a
sharded queue's shards live on several primaries, and one primary that stops taking writes
(``CLIENT PAUSE WRITE``: it still answers the cluster bus, so no failover) fails only the
callers and the jobs of its own shard, in the self-batching producer (threads and asyncio) and
in ``enqueue_many`` (``PartialEnqueueError``, every job's outcome); a job that was written is
never reported failed. Run with the cluster set: ``pytest -m cluster``."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from redis.exceptions import TimeoutError as RedisTimeoutError

from streamq import (
    AsyncQueue,
    Keys,
    PartialEnqueueError,
    Queue,
    QueueConfig,
)
from streamq._core.cluster_server import ClusterServer
from streamq._core.keys import shard_of
from streamq._core.retry import transient

pytestmark = pytest.mark.cluster

SHARDS = 3
CFG = QueueConfig(shards=SHARDS)
TIMEOUT = 0.5
"""The producers' socket timeout (s): a paused node's calls time out fast."""


def owners(cluster: ClusterServer, name: str, shards: int) -> list[int]:
    return [cluster.owner(Keys(name, shard=i).stream) for i in range(shards)]


def spread_name(cluster: ClusterServer, shards: int = SHARDS) -> str:
    """A fresh queue name whose shards live on ``shards`` different primaries."""
    while True:
        name = f"p-{uuid.uuid4().hex[:10]}"
        if len(set(owners(cluster, name, shards))) == shards:
            return name


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


@contextmanager
def write_paused(cluster: ClusterServer, port: int) -> Iterator[None]:
    """The primary at ``port`` takes no writes (CLIENT PAUSE WRITE; reads and the cluster bus
    go on, so no failover); unpaused after."""
    with cluster.node(port) as c:
        c.execute_command("CLIENT", "PAUSE", 60_000, "WRITE")
    try:
        yield
    finally:
        with cluster.node(port) as c:
            c.execute_command("CLIENT", "UNPAUSE")


def written(cluster: ClusterServer, name: str, job_id: str) -> bool:
    """The job's record exists on its shard's primary (a read: allowed while paused)."""
    key = Keys(name, shard=shard_of(job_id, SHARDS)).job(job_id)
    with cluster.node(cluster.owner(key)) as c:
        return bool(c.exists(key))


def check_outcomes(cluster: ClusterServer, name: str, outcome: dict[str, Any]) -> None:
    """Shard 0 (paused) answered with its own node's error only; every other shard's job is
    queued; no job reported failed is written."""
    for job_id, got in outcome.items():
        if shard_of(job_id, SHARDS) == 0:
            assert isinstance(got, BaseException), (job_id, got)
            assert transient(got), got
            assert not written(cluster, name, job_id)
        else:
            assert got == "queued", (job_id, got)
            assert written(cluster, name, job_id)


def test_a_paused_node_fails_only_its_own_callers_sync(redis_cluster: ClusterServer) -> None:
    """Threads enqueue one job each (the self-batching producer gathers them) while shard 0's
    primary takes no writes: the callers of the other shards get ``queued``, those of shard 0
    their node's error; then enqueue_many raises PartialEnqueueError with every job's outcome."""
    name = spread_name(redis_cluster)
    paused = owners(redis_cluster, name, SHARDS)[0]
    singles = ids("t", 30)
    bulk = ids("m", 30)
    assert {shard_of(j, SHARDS) for j in singles} == {0, 1, 2}
    with Queue.from_url(redis_cluster.url, name, CFG, socket_timeout_s=TIMEOUT) as q:
        assert {r.status for r in q.enqueue_many(  # every shard used: its node is known
            [{"type": "ok", "job_id": f"w{i}"} for i in range(12)])} == {"queued"}
        outcome: dict[str, Any] = {}
        go = threading.Barrier(len(singles))

        def send(job_id: str) -> None:
            go.wait()
            try:
                outcome[job_id] = q.enqueue("ok", job_id=job_id).status
            except Exception as exc:  # noqa: BLE001 - every outcome is checked
                outcome[job_id] = exc

        with write_paused(redis_cluster, paused):
            threads = [threading.Thread(target=send, args=(j,)) for j in singles]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            check_outcomes(redis_cluster, name, outcome)

            with pytest.raises(PartialEnqueueError) as told:
                q.enqueue_many([{"type": "ok", "job_id": j} for j in bulk])
            exc = told.value
            assert [r.job_id for r in exc.results] == bulk  # every job, the caller's order
            assert exc.job_ids == [j for j in bulk if shard_of(j, SHARDS) == 0]
            assert set(exc.errors) == set(exc.job_ids)
            assert exc.replication is None
            by_id = {r.job_id: r for r in exc.results}
            check_outcomes(redis_cluster, name, {
                j: r.exception if r.status == "error" else r.status for j, r in by_id.items()})
            assert all(by_id[j].reason for j in exc.job_ids)
            # the jobs of the healthy shards are written once: sent again, duplicates
            again = q.enqueue_many([{"type": "ok", "job_id": j} for j in bulk
                                    if j not in exc.errors])
            assert {r.status for r in again} == {"duplicate"}


async def test_a_paused_node_fails_only_its_own_callers_async(
        redis_cluster: ClusterServer) -> None:
    """The same with asyncio: gathered single enqueues, then enqueue_many."""
    name = spread_name(redis_cluster)
    paused = owners(redis_cluster, name, SHARDS)[0]
    singles = ids("a", 30)
    bulk = ids("b", 30)
    async with AsyncQueue.from_url(redis_cluster.url, name, CFG,
                                   socket_timeout_s=TIMEOUT) as q:
        assert {r.status for r in await q.enqueue_many(
            [{"type": "ok", "job_id": f"w{i}"} for i in range(12)])} == {"queued"}
        with write_paused(redis_cluster, paused):
            got = await asyncio.gather(*(q.enqueue("ok", job_id=j) for j in singles),
                                       return_exceptions=True)
            check_outcomes(redis_cluster, name, {
                j: g if isinstance(g, BaseException) else g.status
                for j, g in zip(singles, got, strict=True)})
            with pytest.raises(PartialEnqueueError) as told:
                await q.enqueue_many([{"type": "ok", "job_id": j} for j in bulk])
            results = told.value.results
            assert [r.job_id for r in results] == bulk
            check_outcomes(redis_cluster, name, {
                r.job_id: r.exception if r.status == "error" else r.status for r in results})


def test_enqueue_many_of_one_failed_node_raises_its_error(
        redis_cluster: ClusterServer) -> None:
    """Every job on the paused node: nothing was answered, so its error is raised as it is
    (as before PartialEnqueueError existed)."""
    name = spread_name(redis_cluster)
    paused = owners(redis_cluster, name, SHARDS)[0]
    mine = [j for j in ids("z", 40) if shard_of(j, SHARDS) == 0]
    with Queue.from_url(redis_cluster.url, name, CFG, socket_timeout_s=TIMEOUT) as q:
        q.enqueue_many([{"type": "ok", "job_id": f"w{i}"} for i in range(12)])
        with write_paused(redis_cluster, paused), pytest.raises(RedisTimeoutError):
            q.enqueue_many([{"type": "ok", "job_id": j} for j in mine])
