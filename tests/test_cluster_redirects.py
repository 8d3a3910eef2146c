"""Redirects and the slot map on a real Redis Cluster (the session's ``redis_cluster``, and a
private one grown by a primary): ``min_replicas`` after a reshard (a stale slot map: the
replication barrier of a node's pipeline in a slot that left it must not turn confirmed jobs
into unconfirmed ones); a MOVED that still stands after the redirect rounds (the nodes do not
agree on a slot yet) is transient, retried, never a permanent failure; an ASK to a primary that
owns no slot yet (the target of its first reshard: in no slot map) is followed. Run with the
cluster set: ``pytest -m cluster``."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator

import pytest
from redis.exceptions import AskError, MovedError

from streamq import AsyncQueue, Keys, Queue, QueueConfig, ReplicationTimeout
from streamq._core.cluster_server import ClusterServer
from streamq._core.keys import shard_of
from streamq._core.retry import transient
from streamq.admin import Admin, AsyncAdmin

pytestmark = pytest.mark.cluster


def owners(cluster: ClusterServer, name: str, shards: int) -> list[int]:
    return [cluster.owner(Keys(name, shard=i).stream) for i in range(shards)]


def ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


def same_node_name(cluster: ClusterServer) -> str:
    """A fresh queue name of 2 shards, both on one primary."""
    while True:
        name = f"s-{uuid.uuid4().hex[:10]}"
        a, b = owners(cluster, name, 2)
        if a == b:
            return name


def slot_of(cluster: ClusterServer, key: str) -> int:
    with cluster.node(cluster.ports[0]) as c:
        return int(c.execute_command("CLUSTER", "KEYSLOT", key))


async def test_min_replicas_after_a_reshard_names_no_confirmed_job(
        redis_cluster: ClusterServer) -> None:
    """Both shards of a queue on one primary; shard 0's slot moves to another primary behind
    the producers' backs (their slot maps are stale). The next enqueue_many sends both calls to
    the old primary in one pipeline: shard 0's call and its barrier meet MOVED, shard 1's call
    runs and the WAIT confirms it; shard 0's goes to its new primary, confirmed there. No job
    is named unconfirmed (the barrier was in shard 0's slot only, so every call of the pipeline
    was, though WAIT answered 1)."""
    name = same_node_name(redis_cluster)
    cfg = QueueConfig(shards=2, min_replicas=1, min_replicas_timeout_ms=5000)
    home = owners(redis_cluster, name, 2)[0]
    slot = slot_of(redis_cluster, Keys(name, shard=0).stream)
    away = next(p for p in redis_cluster.primary_ports() if p != home)
    jobs = ids("r", 40)
    assert {shard_of(j, 2) for j in jobs} == {0, 1}
    with Queue.from_url(redis_cluster.url, name, cfg) as q:
        aq = AsyncQueue.from_url(redis_cluster.url, name, cfg)
        try:
            q.enqueue_many([{"type": "ok", "job_id": f"w{i}"} for i in range(8)])
            await aq.enqueue_many([{"type": "ok", "job_id": f"x{i}"} for i in range(8)])
            redis_cluster.migrate_slot(slot, away)
            try:
                try:
                    results = q.enqueue_many([{"type": "ok", "job_id": j} for j in jobs])
                except ReplicationTimeout as exc:
                    pytest.fail(f"confirmed jobs named unconfirmed: {exc.job_ids}")
                assert {r.status for r in results} == {"queued"}
                try:
                    again = await aq.enqueue_many(
                        [{"type": "ok", "job_id": f"y{j}"} for j in jobs])
                except ReplicationTimeout as exc:
                    pytest.fail(f"confirmed jobs named unconfirmed: {exc.job_ids}")
                assert {r.status for r in again} == {"queued"}
                assert redis_cluster.owner(Keys(name, shard=0).stream) == away
            finally:
                redis_cluster.migrate_slot(slot, home)
        finally:
            await aq.close()


def test_moved_and_ask_are_transient() -> None:
    """A redirect reaching a caller: the call did not run, the slot map is changing."""
    assert transient(MovedError("3999 127.0.0.1:7001"))
    assert transient(AskError("3999 127.0.0.1:7001"))


def moved_count(cluster: ClusterServer, *ports: int) -> int:
    total = 0
    for port in ports:
        stat = cluster.info(port, "errorstats").get("errorstat_MOVED")
        total += int(stat["count"]) if stat else 0
    return total


def empty_slot_name(cluster: ClusterServer) -> tuple[str, int, int]:
    """A fresh queue name of 2 shards whose shard 1's slot holds no key (a slot can be handed
    to another node by SETSLOT NODE alone); (name, that slot, its owner)."""
    while True:
        name = f"v-{uuid.uuid4().hex[:10]}"
        key = Keys(name, shard=1).stream
        port = cluster.owner(key)
        slot = slot_of(cluster, key)
        with cluster.node(port) as c:
            if int(c.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) == 0 and \
                    cluster.owner(Keys(name, shard=0).stream) != port:
                return name, slot, port


def test_a_moved_still_standing_after_the_rounds_is_retried(
        redis_cluster: ClusterServer) -> None:
    """The nodes disagree on a slot for a while (its owner hands it to another primary, which
    does not know it yet: each answers MOVED to the other, as in the window of a failover or a
    reshard). An enqueue_many of jobs of that slot and of another follows the redirects, then
    retries that slot's call (a transient error) until the nodes agree, and lands once; it is
    not failed for good (nor are the other slot's jobs, written at once)."""
    name, slot, owner = empty_slot_name(redis_cluster)
    other = next(p for p in redis_cluster.primary_ports() if p != owner)
    jobs = ids("k", 40)  # both shards: two script calls, pipelined per node
    assert {shard_of(j, 2) for j in jobs} == {0, 1}
    cfg = QueueConfig(shards=2)
    fixed = threading.Event()
    stop = threading.Event()
    with Queue.from_url(redis_cluster.url, name, cfg) as q:
        q.enqueue("ok", job_id=next(j for j in ids("h", 40) if shard_of(j, 2) == 0))
        base = moved_count(redis_cluster, owner, other)
        with redis_cluster.node(owner) as c:  # the owner says MOVED other; other says MOVED owner
            c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", redis_cluster.node_id(other))

        def settle() -> None:
            # once the producer met more MOVEDs than one pass of redirect rounds gives,
            # the nodes agree: ``other`` owns the slot
            while not stop.wait(0.01):
                if moved_count(redis_cluster, owner, other) - base > 5:
                    # set first: the producer's retry may land as soon as ``other`` owns the
                    # slot, before finish_migration has told every node and returned
                    fixed.set()
                    with redis_cluster.node(other) as d:
                        d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING",
                                          redis_cluster.node_id(owner))
                    redis_cluster.finish_migration(slot, other)
                    return

        fixer = threading.Thread(target=settle)
        fixer.start()
        try:
            results = q.enqueue_many([{"type": "ok", "job_id": j} for j in jobs])
            assert {r.status for r in results} == {"queued"}
            assert fixed.is_set()
        finally:
            stop.set()
            fixer.join(30)
            if fixed.is_set():
                redis_cluster.migrate_slot(slot, owner)
            else:
                redis_cluster.finish_migration(slot, owner)
        assert redis_cluster.owner(Keys(name, shard=1).stream) == owner
        assert {r.status for r in q.enqueue_many(
            [{"type": "ok", "job_id": j} for j in jobs])} == {"duplicate"}


