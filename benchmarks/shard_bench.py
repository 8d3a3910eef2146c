"""What sharding a queue costs, and what a cluster costs against one server: one queue with N
shards drained by one worker (or several), on one redis-server and on a 3-primary loopback
cluster with and without replicas, as ratios to the same queue unsharded and to one server.

``python -m benchmarks.shard_bench [--jobs 20000] [--concurrency 100] [--workers 1]
[--shards 1,3,6,12] [--one-shards 1] [--setups one,cluster,replicas] [--repeat 3]
[--callgrind [--cache-sim]] [--dilate 50] [--json] [--out FILE] [--md FILE]``.

Setups, all started at once (persistence off): ``one`` a private redis-server; ``cluster`` a
private 3-primary loopback cluster without replicas; ``replicas`` the same with one replica
per primary. Each (setup, shard count) pair of a run gets a fresh queue (on a cluster its
shards spread as evenly as can be over the primaries: 12 shards = 4 per primary), filled
with ``--jobs`` no-op jobs by ``enqueue_many`` (not measured), then drained by ``--workers``
workers in this process, each of ``--concurrency``, no-op handler, ``block_ms`` 200
(``--block-ms``). The pairs of one run go one after the other in an order rotated per run
(repetitions interleaved: a drift in the machine's load touches every pair alike), after one
warm-up drain per setup, not counted. One server runs the
``--one-shards`` counts (the unsharded queue alone by default), the clusters ``--shards``.

Measured over the drain (from the workers' start to their stop, so the last settles count):
Redis CPU (``INFO cpu`` user + sys, µs per job, of the primaries in all and per node, busiest
first; the kernel's part apart; the replicas' apart; the primaries' context switches per
job, voluntary (wake-ups from epoll) and not), script calls (``INFO commandstats``:
EVALSHA + EVAL) and all commands per job (and per command name), the worker process's CPU per job
(``time.process_time``: the workers run in this process, and only they run during the
drain) and jobs/s. Every figure is the median of ``--repeat`` runs; ``ratio_to_unsharded``
divides a pair's medians by those of shards=1 of the same setup, ``ratio_to_one_server`` by
those of the unsharded queue on one server. The load average is recorded before and after.

``--callgrind``: every redis-server (replicas too) runs under ``valgrind --tool=callgrind``
(instrumentation off until the drain: ``callgrind_control -i on -z`` before it, ``-i off -d``
after), and the figures gain the instructions each server ran per drained job, a count that
does not move with the machine's load, and where they went (inclusive instructions of a
few server functions: the script calls, XREADGROUP, XAUTOCLAIM, cron, the cluster bus, ...).
Time inside the servers is dilated (about 50x), so ``--dilate`` (default 50 with
``--callgrind``) stretches what the workers do per second by as much: ``block_ms``, the
promotion and heartbeat intervals, the visibility timeout (the reclaim and renewal periods),
the prune and group-reconcile intervals, and the worker's module periods in ``_PERIODS``
(the held turn's lapse, each fetch loop's levels read, ...). A server's own periodic
work (cron, the cluster bus) is not stretched: it is counted apart as each node's idle
instructions per second over two quiet seconds before the drain times the drain's length;
so is what the workers' start and stop cost (scripts loaded, groups made, the command table
read: per worker, not per job), counted over a start and stop of as many workers on the
still empty queue. ``instructions_per_job_net`` leaves both out.
``--cache-sim`` (with ``--callgrind``, about twice as slow again) has valgrind simulate the
caches too: ``cache_misses_per_job`` gives the primaries' simulated misses per job (``D1mr``,
``DLmr``, ...: first-level and last-level data reads, ...), what a run's instructions cost
beyond their count when they touch memory further apart (a simulation of one process alone:
not what other processes on the same cores evict).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import shutil
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
from streamq._core.cluster_server import ClusterServer, wait_for
from streamq._core.keys import shard_keys
from streamq._core.server import RedisServer

_KEYS = ("drain_jobs_s", "worker_cpu_us_per_job", "redis_cpu_us_per_job",
         "script_calls_per_job", "commands_per_job")
_CG_KEYS = ("instructions_per_job", "instructions_per_job_net")
_FUNCS = ("call", "evalShaCommand", "xreadCommand", "xautoclaimCommand", "serverCron",
          "clusterCron", "clusterProcessPacket", "beforeSleep", "readQueryFromClient",
          "writeToClient", "handleClientsBlockedOnKeys", "replicationFeedSlaves",
          "readSyncBulkPayload", "processInputBuffer")
"""Server functions whose inclusive instructions per job a callgrind run reports."""


def _counters(ports: list[int]) -> dict[int, tuple[float, float, dict[str, int]]]:
    """Per server: (CPU s, of it in the kernel, calls per command name and the process's
    context switches: ``~wakeups`` voluntary, ``~preempted`` not)."""
    out = {}
    for port in ports:
        with redis.Redis(port=port, protocol=2) as c:
            cpu: Any = c.info("cpu")
            stats: Any = c.info("commandstats")
            server: Any = c.info("server")
            calls = {k.removeprefix("cmdstat_"): int(v.get("calls", 0))
                     for k, v in stats.items()}
            calls.update(_switches(int(server["process_id"])))
            out[port] = (float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"]),
                         float(cpu["used_cpu_sys"]), calls)
    return out


def _switches(pid: int) -> dict[str, int]:
    """A local server's context switches so far (none when /proc does not show it)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    found = dict(line.split(":", 1) for line in status.splitlines() if "ctxt_switches" in line)
    return {"~wakeups": int(found.get("voluntary_ctxt_switches", "0")),
            "~preempted": int(found.get("nonvoluntary_ctxt_switches", "0"))}


