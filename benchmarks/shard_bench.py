"""What sharding a queue costs: one queue with N shards drained by one worker (or several),
on one redis-server and on a 3-primary loopback cluster, against the same queue unsharded.

``python -m benchmarks.shard_bench [--jobs 20000] [--concurrency 100] [--workers 1]
[--shards 1,3,6,12] [--setups one,cluster] [--repeat 3] [--json] [--out FILE]``.

For each setup (a private redis-server; a private 3-primary loopback cluster, no replicas,
persistence off) and each run, every shard count gets a fresh queue (on the cluster its
shards spread as evenly as can be over the primaries: 12 shards = 4 per primary), filled with
``--jobs`` no-op jobs by ``enqueue_many`` (not measured), then drained by ``--workers``
workers in this process, each of ``--concurrency``, no-op handler. The shard counts of one run
go one after the other, in a rotated order per run, so a drift in the machine's load touches
every count alike. Measured over the drain: Redis CPU (``INFO cpu`` user + sys of every
primary, µs per job, in all and per node), script calls (``INFO commandstats``: EVALSHA +
EVAL) and all commands per job, the worker process's CPU per job (``time.process_time``) and
jobs/s. Every figure is the median of ``--repeat`` runs; ``ratio_to_unsharded`` divides each
shard count's medians by those of shards=1 of the same setup. On a machine with fewer cores
than primaries read the Redis CPU per job (in all, and its split over the nodes), not jobs/s.

``--callgrind``: every redis-server runs under ``valgrind --tool=callgrind`` (instrumentation
off until the drain: ``callgrind_control -i on -z`` before it, ``-i off -d`` after), and the
figures gain the instructions each server ran per drained job: a count that does not move
with the machine's load. Time inside the servers is dilated about 50x, so the worker's held
turn (``streamq._worker.slots.HOLD_MAX_S``) is stretched 50x too; a server's periodic work
(cron, cluster bus) counts for 50x more per job as well, alike for every shard count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import redis

import streamq
from streamq import Job, Queue, QueueConfig, Registry, Worker, WorkerConfig
from streamq._core.cluster_server import ClusterServer
from streamq._core.keys import shard_keys
from streamq._core.server import RedisServer

_KEYS = ("drain_jobs_s", "worker_cpu_us_per_job", "redis_cpu_us_per_job",
         "script_calls_per_job", "commands_per_job")


def _counters(ports: list[int]) -> dict[int, tuple[float, int, int]]:
    """Per server: (CPU s, script calls, all commands)."""
    out = {}
    for port in ports:
        with redis.Redis(port=port, protocol=2) as c:
            cpu: Any = c.info("cpu")
            stats: Any = c.info("commandstats")
            scripts = sum(int(stats.get(f"cmdstat_{n}", {}).get("calls", 0))
                          for n in ("evalsha", "eval"))
            allc = sum(int(v.get("calls", 0)) for v in stats.values())
            out[port] = (float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]), scripts,
                         allc)
    return out


class _Callgrind:
    """Each server's instructions over a drain (``--callgrind``)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shard-bench-cg-"))
        self.binary = self.dir / "redis-server"
        self.binary.write_text(
            "#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no --dump-instr=no"
            f" --callgrind-out-file={self.dir}/out.%p redis-server \"$@\"\n")
        self.binary.chmod(0o755)

    @staticmethod
    def _pid(port: int) -> int:
        with redis.Redis(port=port, protocol=2) as c:
            info: Any = c.info("server")
            return int(info["process_id"])

    @staticmethod
    def _ctl(pid: int, *args: str) -> None:
        subprocess.run(["callgrind_control", *args, str(pid)], check=True,
                       capture_output=True, timeout=300)

    def start(self, ports: list[int]) -> None:
        for port in ports:
            pid = self._pid(port)
            for f in self.dir.glob(f"out.{pid}.*"):
                f.unlink()
            self._ctl(pid, "-i", "on")
            self._ctl(pid, "-z")

    def stop(self, ports: list[int]) -> dict[int, int]:
        out = {}
        for port in ports:
            pid = self._pid(port)
            self._ctl(pid, "-i", "off")
            self._ctl(pid, "-d")
            dumps = sorted(self.dir.glob(f"out.{pid}.*"), key=lambda f: f.stat().st_mtime)
            totals = [line for line in dumps[-1].read_text().splitlines()
                      if line.startswith(("summary:", "totals:"))]
            out[port] = int(totals[-1].split()[1])
        return out


