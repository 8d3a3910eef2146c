"""A live reshard 3 -> 6 under load on a 3-primary loopback cluster, with the ledger's counts.

``python -m benchmarks.reshard_bench [--jobs 30000] [--producers 2] [--workers 2]
[--concurrency 50] [--repeat-every 25] [--out benchmarks/results/reshard.json]``.

A private 3-primary loopback cluster (no replicas, persistence off); one queue of 3 shards
whose 6 shards spread over the primaries. ``--producers`` threads enqueue ``--jobs`` jobs in
all, one ``enqueue`` call each with an explicit id, and every ``--repeat-every``-th call sends
an id sent 100 calls before again (it must be answered ``duplicate``, also across the
change). ``--workers`` workers in this process (``--concurrency`` each, a handler that writes
the ledger) run them. When a third of the jobs are accepted, ``Admin.reshard(queue, 6)``
runs (from another thread, producers and workers going on).

The ledger: enqueued (calls), accepted (answered queued), duplicates (answered duplicate),
ran (distinct ids run), ran twice, lost (accepted, never ran). Drain rate (jobs run per
second, client clock) before the reshard, during it (from its start until every worker
serves the 6 shards), and after (until the last job ran); also how long the reshard call
took and how many jobs ran in the new shards 3..5.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import streamq
from streamq import Job, Queue, QueueConfig, Registry, Worker, WorkerConfig
from streamq._core.cluster_server import ClusterServer
from streamq._core.keys import shard_keys, shard_of
from streamq.admin import Admin


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(streamq.__file__).parent
                              ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Ledger:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.answers: dict[str, list[str]] = collections.defaultdict(list)
        self.ran: collections.Counter[str] = collections.Counter()
        self.ran_at: list[float] = []
        self.accepted_at: dict[str, float] = {}

    def accepted(self) -> int:
        with self.lock:
            return sum(1 for a in self.answers.values() if "queued" in a)


def _produce(url: str, name: str, ledger: Ledger, ids: list[str], every: int) -> None:
    with Queue.from_url(url, name, QueueConfig(shards=3)) as q:
        for n, jid in enumerate(ids):
            send = [jid]
            if every and n % every == every - 1 and n >= 100:
                send.append(ids[n - 100])  # sent before: a duplicate
            for j in send:
                status = q.enqueue("work", job_id=j).status
                with ledger.lock:
                    ledger.calls += 1
                    ledger.answers[j].append(status)
                    if status == "queued":
                        ledger.accepted_at[j] = time.perf_counter()


def _fresh(cluster: ClusterServer) -> str:
    while True:
        name = f"rsb-{uuid.uuid4().hex[:8]}"
        if len({cluster.owner(k.stream) for k in shard_keys(name, 6)}) == 3:
            return name


async def _until(pred: Callable[[], bool], limit_s: float = 300.0) -> None:
    """Poll ``pred`` every 10 ms until true, at most ``limit_s`` (the bench then reports)."""
    for _ in range(int(limit_s * 100)):
        if pred():
            return
        await asyncio.sleep(0.01)


def _rate(times: list[float], start: float, end: float) -> float | None:
    n = sum(1 for t in times if start <= t < end)
    return round(n / (end - start), 1) if end > start else None


async def run(a: argparse.Namespace, url: str, cluster: ClusterServer) -> dict[str, Any]:
    name = _fresh(cluster)
    ledger = Ledger()
    reg = Registry()

    @reg.handler("work")
    async def work(job: Job) -> None:
        with ledger.lock:
            ledger.ran[job.id] += 1
            ledger.ran_at.append(time.perf_counter())

    cfg = QueueConfig(shards=3)
    wcfg = WorkerConfig(concurrency=a.concurrency, block_ms=200)
    workers = [Worker(url, [name], reg, wcfg, cfg) for _ in range(a.workers)]
    for w in workers:
        await w.start()
    per = a.jobs // a.producers
    admin = Admin.from_url(url, cfg)
    t0 = time.perf_counter()
    producers = [asyncio.ensure_future(asyncio.to_thread(
        _produce, url, name, ledger, [f"p{p}-{i}" for i in range(per)], a.repeat_every))
        for p in range(a.producers)]
    try:
        await _until(lambda: ledger.accepted() >= a.jobs // 3)
        t_begin = time.perf_counter()
        st = await asyncio.to_thread(admin.reshard, name, 6)
        t_returned = time.perf_counter()
        await _until(lambda: all(len(w._serving(name)) == 6 for w in workers))
        t_served = time.perf_counter()
        await asyncio.gather(*producers)
        t_produced = time.perf_counter()
        accepted = {j for j, s in ledger.answers.items() if "queued" in s}
        await _until(lambda: accepted <= set(ledger.ran))
        t_end = max(ledger.ran_at)
    finally:
        for w in workers:
            await w.stop()
        admin.close()
    assert st.shards == 6
    answers = [s for v in ledger.answers.values() for s in v]
    dup_ok = all(v[0] == "queued" and all(s == "duplicate" for s in v[1:])
                 for v in ledger.answers.values())
    return {
        "ledger": {
            "enqueued": ledger.calls, "accepted": answers.count("queued"),
            "duplicates": answers.count("duplicate"),
            "repeats_answered_duplicate": dup_ok,
            "ran": len(ledger.ran), "ran_twice": sum(1 for n in ledger.ran.values() if n > 1),
            "lost": len(accepted - set(ledger.ran)),
            # accepted after the reshard call returned, homed in a new shard (3..5)
            "ran_in_new_shards_3_to_5": sum(
                1 for j in ledger.ran if shard_of(j, 6) >= 3
                and ledger.accepted_at.get(j, 0.0) > t_returned),
        },
        "drain_jobs_s": {
            "before": _rate(ledger.ran_at, t0, t_begin),
            "during": _rate(ledger.ran_at, t_begin, t_served),
            "after": _rate(ledger.ran_at, t_served, t_end),
        },
        "seconds": {"before": round(t_begin - t0, 2),
                    "reshard_call": round(t_returned - t_begin, 3),
                    "until_workers_serve_6": round(t_served - t_begin, 3),
                    "producers_done_after_start": round(t_produced - t0, 2),
                    "last_job_after_start": round(t_end - t0, 2)},
        "layout_after": {"shards": st.shards, "live": st.live, "prev": list(st.prev),
                         "epoch": st.epoch},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--jobs", type=int, default=30000)
    ap.add_argument("--producers", type=int, default=2)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--repeat-every", type=int, default=25)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    doc: dict[str, Any] = {"settings": {
        "harness": "benchmarks/reshard_bench.py", "commit": _commit(), "jobs": a.jobs,
        "producers": a.producers, "workers": a.workers, "concurrency": a.concurrency,
        "repeat_every": a.repeat_every, "loadavg_before": _load(),
        "servers": "a 3-primary loopback cluster, no replicas, persistence off; producers"
        " (threads, one enqueue call per job) and workers in the harness process; reshard"
        " 3 -> 6 when a third of the jobs were accepted; 2 cores shared with other work"}}
    with ClusterServer(primaries=3, replicas=0) as cl:
        doc["cluster"] = asyncio.run(run(a, cl.url, cl))
    doc["settings"]["loadavg_after"] = _load()
    text = json.dumps(doc, indent=2) + "\n"
    if a.out is not None:
        a.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