class _Callgrind:
    """Each server's instructions over a drain (``--callgrind``)."""

    def __init__(self, cache_sim: bool = False) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="shard-bench-cg-"))
        self.binary = self.dir / "redis-server"
        self.binary.write_text(
            "#!/bin/sh\nexec valgrind --tool=callgrind --instr-atstart=no --dump-instr=no"
            + (" --cache-sim=yes" if cache_sim else "")
            + f" --callgrind-out-file={self.dir}/out.%p redis-server \"$@\"\n")
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

    def stop(self, ports: list[int], funcs: bool = True
             ) -> dict[int, tuple[int, dict[str, int]]]:
        """Per server: (instructions, inclusive instructions of ``_FUNCS``; with
        ``--cache-sim`` also the simulated cache misses, as ``~D1mr`` ... ``~DLmw``)."""
        out = {}
        for port in ports:
            pid = self._pid(port)
            self._ctl(pid, "-i", "off")
            self._ctl(pid, "-d")
            dumps = sorted(self.dir.glob(f"out.{pid}.*"), key=lambda f: f.stat().st_mtime)
            lines = dumps[-1].read_text().splitlines()
            events = next((ln.split()[1:] for ln in lines if ln.startswith("events:")), ["Ir"])
            totals = [line for line in lines if line.startswith(("summary:", "totals:"))]
            values = [int(v) for v in totals[-1].split()[1:]]
            found = self._funcs(dumps[-1]) if funcs else {}
            found.update({f"~{e}": v for e, v in zip(events[1:], values[1:], strict=False)})
            out[port] = (values[0], found)
        return out

    @staticmethod
    def _funcs(dump: Path) -> dict[str, int]:
        text = subprocess.run(["callgrind_annotate", "--inclusive=yes", "--threshold=100",
                               str(dump)], capture_output=True, text=True, timeout=300).stdout
        found: dict[str, int] = {}
        for line in text.splitlines():
            m = re.match(r"\s*([\d,]+)\s+(?:\([^)]*\)\s+)?(?:\S*:)?(\w+)\s", line)
            if m and m.group(2) in _FUNCS and m.group(2) not in found:
                found[m.group(2)] = int(m.group(1).replace(",", ""))
        return found


