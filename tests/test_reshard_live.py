"""Live resharding under load (issue 32, docs/scaling.md#resharding): a queue of 3 shards on
the 3-primary cluster (and on one server) with producer threads enqueueing by explicit ids
(some ids sent twice on purpose, before and after each change) while 2 workers run; the
queue is resharded 3 -> 6 mid-stream (first by a driver abandoned half-way, then by
``Admin.reshard`` again, which completes it) and then 6 -> 3. Every accepted job runs once
(a ledger written by the handler), none is lost, each repeated id is answered duplicate the
second time, the old shards' keys are gone after ``finish`` (but job records, which expire,
and the frozen ``lay`` that turns a stale producer away), and the layout ends at 3 with
live = 3. No timing is asserted: every wait is for a condition, with a generous deadline."""

from __future__ import annotations

import asyncio
import collections
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import eventually, fast

from schedulers import Scheduler, SchedulerConfig
from streamq import Fail, Job, Queue, QueueConfig, Registry, ReshardStatus, Worker
from streamq._core import reshard
from streamq._core.cluster_server import ClusterServer
from streamq._core.conn import sync_client
from streamq._core.driver import _send, drive
from streamq._core.errors import ReplicationTimeout
from streamq._core.keys import Keys, shard_keys, shard_of
from streamq._core.server import RedisServer
from streamq._core.shards import read as read_layout
from streamq.admin import Admin, AsyncAdmin

TESTS = Path(__file__).parent
ACCEPTED = ("queued", "scheduled")


def fresh(cluster: ClusterServer | None) -> str:
    """A queue name whose 6 shards sit on every primary (on the cluster)."""
    while True:
        name = f"rs-{uuid.uuid4().hex[:10]}"
        if cluster is None or len({cluster.owner(k.stream)
                                   for k in shard_keys(name, 6)}) == 3:
            return name