def _queue(cl: ClusterServer | None, shards: int) -> str:
    """A fresh queue name; on the cluster one whose shards spread evenly over the primaries."""
    while True:
        name = f"shb-{uuid.uuid4().hex[:8]}"
        if cl is None:
            return name
        per: dict[int, int] = {}
        for k in shard_keys(name, shards):
            per[cl.owner(k.stream)] = per.get(cl.owner(k.stream), 0) + 1
        if len(per) == min(shards, 3) and max(per.values()) - min(per.values()) <= 1:
            return name


async def _drain(url: str, name: str, cfg: QueueConfig, n: int, ports: list[int],
                 workers: int, concurrency: int, cg: _Callgrind | None = None
                 ) -> dict[str, Any]:
    reg = Registry()
    done = [0]
    finished = asyncio.Event()

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        done[0] += 1
        if done[0] == n:
            finished.set()

    wcfg = WorkerConfig(concurrency=concurrency, block_ms=200)
    ws = [Worker(url, [name], reg, wcfg, cfg) for _ in range(workers)]
    if cg is not None:
        cg.start(ports)
    before = _counters(ports)
    start, own0 = time.perf_counter(), time.process_time()
    for w in ws:
        await w.start()
    await finished.wait()
    elapsed = time.perf_counter() - start
    for w in ws:
        await w.stop()
    own = time.process_time() - own0
    after = _counters(ports)
    cpu = {p: (after[p][0] - before[p][0]) * 1e6 / n for p in ports}
    calls = sum(after[p][1] - before[p][1] for p in ports)
    cmds = sum(after[p][2] - before[p][2] for p in ports) - 2 * len(ports)  # (the INFOs)
    out = {"drain_jobs_s": n / elapsed, "worker_cpu_us_per_job": own * 1e6 / n,
           "redis_cpu_us_per_job": sum(cpu.values()),
           "redis_cpu_us_per_job_per_node": sorted(cpu.values(), reverse=True),
           "script_calls_per_job": calls / n, "commands_per_job": cmds / n}
    if cg is not None:
        ins = cg.stop(ports)
        out["instructions_per_job"] = sum(ins.values()) / n
        out["instructions_per_job_per_node"] = sorted((v / n for v in ins.values()),
                                                      reverse=True)
    return out


def run_one(url: str, cl: ClusterServer | None, ports: list[int], shards: int, a: Any,
            cg: _Callgrind | None = None) -> dict[str, Any]:
    cfg = QueueConfig(shards=shards)
    name = _queue(cl, shards)
    with Queue.from_url(url, name, cfg) as q:
        for i in range(0, a.jobs, 5000):
            q.enqueue_many([{"type": "noop"} for _ in range(min(5000, a.jobs - i))])
    return asyncio.run(_drain(url, name, cfg, a.jobs, ports, a.workers, a.concurrency, cg))


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, list):  # per node, busiest first
            out[key] = [statistics.median(col) for col in zip(*(r[key] for r in runs),
                                                                strict=True)]
        else:
            out[key] = statistics.median(r[key] for r in runs)
    return out