class _Setup:
    """One server or one cluster, its primaries and its replicas."""

    def __init__(self, kind: str, binary: str | None, cg: bool) -> None:
        self.kind = kind
        self.server: Any = (RedisServer(binary=binary) if kind == "one" else ClusterServer(
            primaries=3, replicas=1 if kind == "replicas" else 0, binary=binary,
            node_timeout_ms=60000 if cg else 2000))

    def __enter__(self) -> _Setup:
        self.server.__enter__()
        self.cl: ClusterServer | None = self.server if self.kind != "one" else None
        self.url: str = self.server.url
        if self.cl is None:
            self.ports, self.replicas = [self.server.port], []
        else:
            self.cl.wait_healthy(120)
            self.ports = self.cl.primary_ports()
            self.replicas = [r for p in self.ports for r in self.cl.replicas_of(p)]
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.__exit__(*exc)

    def caught_up(self) -> None:
        """Until every replica has what its primary wrote (replication is asynchronous)."""
        if self.cl is None or not self.replicas:
            return
        cl = self.cl

        def done() -> bool:
            for p in self.ports:
                offset = int(cl.info(p, "replication")["master_repl_offset"])
                for r in cl.replicas_of(p):
                    if int(cl.info(r, "replication")["slave_repl_offset"]) < offset:
                        return False
            return True
        wait_for(done, 300, "the replicas to catch up")


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


def _wcfg(a: Any) -> WorkerConfig:
    d = a.dilate
    return WorkerConfig(concurrency=a.concurrency, block_ms=int(a.block_ms * d),
                        promote_interval_s=1.0 * d, heartbeat_interval_s=5.0 * d,
                        visibility_timeout_s=30.0 * d, prune_interval_s=60.0 * d,
                        group_reconcile_interval_s=30.0 * d, promote=not a.no_promote)


_PERIODS = (("streamq._worker.slots", "HOLD_MAX_S"), ("streamq._worker.fetch", "_LEVELS_EVERY_S"),
            ("streamq._worker.housekeeping", "SERIES_EVERY_S"),
            ("streamq._worker.promote", "RESYNC_S"), ("streamq._worker.relay", "REPAIR_EVERY_S"),
            ("streamq._worker.owners", "OWNERS_EVERY_S"),
            ("streamq._worker.owners", "OWNERS_SOON_S"))
"""The worker's own periods (module constants) that ``--dilate`` stretches besides its
config: the held turn's lapse, each fetch loop's levels read, the time series, the
promotion resync, the relay's repair, the shard owners' reads."""


def _dilate(d: float) -> None:
    import importlib
    for module, name in _PERIODS:
        try:
            mod = importlib.import_module(module)
        except ImportError:  # (an older streamq)
            continue
        if hasattr(mod, name):
            setattr(mod, name, getattr(mod, name) * d)