@pytest.fixture
def grown_cluster() -> Iterator[tuple[ClusterServer, int]]:
    """A private cluster of 3 primaries and a 4th that owns no slot yet (just added)."""
    cluster = ClusterServer(primaries=3, replicas=0).start()
    try:
        yield cluster, cluster.add_primary()
    finally:
        cluster.close()


async def test_ask_to_a_primary_that_owns_no_slot_yet(
        grown_cluster: tuple[ClusterServer, int]) -> None:
    """A queue's slot half moved to a new primary (in no slot map: it owns nothing yet), its
    keys already there: reads pipelined per node and single reads follow the ASK to it; a bulk
    enqueue sent meanwhile lands once the slot is handed over."""
    cluster, new = grown_cluster
    name = f"n-{uuid.uuid4().hex[:10]}"
    k = Keys(name)
    slot = slot_of(cluster, k.stream)
    source = cluster.owner(k.stream)
    with Queue.from_url(cluster.url, name) as q:
        q.enqueue_many([{"type": "ok", "job_id": f"b{i}"} for i in range(5)])
        q.enqueue("ok", job_id="later", delay=3600)
        cluster.begin_migration(slot, new)
        try:
            assert cluster.migrate_keys(slot, source, new, 10_000) >= 7
            admin = Admin.from_url(cluster.url)
            aadmin = AsyncAdmin.from_url(cluster.url)
            try:
                assert admin.dead(name).items == []
                assert [p.job_id for p in (await aadmin.pending(name)).items] == []
                assert (await aadmin.job(name, "later")).state == "scheduled"
                # a single read through redis-py's own routing (it followed the ASK to a
                # node it did not know into an AttributeError)
                info = q.get("b1")
                assert info is not None and info.state == "queued"
            finally:
                admin.close()
                await aadmin.close()
            writer = asyncio.create_task(asyncio.to_thread(
                q.enqueue_many, [{"type": "ok", "job_id": f"m{i}"} for i in range(5)]
                + [{"type": "ok", "job_id": "b0"}]))
        finally:
            cluster.finish_migration(slot, new)
        results = await writer
        assert [r.status for r in results] == ["queued"] * 5 + ["duplicate"]
        assert cluster.owner(k.stream) == new