class Ledger:
    """What producers were answered and what handlers ran (thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.answers: dict[str, list[str]] = collections.defaultdict(list)
        self.ran: collections.Counter[str] = collections.Counter()

    def answered(self, jid: str, status: str) -> None:
        with self.lock:
            self.answers[jid].append(status)

    @property
    def accepted(self) -> set[str]:
        with self.lock:
            return {j for j, a in self.answers.items() if a and a[0] in ACCEPTED}


def registry(ledger: Ledger) -> Registry:
    reg = Registry()

    @reg.handler("work")
    async def work(job: Job) -> str:
        await asyncio.sleep(0.002)
        with ledger.lock:
            ledger.ran[job.id] += 1
        return job.id

    return reg


def produce(url: str, name: str, ledger: Ledger, ids: list[str], repeat: list[str]) -> None:
    """One producer thread: each id once (every 10th delayed a little: the scheduler
    promotes it, in whichever shard it went to), then the repeats (ids sent before)."""
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        for n, jid in enumerate([*ids, *repeat]):
            delay = 0.2 if n % 10 == 9 else None
            ledger.answered(jid, q.enqueue("work", job_id=jid, delay=delay).status)


async def phase(url: str, name: str, ledger: Ledger, tag: str, earlier: list[str],
                n: int = 150) -> list[str]:
    """Two producer threads at once, each with its own ids, each repeating some of its own
    ids and some sent in an earlier phase (before the last change)."""
    ids = [f"{tag}-{i}" for i in range(n)]
    halves = [ids[: n // 2], ids[n // 2:]]
    old = earlier[-20:]
    await asyncio.gather(*(asyncio.to_thread(
        produce, url, name, ledger, half, [*half[:5], *old[i::2]])
        for i, half in enumerate(halves)))
    return ids


def leftover(client: Any, name: str, shard: int) -> list[str]:
    """Keys of one shard other than job records and dedup keys (they expire on their own),
    and hand-off inboxes that expire within a minute (a worker stopped before it saw the
    shard retired)."""
    base = Keys(name, shard=shard).base
    found = [k.decode() for k in client.scan_iter(match=f"{base}:*", count=1000)]
    return sorted(k for k in found if not (
        k.startswith((f"{base}:job:", f"{base}:dd:"))
        or (k.startswith(f"{base}:inbox:") and 0 < client.ttl(k) <= 3600)))


def abandoned_begin(url: str, name: str, n: int, steps: int) -> None:
    """Drive ``reshard.begin`` a few steps by hand, then abandon it (a driver that died)."""
    client: Any = sync_client(url)
    try:
        op = reshard.begin(Keys(name), n, 3600)
        step = next(op)
        for _ in range(steps):
            step = op.send(_send(client, step))
    finally:
        client.close()


async def test_reshard_3_to_6_and_back_under_load(where: tuple[str, ClusterServer | None]
                                                  ) -> None:
    url, cluster = where
    name = fresh(cluster)
    cfg = QueueConfig(shards=3)
    ledger = Ledger()
    admin = Admin.from_url(url, cfg)
    client: Any = admin.client
    # the workers promote nothing: the scheduler does (it follows the layout too)
    workers = [Worker(url, [name], registry(ledger), fast(concurrency=8, promote=False), cfg)
               for _ in range(2)]
    sched = Scheduler(url, [name], config=SchedulerConfig(poll_interval_s=0.1),
                      queue_config=cfg)
    try:
        await sched.start()
        for w in workers:
            await w.start()
        a = await phase(url, name, ledger, "a", [])
        # 3 -> 6 begun by a driver that dies after storing 'next' and freezing the shards
        await asyncio.to_thread(abandoned_begin, url, name, 6, 3)
        lay = drive(client, read_layout(Keys(name)))
        assert lay is not None and lay.next == 6 and lay.shards == 3
        # producers meanwhile: refused by the frozen shards, they finish it and resend
        b_task = asyncio.ensure_future(phase(url, name, ledger, "b", a))
        st = await asyncio.to_thread(admin.reshard, name, 6)  # completes the same reshard
        assert isinstance(st, ReshardStatus) and (st.shards, st.live, st.next) == (6, 6, None)
        assert (await asyncio.to_thread(admin.reshard, name, 6)).epoch == st.epoch  # repeat
        b = await b_task
        c = await phase(url, name, ledger, "c", b)
        # new jobs went to shards 3..5 too, and the workers ran them
        await eventually(lambda: ledger.accepted <= set(ledger.ran), 120, "every job ran")
        assert any(shard_of(j, 6) >= 3 for j in c if j in ledger.ran)
        # an admin opened before the reshard reads the whole queue: all 6 shards
        await eventually(lambda: admin.stats(name).counters.get("completed") == len(
            ledger.ran), 60, "completed counted over every shard")
        assert admin.stats(name, shard=5).counters.get("completed", 0) > 0

        # 6 -> 3 while producers run; the old shards drain and are deleted by the workers
        d_task = asyncio.ensure_future(phase(url, name, ledger, "d", c))
        st = await asyncio.to_thread(admin.reshard, name, 3)
        assert (st.shards, st.live, st.prev) == (3, 6, (6,))
        d = await d_task
        e = await phase(url, name, ledger, "e", d)
        await eventually(lambda: ledger.accepted <= set(ledger.ran), 120, "every job ran")
        await eventually(lambda: admin.reshard_status(name).done, 120, "old shards deleted")

        def served() -> bool:
            return all(sorted(qs.keys.shard for qs in w._serving(name)) == [0, 1, 2]
                       for w in workers)

        await eventually(served, 30, "workers serve shards 0..2 only")
        await eventually(lambda: len(sched.shards[name]) == 3, 30, "the scheduler follows")
        st = await asyncio.to_thread(admin.reshard_finish, name)  # safe to repeat
        assert (st.shards, st.live, st.next, st.old) == (3, 3, None, ())
        for i in range(3, 6):
            assert leftover(client, name, i) == [Keys(name, shard=i).stats], i
            assert client.hgetall(Keys(name, shard=i).stats) == {b"lay": b"3"}
        # a late job still runs: the queue goes on with 3 shards
        with Queue.from_url(url, name, cfg) as q:
            assert q.enqueue("work", job_id="late").status == "queued"
        await eventually(lambda: ledger.ran["late"] == 1, 60, "a job after the reshards")
    finally:
        for w in workers:
            await w.stop()
        await sched.stop()
        admin.close()

    sent = [*a, *b, *c, *d, *e]
    # every id was accepted exactly once; every repeat was answered duplicate
    for jid in sent:
        answers = ledger.answers[jid]
        assert answers[0] in ACCEPTED and all(s == "duplicate" for s in answers[1:]), (
            jid, answers)
    assert sum(len(v) - 1 for v in ledger.answers.values()) == 5 * 10 + 4 * 20  # repeats
    assert set(ledger.ran) == set(sent) | {"late"}  # none lost
    assert [j for j, n in ledger.ran.items() if n != 1] == []  # none ran twice


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMQ_URL"}
    return subprocess.run([sys.executable, "-m", "streamq", *args, "--url", url], cwd=TESTS,
                          env=env, capture_output=True, text=True, timeout=60)


async def test_the_reshard_command(url: str) -> None:
    """`streamq reshard Q N` begins and prints the status; `--status` reads it; `--wait`
    finishes once the old shards are drained (here with a worker running); a count that
    conflicts with one being published is refused with its error and a non-zero exit."""
    name = fresh(None)
    ledger = Ledger()
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        ids = [f"j-{i}" for i in range(60)]
        for jid in ids:
            q.enqueue("work", job_id=jid)
    out = await asyncio.to_thread(cli, url, "reshard", name, "2")
    assert out.returncode == 0, out.stderr
    assert f"queue {name}: 2 shards (epoch 1)" in out.stdout
    assert "old shards 2..2 draining:" in out.stdout and "ready" in out.stdout
    out = await asyncio.to_thread(cli, url, "reshard", name, "--status", "--json")
    st = json.loads(out.stdout)
    assert (st["shards"], st["live"], st["prev"], st["old"][0]["shard"]) == (2, 3, [3], 2)
    assert st["old"][0]["ready"] == sum(1 for j in ids if shard_of(j, 3) == 2)
    async with Worker(url, [name], registry(ledger), fast(), QueueConfig(shards=3)):
        await eventually(lambda: set(ledger.ran) == set(ids), 60, "every job ran")
        out = await asyncio.to_thread(cli, url, "reshard", name, "--wait", "--timeout", "60")
    assert out.returncode == 0, out.stderr
    assert "no old shards left" in out.stdout
    abandoned_begin(url, name, 4, 2)  # a reshard to 4 begun ('next' stored), driver gone
    out = await asyncio.to_thread(cli, url, "reshard", name, "5")
    assert out.returncode != 0 and "being resharded to 4 shards" in out.stderr
    out = await asyncio.to_thread(cli, url, "reshard", name, "4")  # finishes that one
    assert out.returncode == 0 and f"queue {name}: 4 shards (epoch 2)" in out.stdout
    out = await asyncio.to_thread(cli, url, "reshard", name)
    assert out.returncode != 0 and "needs a shard count" in out.stderr


async def test_an_old_shard_with_work_is_kept_until_it_is_gone(url: str) -> None:
    """Finish deletes an old shard only once it holds no live work: delayed jobs keep it
    (until they run or are purged), dead letters keep it (re-driven, each goes back into the
    old shard it died in and runs there); the status names what is left; after the delete
    a producer still routing by the old count is turned away by the kept 'lay'."""
    name = fresh(None)
    cfg = QueueConfig(shards=3)
    admin = Admin.from_url(url, cfg)
    client: Any = admin.client
    ids = [f"k-{i}" for i in range(40)]
    old = [j for j in ids if shard_of(j, 3) == 2][:6]
    held, doomed = old[:3], old[3:]
    try:
        with Queue.from_url(url, name, cfg) as q:
            for jid in held:
                q.enqueue("work", job_id=jid, delay=3600)
            for jid in doomed:
                q.enqueue("bad", job_id=jid)
        st = admin.reshard(name, 2)
        assert (st.shards, st.live) == (2, 3)
        assert [(o.shard, o.delayed, o.ready) for o in st.old] == [(2, 3, 3)]
        # a worker: the 'bad' jobs die in shard 2 (their old home)
        fail = [True]
        reg = Registry()

        @reg.handler("bad")
        async def bad(job: Job) -> None:
            if fail[0]:
                raise Fail("no")

        async with Worker(url, [name], reg, fast(promote=False), cfg):
            await eventually(lambda: admin.reshard_status(name).old[0].dead == 3, 30,
                             "dead letters in the old shard")
            st = admin.reshard_finish(name)
            assert st.live == 3 and not st.done  # kept: delayed jobs and dead letters
            assert "re-drive or purge" in "\n".join(st.lines())
            assert admin.purge(name, "scheduled") == 3
            assert not admin.reshard_finish(name).done  # the dead letters still keep it
            fail[0] = False
            assert admin.redrive_matching(name) == {"redriven": 3}
            await eventually(lambda: all(admin.job(name, j).state == "completed"
                                         for j in doomed), 30, "re-driven jobs ran")
            await eventually(lambda: admin.reshard_finish(name).done, 30, "old shard gone")
        assert leftover(client, name, 2) == [Keys(name, shard=2).stats]
        # a producer routing by 3 (an old process) is refused there and resends to shard 0/1
        lay = drive(client, read_layout(Keys(name)))
        assert lay is not None and (lay.shards, lay.live, lay.prev) == (2, 2, (3,))
        with Queue.from_url(url, name, cfg) as q:
            assert q.enqueue("work", job_id=held[0]).status == "queued"
        assert leftover(client, name, 2) == [Keys(name, shard=2).stats]
        assert client.exists(Keys(name, shard=shard_of(held[0], 2)).job(held[0]))
    finally:
        admin.close()


async def test_a_reshard_waits_for_replicas_as_a_producer_does() -> None:
    """With ``min_replicas`` the admin's reshard and finish end with a barrier and WAIT, as an
    enqueue does: one server has no replica, so each call raises the producer's typed error
    (ReplicationTimeout) while its writes stand on the primary, and a repeat (which writes
    nothing) raises it again; with 0 (the default) no WAIT is sent at all."""
    server = RedisServer().start()
    name = fresh(None)
    strict = QueueConfig(shards=3, min_replicas=1, min_replicas_timeout_ms=50)
    plain = Admin.from_url(server.url, QueueConfig(shards=3))
    admin = Admin.from_url(server.url, strict)
    aadmin = AsyncAdmin.from_url(server.url, strict)
    client: Any = plain.client

    def waits() -> int:
        stats: Any = client.info("commandstats")
        return int(stats.get("cmdstat_wait", {}).get("calls", 0))

    try:
        with Queue.from_url(server.url, name, QueueConfig(shards=3)) as q:
            q.enqueue("work", job_id="x")
        assert plain.reshard(name, 2).shards == 2
        assert plain.reshard_finish(name).done
        assert waits() == 0  # min_replicas 0: nothing waits
        with pytest.raises(ReplicationTimeout) as got:
            admin.reshard(name, 4)
        assert (got.value.job_ids, got.value.replicas, got.value.wanted) == ([], 0, 1)
        assert f"the reshard of queue {name!r} to 4 shards" in str(got.value)
        assert waits() == 1
        st = plain.reshard_status(name)
        assert (st.shards, st.epoch) == (4, 2)  # written on the primary all the same
        with pytest.raises(ReplicationTimeout):
            admin.reshard(name, 4)  # a repeat writes nothing: the barrier still waits
        with pytest.raises(ReplicationTimeout):
            await aadmin.reshard(name, 4)
        with pytest.raises(ReplicationTimeout):
            admin.reshard_finish(name)
        with pytest.raises(ReplicationTimeout):
            await aadmin.reshard_finish(name)
        assert waits() == 5 and plain.reshard_status(name).epoch == 2
        out = await asyncio.to_thread(cli, server.url, "reshard", name, "4",
                                      "--min-replicas", "1")
        assert out.returncode != 0 and "confirmed by 0 of 1 replica(s)" in out.stderr
        out = await asyncio.to_thread(cli, server.url, "reshard", name, "4")
        assert out.returncode == 0 and waits() == 6
    finally:
        plain.close()
        admin.close()
        await aadmin.close()
        server.close()


@pytest.mark.cluster
async def test_a_reshard_on_the_cluster_waits_on_each_node(redis_cluster: ClusterServer
                                                            ) -> None:
    """On the cluster (one replica per primary) the reshard's barriers go to the slots of
    its shards, every primary, and each node's WAIT counts its replica: one asked is
    confirmed, two asked raise ReplicationTimeout saying one confirmed."""
    url, name = redis_cluster.url, fresh(redis_cluster)
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        q.enqueue("work", job_id="x")
    one = AsyncAdmin.from_url(url, QueueConfig(shards=3, min_replicas=1,
                                               min_replicas_timeout_ms=5000))
    two = Admin.from_url(url, QueueConfig(shards=3, min_replicas=2, min_replicas_timeout_ms=50))
    try:
        assert (await one.reshard(name, 6)).shards == 6
        with pytest.raises(ReplicationTimeout) as told:
            two.reshard(name, 3)
        assert (told.value.replicas, told.value.wanted) == (1, 2)
        assert (await one.reshard_status(name)).shards == 3
        assert (await one.reshard_finish(name)).done  # (the old shards held nothing)
    finally:
        await one.close()
        two.close()


async def test_the_async_admin_reshards_too(url: str) -> None:
    name = fresh(None)
    with Queue.from_url(url, name, QueueConfig(shards=2)) as q:
        q.enqueue("work", job_id="x")
    admin = AsyncAdmin.from_url(url)
    try:
        st = await admin.reshard(name, 4)
        assert (st.shards, st.live, st.prev, st.done) == (4, 4, (2,), True)
        st = await admin.reshard(name, 2)
        assert (st.shards, st.live, [o.shard for o in st.old]) == (2, 4, [2, 3])
        assert (await admin.reshard_status(name)).live == 4
        st = await admin.reshard_finish(name)  # shards 2 and 3 never held a job
        assert st.done and st.live == 2 and st.prev == (4,)  # (2 is the current count)
    finally:
        await admin.close()