async def _drain(s: _Setup, name: str, cfg: QueueConfig, n: int, a: Any,
                 cg: _Callgrind | None = None) -> dict[str, Any]:
    reg = Registry()
    done = [0]
    finished = asyncio.Event()

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        done[0] += 1
        if done[0] == n:
            finished.set()

    nodes = s.ports + s.replicas
    idle: dict[int, float] = {}
    startup = 0.0
    if cg is not None:
        # each node's own periodic work per second (no client), and what the workers' start
        # and stop cost on the still empty queue (scripts loaded, groups made, the command
        # table read, ...): per worker, not per job
        cg.start(nodes)
        t0 = time.perf_counter()
        await asyncio.sleep(2.0)
        quiet = cg.stop(nodes, funcs=False)
        idle = {p: quiet[p][0] / (time.perf_counter() - t0) for p in nodes}
        cg.start(s.ports)
        t0 = time.perf_counter()
        empty = [Worker(s.url, [name], reg, _wcfg(a), cfg) for _ in range(a.workers)]
        for w in empty:
            await w.start()
        for w in empty:
            await w.stop()
        up = cg.stop(s.ports, funcs=False)
        startup = sum(up[p][0] - idle[p] * (time.perf_counter() - t0) for p in s.ports)
    await asyncio.to_thread(_fill, s.url, name, cfg, n)
    await asyncio.to_thread(s.caught_up)  # (the replicas are done with the enqueue)
    ws = [Worker(s.url, [name], reg, _wcfg(a), cfg) for _ in range(a.workers)]
    if cg is not None:
        cg.start(nodes)
    before = _counters(nodes)
    start, own0 = time.perf_counter(), time.process_time()
    for w in ws:
        await w.start()
    await finished.wait()
    drained = time.perf_counter() - start
    for w in ws:
        await w.stop()
    own = time.process_time() - own0
    await asyncio.to_thread(s.caught_up)
    elapsed = time.perf_counter() - start
    after = _counters(nodes)
    cpu = {p: (after[p][0] - before[p][0]) * 1e6 / n for p in nodes}
    cmds: dict[str, float] = {}
    for p in s.ports:
        for k, v in after[p][2].items():
            cmds[k] = cmds.get(k, 0) + v - before[p][2].get(k, 0)
    cmds["info"] = cmds.get("info", 0) - 3 * len(s.ports)  # (the counters' own INFOs)
    switches = {k: cmds.pop(k) for k in ("~wakeups", "~preempted") if k in cmds}
    scripts = cmds.get("evalsha", 0) + cmds.get("eval", 0)
    out: dict[str, Any] = {
        "drain_jobs_s": n / drained, "worker_cpu_us_per_job": own * 1e6 / n,
        "redis_cpu_us_per_job": sum(cpu[p] for p in s.ports),
        "redis_cpu_us_per_job_per_node": sorted((cpu[p] for p in s.ports), reverse=True),
        "redis_sys_cpu_us_per_job": sum(after[p][1] - before[p][1] for p in s.ports) * 1e6 / n,
        "script_calls_per_job": scripts / n, "commands_per_job": sum(cmds.values()) / n,
        "redis_context_switches_per_job": {k: v / n for k, v in switches.items()},
        "calls_per_job_by_command": {k: v / n for k, v in sorted(cmds.items()) if v}}
    if s.replicas:
        out["replica_cpu_us_per_job"] = sum(cpu[p] for p in s.replicas)
    if cg is not None:
        ins = cg.stop(nodes)
        prim = {p: ins[p][0] / n for p in s.ports}
        out["instructions_per_job"] = sum(prim.values())
        out["instructions_per_job_per_node"] = sorted(prim.values(), reverse=True)
        out["idle_instructions_per_job"] = sum(idle[p] for p in s.ports) * elapsed / n
        out["startup_instructions_per_job"] = startup / n
        out["instructions_per_job_net"] = (out["instructions_per_job"]
                                           - out["idle_instructions_per_job"] - startup / n)
        out["drain_s"] = elapsed
        funcs: dict[str, float] = {}
        for p in s.ports:
            for f, v in ins[p][1].items():
                funcs[f] = funcs.get(f, 0) + v / n
        out["inclusive_instructions_per_job"] = {f: v for f, v in funcs.items()
                                                 if not f.startswith("~")}
        if a.cache_sim:  # the primaries' simulated misses (D1: first level, LL: last)
            out["cache_misses_per_job"] = {f[1:]: v for f, v in funcs.items()
                                           if f.startswith("~")}
        if s.replicas:
            out["replica_instructions_per_job"] = sum(ins[p][0] for p in s.replicas) / n
    return out


def _fill(url: str, name: str, cfg: QueueConfig, n: int) -> None:
    with Queue.from_url(url, name, cfg) as q:
        for i in range(0, n, 5000):
            q.enqueue_many([{"type": "noop"} for _ in range(min(5000, n - i))])


def run_one(s: _Setup, shards: int, a: Any, cg: _Callgrind | None = None) -> dict[str, Any]:
    cfg = QueueConfig(shards=shards)
    return asyncio.run(_drain(s, _queue(s.cl, shards), cfg, a.jobs, a, cg))


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, first in runs[0].items():
        if isinstance(first, list):  # per node, busiest first
            out[key] = [statistics.median(col) for col in zip(*(r[key] for r in runs),
                                                                strict=True)]
        elif isinstance(first, dict):  # by command or function: a name may be missing
            names = sorted({k for r in runs for k in r[key]})
            out[key] = {k: statistics.median(r[key].get(k, 0) for r in runs) for k in names}
        else:
            out[key] = statistics.median(r[key] for r in runs)
    return out


def _ratios(row: dict[str, Any], base: dict[str, Any], keys: tuple[str, ...]
            ) -> dict[str, float]:
    return {k: row[k] / base[k] for k in keys if k in row and base.get(k)}


