"""Groups under faults and at scale (docs/fairness.md): worker processes SIGKILLed and frozen
past the visibility timeout and taken over, fairness between a huge group and many small ones,
sharded queues, and Redis Cluster. Every limit is checked on a ledger kept outside Redis."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import eventually, wait_until
from test_groups import Ledger, ledger_registry, workers

from streamq import Job, Queue, QueueConfig, Registry
from streamq._core.cluster_server import ClusterServer
from streamq._core.keys import shard_of
from streamq.admin import Admin

PROCS = Path(__file__).resolve().parent / "procs"


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", encoding="ascii") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def peak_per_group(lines: list[dict[str, Any]], cut: dict[int, float]) -> dict[str, int]:
    """The most handler runs of each group at once: a run lasts from its start line to its
    end line, or to the moment its process was killed or frozen (``cut``: pid -> time)."""
    ends = {(x["pid"], x["job"], x["a"]): x["t"] for x in lines if x["ev"] == "e"}
    evs: list[tuple[float, int, str]] = []
    for x in lines:
        if x["ev"] != "s":
            continue
        end = ends.get((x["pid"], x["job"], x["a"]), cut.get(x["pid"]))
        assert end is not None, f"run of {x['job']} in live pid {x['pid']} never ended"
        evs += [(x["t"], 1, x["g"]), (end, -1, x["g"])]
    cur: dict[str, int] = {}
    peak: dict[str, int] = {}
    for _t, d, g in sorted(evs, key=lambda e: (e[0], e[1])):
        cur[g] = cur.get(g, 0) + d
        peak[g] = max(peak.get(g, 0), cur[g])
    return peak


def test_limit_holds_with_workers_killed_and_frozen(url: str, qname: str,
                                                   tmp_path: Path) -> None:
    cfg: dict[str, Any] = {"group_concurrency": 2}
    ledger = tmp_path / "ledger.jsonl"
    ledger.touch()
    wcfg = {"concurrency": 8, "visibility_timeout_s": 1.5, "block_ms": 200,
            "promote_interval_s": 0.05, "heartbeat_interval_s": 0.5, "grace_period_s": 1.0,
            "group_reconcile_interval_s": 0.5}
    groups = ("a", "b", "c")
    ids = [f"{g}{i}" for g in groups for i in range(12)]
    q = Queue.from_url(url, qname, config=QueueConfig(**cfg))
    q.enqueue_many([{"type": "g", "payload": {"g": j[0], "s": 0.3}, "group": j[0],
                     "job_id": j} for j in ids])
    procs: dict[str, subprocess.Popen[bytes]] = {}
    logs = tmp_path / "workers.log"

    def spawn(name: str) -> subprocess.Popen[bytes]:
        with open(logs, "ab") as err:
            p = subprocess.Popen([sys.executable, str(PROCS / "group_worker.py"), url, qname,
                                  str(ledger), name, json.dumps({"worker": wcfg,
                                                                 "queue": cfg})],
                                 stdout=subprocess.DEVNULL, stderr=err)
        procs[name] = p
        return p

    def lines() -> list[dict[str, Any]]:
        return [json.loads(x) for x in ledger.read_text().splitlines() if x]

    def started() -> int:
        return sum(1 for x in lines() if x["ev"] == "s")

    def ended() -> set[str]:
        return {x["job"] for x in lines() if x["ev"] == "e"}

    def holder(job: str) -> subprocess.Popen[bytes] | None:
        """The live process running the first attempt of ``job``, once it has started it."""
        pids = {x["pid"] for x in lines() if x["ev"] == "s" and x["job"] == job and x["a"] == 1}
        return next((p for p in procs.values() if p.pid in pids), None)

    # Two jobs hold their first attempt for 60 s, so the process killed and the one frozen
    # are each known to hold a running job (taken over after the visibility timeout).
    long = {"g": "a", "s": 0.3, "s1": 60}
    cut: dict[int, float] = {}
    try:
        for name in ("A", "B", "C"):
            spawn(name)
        q.enqueue("g", long, group="a", job_id="a12")
        ids.append("a12")
        wait_until(lambda: holder("a12") is not None, timeout_s=30, what="a12 started")
        a = holder("a12")
        assert a is not None
        a.send_signal(signal.SIGKILL)
        a.wait(10)
        cut[a.pid] = time.time()
        q.enqueue("g", {**long, "g": "b"}, group="b", job_id="b12")
        ids.append("b12")
        wait_until(lambda: holder("b12") is not None, timeout_s=30, what="b12 started")
        b = holder("b12")
        assert b is not None and b.pid not in cut
        b.send_signal(signal.SIGSTOP)  # frozen past the visibility timeout: taken over
        wait_until(lambda: _stopped(b.pid), what="b12's holder frozen")
        cut[b.pid] = time.time()
        spawn("D")
        wait_until(lambda: ended() == set(ids), timeout_s=90,
                   what=f"every job to end ({logs.read_text()[-2000:]})")
        peak = peak_per_group(lines(), cut)
        assert set(peak) == set(groups) and max(peak.values()) <= 2, peak
        for j in ids:
            info = q.get(j)
            assert info is not None and info.state == "completed", (j, info)
        admin = Admin.from_url(url, QueueConfig(**cfg))
        try:
            wait_until(lambda: admin.stats(qname).group_in_flight == 0,
                       what="every slot freed")
            st = admin.stats(qname)
            assert (st.group_waiting, st.groups) == (0, 0)
            assert st.counters.get("reclaimed", 0) >= 2  # a12 and b12 at least were taken over
        finally:
            admin.close()
        print(f"\npeak runs per group (limit 2): {peak}")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(10)
        q.close()


async def test_small_groups_finish_before_the_big_one(url: str, qname: str) -> None:
    """One group of 20,000 jobs and 50 groups of 10, enqueued at once (the big one first):
    every small group's job finishes before 5% of the big group's jobs have."""
    big, small_groups, per_small = 20_000, 50, 10
    cfg = QueueConfig(group_concurrency=2)
    q = Queue.from_url(url, qname, config=cfg)
    q.enqueue_many([{"type": "g", "payload": {"g": "big"}, "group": "big"}
                    for _ in range(big)])
    q.enqueue_many([{"type": "g", "payload": {"g": f"s{i}"}, "group": f"s{i}"}
                    for i in range(small_groups) for _ in range(per_small)])
    order: list[str] = []
    reg = Registry()

    @reg.handler("g")
    async def g(job: Job) -> None:
        order.append(job.payload["g"])

    small_total = small_groups * per_small
    async with workers(url, qname, reg, 2, cfg, concurrency=32):
        await eventually(lambda: sum(1 for x in order if x != "big") >= small_total,
                         timeout_s=60, what="every small group's job")
    last_small = max(i for i, x in enumerate(order) if x != "big")
    big_before = sum(1 for x in order[:last_small] if x == "big")
    print(f"\nbig-group jobs done when the last small-group job finished: {big_before}"
          f" of {big} ({100 * big_before / big:.2f}%)")
    assert big_before < big * 0.05
    q.close()


async def test_a_sharded_queue_applies_limits_per_shard(url: str, qname: str) -> None:
    cfg = QueueConfig(shards=3, group_concurrency=1)
    q = Queue.from_url(url, qname, config=cfg)
    admin = Admin.from_url(url, cfg)
    ids = [f"s{i}" for i in range(30)]
    q.enqueue_many([{"type": "g", "payload": {"g": "s"}, "group": "s", "job_id": j}
                    for j in ids])
    (info,) = admin.groups(qname).items
    shards_used = {shard_of(j, 3) for j in ids}
    assert info.in_flight == len(shards_used) and info.waiting == 30 - len(shards_used)
    admin.set_group_limit(qname, "s", 2)  # every shard
    assert admin.group(qname, "s").in_flight == 2 * len(shards_used)
    ledger = Ledger()
    reg = Registry()

    @reg.handler("g")
    async def g(job: Job) -> None:
        sh = f"shard{shard_of(job.id, 3)}"
        ledger.add(1, sh, job.id)
        ledger.add(1, "all", job.id)
        await asyncio.sleep(0.02)
        ledger.add(-1, sh, job.id)
        ledger.add(-1, "all", job.id)

    async with workers(url, qname, reg, 2, cfg):
        await eventually(lambda: len(ledger.done()) == 30, timeout_s=30, what="all jobs")
    peak = ledger.max_concurrent()
    assert all(v <= 2 for k, v in peak.items() if k.startswith("shard")), peak
    assert peak["all"] <= 2 * 3
    assert admin.stats(qname).group_in_flight == 0
    q.close()
    admin.close()


@pytest.mark.cluster
async def test_groups_on_a_redis_cluster(redis_cluster: ClusterServer) -> None:
    url = redis_cluster.url
    qname = f"gc-{uuid.uuid4().hex[:8]}"
    cfg = QueueConfig(shards=3, group_concurrency=1)
    q = Queue.from_url(url, qname, config=cfg)
    admin = Admin.from_url(url, cfg)
    try:
        ids = [f"{g}{i}" for g in ("x", "y") for i in range(15)]
        q.enqueue_many([{"type": "g", "payload": {"g": j[0]}, "group": j[0], "job_id": j}
                        for j in ids])
        admin.pause_group(qname, "y")
        ledger = Ledger()
        async with workers(url, qname, ledger_registry(ledger), 2, cfg):
            await eventually(lambda: {j for j in ids if j[0] == "x"} <= ledger.done(),
                             timeout_s=30, what="group x")
            assert not any(j[0] == "y" for j in ledger.done())
            assert admin.group(qname, "y").waiting == 15 - admin.group(qname, "y").in_flight
            admin.resume_group(qname, "y")
            await eventually(lambda: len(ledger.done()) == 30, timeout_s=30, what="all jobs")
        assert admin.stats(qname).group_in_flight == 0
        assert admin.groups(qname).items == []
    finally:
        q.close()
        admin.close()



async def test_groups_drain_clean_through_retries_failures_cancels_and_changes(
        url: str, qname: str) -> None:
    """A random mix (seeded): retries, dead letters, cancels of waiting and admitted jobs,
    limits raised and lowered, groups paused and resumed, all while three workers run. Every
    job ends (completed, failed or cancelled), no group ever runs more than the highest limit
    it had, and every group key is empty at the end (no slot leaked, nothing left waiting)."""
    import random

    from streamq import Fail, Retry, RetryPolicy

    rnd = random.Random(17)
    cfg = QueueConfig(group_concurrency=2)
    q = Queue.from_url(url, qname, config=cfg)
    admin = Admin.from_url(url, cfg)
    ledger = Ledger()
    reg = Registry()

    @reg.handler("g")
    async def g(job: Job) -> None:
        grp, kind = job.payload["g"], job.payload["k"]
        ledger.add(1, grp, job.id)
        try:
            await asyncio.sleep(0.03)
            if kind == "retry" and job.attempt == 1:
                raise Retry(delay_s=0.05)
            if kind == "fail":
                raise Fail("no")
        finally:
            ledger.add(-1, grp, job.id)

    groups = [f"m{i}" for i in range(8)]
    kinds = ["ok"] * 17 + ["retry", "retry", "fail"]
    ids = [f"j{i}" for i in range(400)]
    jobs = []
    for j in ids:
        gr = rnd.choice(groups)
        jobs.append({"type": "g", "payload": {"g": gr, "k": rnd.choice(kinds)}, "group": gr,
                     "job_id": j})
    q.enqueue_many(jobs)
    terminal = ("completed", "failed", "cancelled")

    def states() -> dict[str, int]:
        out: dict[str, int] = {}
        for j in ids:
            info = q.get(j)
            s = info.state if info else "gone"
            out[s] = out.get(s, 0) + 1
        return out

    async with workers(url, qname, reg, 3, cfg, retry=RetryPolicy(base_s=0.05, cap_s=0.1)):
        for step in range(30):
            act = rnd.choice(["limit", "limit", "pause", "cancel", "cancel", "rest"])
            grp = rnd.choice(groups)
            if act == "limit":
                await asyncio.to_thread(admin.set_group_limit, qname, grp, rnd.randint(1, 3))
            elif act == "pause":
                await asyncio.to_thread(admin.pause_group, qname, grp)
                await asyncio.sleep(0.05)
                await asyncio.to_thread(admin.resume_group, qname, grp)
            elif act == "cancel":
                for j in rnd.sample(ids, 5):
                    await asyncio.to_thread(q.cancel, j)
            await asyncio.sleep(0.03 * (step % 3))
        await eventually(lambda: sum(v for k, v in states().items() if k in terminal) == 400,
                         timeout_s=60, what=f"every job to end ({states()})")
        await eventually(lambda: admin.stats(qname).group_in_flight == 0, what="slots free")
    st = states()
    assert st.get("failed", 0) > 0 and st.get("cancelled", 0) > 0 and st.get("completed", 0)
    peak = ledger.max_concurrent()
    assert max(peak.values()) <= 3, peak
    r = redis.Redis.from_url(url)
    k = q.keys
    assert r.zcard(k.group_wait) == 0 and r.zcard(k.group_inflight) == 0
    assert r.zcard(k.group_index) == 0 and r.xlen(k.stream) == 0
    r.close()
    q.close()
    admin.close()