def _setup(kind: str, shard_counts: list[int], a: Any) -> dict[str, Any]:
    runs: dict[int, list[dict[str, Any]]] = {n: [] for n in shard_counts}
    cg = _Callgrind() if a.callgrind else None
    binary = str(cg.binary) if cg is not None else None
    server: Any = (RedisServer(binary=binary) if kind == "one" else ClusterServer(
        primaries=3, replicas=0, binary=binary, node_timeout_ms=60000 if cg else 2000))
    with server:
        cl = server if kind == "cluster" else None
        ports = cl.primary_ports() if cl is not None else [server.port]
        for r in range(a.repeat):
            order = shard_counts[r % len(shard_counts):] + shard_counts[:r % len(shard_counts)]
            for n in order:
                runs[n].append(run_one(server.url, cl, ports, n, a, cg))
    by = {str(n): _median(runs[n]) for n in shard_counts}
    base = by[str(shard_counts[0])]
    keys = _KEYS + (("instructions_per_job",) if cg is not None else ())
    return {"by_shards": by, "ratio_to_unsharded": {
        str(n): {k: by[str(n)][k] / base[k] for k in keys} for n in shard_counts}}


def _commit() -> str:
    """The commit of the streamq package measured (PYTHONPATH may point at another tree)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True, cwd=Path(streamq.__file__).parent
                              ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=100, help="each worker's")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--shards", default="1,3,6,12", help="shard counts, the first the base")
    ap.add_argument("--setups", default="one,cluster")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the JSON figures here")
    ap.add_argument("--callgrind", action="store_true",
                    help="count each server's instructions per job (valgrind, ~50x slower)")
    a = ap.parse_args()
    if a.callgrind:  # (time in the servers runs ~50x slower: the held turn's lapse too)
        try:
            from streamq._worker import slots
            slots.HOLD_MAX_S *= 50
        except ImportError:  # (a streamq from before the turns)
            pass
    counts = [int(s) for s in a.shards.split(",")]
    doc: dict[str, Any] = {"settings": {
        "harness": "benchmarks/shard_bench.py", "jobs": a.jobs, "concurrency": a.concurrency,
        "workers": a.workers, "repeat": a.repeat, "commit": _commit(),
        "callgrind": a.callgrind,
        "loadavg_before": _load(), "servers": "one redis-server; a 3-primary loopback cluster,"
        " no replicas; persistence off; workers in the harness process, no-op handler,"
        " block_ms=200; medians of the runs"}}
    for kind in a.setups.split(","):
        doc[kind] = _setup(kind, counts, a)
    doc["settings"]["loadavg_after"] = _load()
    if a.out is not None:
        a.out.write_text(json.dumps(doc, indent=2) + "\n")
    if a.json:
        print(json.dumps(doc, indent=2))
        return
    print(f"commit {doc['settings']['commit']}, load {doc['settings']['loadavg_before']} ->"
          f" {doc['settings']['loadavg_after']}; {a.workers} worker(s) x {a.concurrency}")
    print("| setup | shards | drain jobs/s | worker CPU µs/job | Redis CPU µs/job (per node) |"
          " script calls/job | commands/job | Redis CPU / unsharded |")
    print("|---|--:|--:|--:|--:|--:|--:|--:|")
    for kind in a.setups.split(","):
        for n, r in doc[kind]["by_shards"].items():
            per = ", ".join(f"{v:.1f}" for v in r["redis_cpu_us_per_job_per_node"])
            ratio = doc[kind]["ratio_to_unsharded"][n]["redis_cpu_us_per_job"]
            print(f"| {kind} | {n} | {r['drain_jobs_s']:,.0f} |"
                  f" {r['worker_cpu_us_per_job']:.1f} | {r['redis_cpu_us_per_job']:.1f}"
                  f" ({per}) | {r['script_calls_per_job']:.3f} |"
                  f" {r['commands_per_job']:.2f} | {ratio:.2f} |")
    for kind in a.setups.split(",") if a.callgrind else ():
        for n, r in doc[kind]["by_shards"].items():
            per = ", ".join(f"{v:,.0f}" for v in r["instructions_per_job_per_node"])
            ratio = doc[kind]["ratio_to_unsharded"][n]["instructions_per_job"]
            print(f"{kind} shards={n}: {r['instructions_per_job']:,.0f} instructions per job"
                  f" ({per}), {ratio:.3f} of unsharded")


if __name__ == "__main__":
    main()