def _commit(*path: str) -> str:
    """The checkout's commit, or with ``"."`` the last one that changed the streamq package
    measured (PYTHONPATH may point at another tree)."""
    try:
        return subprocess.run(["git", "log", "-1", "--format=%h", "HEAD", "--", *path],
                              capture_output=True, text=True, check=True,
                              cwd=Path(streamq.__file__).parent).stdout.strip() or "unknown"
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(a: Any) -> dict[str, Any]:
    cg = _Callgrind(a.cache_sim) if a.callgrind else None
    if a.dilate != 1:
        _dilate(a.dilate)
    kinds = a.setups.split(",")
    counts = {k: [int(x) for x in (a.one_shards if k == "one" else a.shards).split(",")]
              for k in kinds}
    pairs = [(k, n) for k in kinds for n in counts[k]]
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {p: [] for p in pairs}
    doc: dict[str, Any] = {"settings": {
        "harness": "benchmarks/shard_bench.py", "argv": _argv(a), "jobs": a.jobs,
        "concurrency": a.concurrency, "workers": a.workers, "repeat": a.repeat,
        "commit": _commit(), "streamq_commit": _commit("."),
        "callgrind": a.callgrind, "dilate": a.dilate,
        "promote": not a.no_promote, "redis": _version(),
        "loadavg_before": _load(), "servers": "one redis-server; a 3-primary loopback cluster,"
        " no replicas; the same with one replica per primary; persistence off; workers in the"
        " harness process, no-op handler; medians of the runs, repetitions interleaved"}}
    binary = str(cg.binary) if cg is not None else None
    with contextlib.ExitStack() as stack:
        if cg is not None:  # (the servers stop first: the dumps' directory goes last)
            stack.callback(shutil.rmtree, cg.dir, True)
        setups = {k: stack.enter_context(_Setup(k, binary, cg is not None)) for k in kinds}
        for setup in setups.values():  # a warm-up drain, not counted: a server's and this
            # process's first use (lazy allocations, the client's first command table, ...)
            run_one(setup, 1, argparse.Namespace(**{**vars(a), "jobs": 1000}))
        for r in range(a.repeat):
            for kind, n in pairs[r % len(pairs):] + pairs[:r % len(pairs)]:
                runs[kind, n].append(run_one(setups[kind], n, a, cg))
                print(f"run {r} {kind} shards={n} done, load {_load()}", flush=True)
    keys = _KEYS + (_CG_KEYS if cg is not None else ())
    one = _median(runs["one", 1]) if ("one", 1) in runs else None
    for kind in kinds:
        by = {str(n): _median(runs[kind, n]) for n in counts[kind]}
        base = by[str(counts[kind][0])]
        doc[kind] = {"by_shards": by,
                     "ratio_to_unsharded": {n: _ratios(r, base, keys) for n, r in by.items()}}
        if one is not None:
            doc[kind]["ratio_to_one_server"] = {n: _ratios(r, one, keys)
                                                for n, r in by.items()}
    doc["settings"]["loadavg_after"] = _load()
    return doc


def _argv(a: Any) -> str:
    return (f"--jobs {a.jobs} --concurrency {a.concurrency} --workers {a.workers}"
            f" --shards {a.shards} --one-shards {a.one_shards} --setups {a.setups}"
            f" --repeat {a.repeat} --block-ms {a.block_ms}"
            + (" --callgrind" if a.callgrind else "")
            + (" --cache-sim" if getattr(a, "cache_sim", False) else "")
            + f" --dilate {a.dilate:g}" + (" --no-promote" if a.no_promote else ""))


def _version() -> str:
    out = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
    return out.stdout.split()[2].removeprefix("v=") if out.returncode == 0 else "unknown"


_LABEL = {"one": "one server", "cluster": "cluster", "replicas": "cluster + replicas"}


def markdown(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [f"`python -m benchmarks.shard_bench {s['argv']}` at commit `{s['commit']}`"
             f" (the streamq package as of `{s.get('streamq_commit', s['commit'])}`)"
             f" (Redis {s.get('redis', '?')}; load average {s['loadavg_before']} before,"
             f" {s['loadavg_after']} after; {s['workers']} worker(s) x {s['concurrency']},"
             f" {s['jobs']:,} no-op jobs, medians of {s['repeat']}).", "",
             "| setup | shards | drain jobs/s | worker CPU µs/job | Redis CPU µs/job (per"
             " primary; kernel) | replicas' CPU µs/job | jobs per script call | Redis CPU ÷ one"
             " server | Redis CPU ÷ unsharded | worker CPU ÷ one server |",
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|"]
    kinds = [k for k in ("one", "cluster", "replicas") if k in doc]
    for kind in kinds:
        for n, r in doc[kind]["by_shards"].items():
            per = ", ".join(f"{v:.1f}" for v in r["redis_cpu_us_per_job_per_node"])
            if "redis_sys_cpu_us_per_job" in r:
                per += f"; kernel {r['redis_sys_cpu_us_per_job']:.1f}"
            wakeups = r.get("redis_context_switches_per_job", {}).get("~wakeups")
            if wakeups is not None:
                per += f"; {wakeups:.2f} wake-ups/job"
            one = doc[kind].get("ratio_to_one_server", {}).get(n, {})
            uns = doc[kind]["ratio_to_unsharded"][n]
            rep = r.get("replica_cpu_us_per_job")
            lines.append(
                f"| {_LABEL[kind]} | {n} | {r['drain_jobs_s']:,.0f} |"
                f" {r['worker_cpu_us_per_job']:.1f} | {r['redis_cpu_us_per_job']:.1f} ({per})"
                f" | {'' if rep is None else f'{rep:.1f}'} |"
                f" {1 / r['script_calls_per_job']:.1f} |"
                f" {one.get('redis_cpu_us_per_job', float('nan')):.2f} |"
                f" {uns['redis_cpu_us_per_job']:.2f} |"
                f" {one.get('worker_cpu_us_per_job', float('nan')):.2f} |")
    if s["callgrind"]:
        lines += ["", "| setup | shards | instructions per job (per primary) | net of idle"
                  " | ÷ one server | ÷ unsharded | net ÷ unsharded | replicas' |",
                  "|---|--:|--:|--:|--:|--:|--:|--:|"]
        for kind in kinds:
            for n, r in doc[kind]["by_shards"].items():
                per = "; ".join(f"{v:,.0f}" for v in r["instructions_per_job_per_node"])
                one = doc[kind].get("ratio_to_one_server", {}).get(n, {})
                uns = doc[kind]["ratio_to_unsharded"][n]
                rep = r.get("replica_instructions_per_job")
                lines.append(
                    f"| {_LABEL[kind]} | {n} | {r['instructions_per_job']:,.0f} ({per}) |"
                    f" {r['instructions_per_job_net']:,.0f} |"
                    f" {one.get('instructions_per_job', float('nan')):.3f} |"
                    f" {uns['instructions_per_job']:.3f} |"
                    f" {uns.get('instructions_per_job_net', float('nan')):.3f} |"
                    f" {'' if rep is None else f'{rep:,.0f}'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--jobs", type=int, default=20000)
    ap.add_argument("--concurrency", type=int, default=100, help="each worker's")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--shards", default="1,3,6,12",
                    help="the clusters' shard counts, the first the base")
    ap.add_argument("--one-shards", default="1", help="one server's shard counts")
    ap.add_argument("--setups", default="one,cluster,replicas")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-promote", action="store_true", help="WorkerConfig(promote=False)")
    ap.add_argument("--block-ms", type=int, default=200, help="WorkerConfig.block_ms")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", type=Path, help="also write the JSON figures here")
    ap.add_argument("--md", type=Path, help="also write the markdown tables here")
    ap.add_argument("--callgrind", action="store_true",
                    help="count each server's instructions per job (valgrind, ~50x slower)")
    ap.add_argument("--cache-sim", action="store_true",
                    help="with --callgrind: simulated cache misses per job too (~2x slower)")
    ap.add_argument("--dilate", type=float, default=None,
                    help="stretch the workers' periods by this (default 50 with --callgrind)")
    a = ap.parse_args()
    if a.dilate is None:
        a.dilate = 50.0 if a.callgrind else 1.0
    doc = measure(a)
    if a.out is not None:
        a.out.write_text(json.dumps(doc, indent=2) + "\n")
    md = markdown(doc)
    if a.md is not None:
        a.md.write_text(md)
    print(json.dumps(doc, indent=2) if a.json else md)


if __name__ == "__main__":
    main()
