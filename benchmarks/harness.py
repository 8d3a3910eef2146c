"""``python -m benchmarks``: run every workload against one private redis-server, report.

Each figure is measured ``--reps`` times (workloads interleaved within a repetition) and
reported as median and min-max. Results go to ``benchmarks/results/latest.{json,md}`` unless
``--out`` says otherwise; ``--smoke`` runs the same code paths with tiny sizes, once, into a
temporary directory, and exits non-zero when a workload fails (CI keeps the harness alive).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import redis

import streamq
from streamq._core.server import RedisServer

from .workloads import (
    REPO,
    WORKLOADS,
    BenchError,
    Ctx,
    Result,
    Sizes,
    drain_key,
    parse_sweep,
    redis_cpu_s,
)

EN = "\N{EN DASH}"
NOISY = 0.25
"""Cores used by other processes above which a workload run is flagged in the report."""
RESULTS = Path(__file__).resolve().parent / "results"
SMOKE = Sizes(jobs=300, single=50, latency_jobs=30, latency_warmup=5, sweep=("10", "100/50"),
              worker_timeout_s=30.0, memory_jobs=300, memory_big_jobs=100, round_trips=30,
              producers=10)


@dataclass(frozen=True)
class Figure:
    workload: str
    key: str
    label: str
    unit: str
    target: float | None = None
    higher_is_better: bool = True
    decimals: int = 0

    def fmt(self, v: float) -> str:
        return f"{v:,.{self.decimals}f}"

    def target_text(self) -> str:
        if self.target is None:
            return ""
        return f"{'≥' if self.higher_is_better else '≤'} {self.fmt(self.target)}"

    def met(self, v: float) -> bool | None:
        if self.target is None:
            return None
        return v >= self.target if self.higher_is_better else v <= self.target


def _drain_figures(workload: str, concurrency: int, fetch_batch: int | None,
                   label: str, headline: bool) -> list[Figure]:
    k = drain_key(concurrency, fetch_batch)
    return [
        Figure(workload, f"{k}_per_s", label, "jobs/s", 15_000 if headline else None),
        Figure(workload, f"{k}_cpu_us", "  worker CPU per job", "µs",
               22 if headline else None, False, 1),
        Figure(workload, f"{k}_redis_cpu_us", "  redis-server CPU per job", "µs",
               18 if headline else None, False, 1),
    ]


def figures(sizes: Sizes) -> list[Figure]:
    """Every figure, in table order (the sizes go into the labels)."""
    n, c = f"{sizes.jobs:,}", sizes.concurrency
    out = _drain_figures("drain", c, None, f"streamq drain, 1 worker process, concurrency {c},"
                         f" {n} no-op jobs", True)
    out += [
        Figure("ceiling", "raw_drain_per_s", "ceiling: raw redis-py XREADGROUP COUNT"
               f" {sizes.raw_count} + XACK + XDEL loop, {n} entries", "entries/s"),
        Figure("ceiling", "raw_drain_cpu_us", "  client CPU per entry", "µs", decimals=1),
        Figure("ceiling", "raw_drain_redis_cpu_us", "  redis-server CPU per entry", "µs",
               decimals=1),
        Figure("enqueue_many", "enqueue_many_per_s", f"streamq enqueue_many, {n} jobs", "jobs/s",
               50_000),
        Figure("enqueue_many", "enqueue_many_cpu_us", "  producer CPU per job", "µs",
               decimals=1),
        Figure("enqueue_many", "enqueue_many_redis_cpu_us", "  redis-server CPU per job", "µs",
               decimals=1),
        Figure("ceiling", "raw_xadd_per_s", "ceiling: raw redis-py pipelined XADD (1,000 per"
               " pipeline)", "entries/s"),
        Figure("enqueue", "enqueue_per_s", f"streamq enqueue, one at a time, {sizes.single:,}"
               " jobs", "jobs/s"),
        Figure("enqueue", "enqueue_us", "  per call", "µs", decimals=1),
        Figure("enqueue_concurrent", "enqueue_conc_per_s", f"streamq enqueue, {sizes.producers}"
               f" coroutines one job at a time each, {n} jobs", "jobs/s", 40_000),
        Figure("enqueue_concurrent", "enqueue_conc_cpu_us", "  producer CPU per job", "µs",
               decimals=1),
        Figure("enqueue_concurrent", "enqueue_conc_redis_cpu_us", "  redis-server CPU per job",
               "µs", decimals=1),
        Figure("latency", "latency_p50_ms", "idle enqueue→start latency p50"
               f" ({sizes.latency_jobs} jobs, {sizes.latency_pause_s * 1000:g} ms apart)", "ms",
               0.8, False, 3),
        Figure("latency", "latency_p99_ms", "  p99", "ms", decimals=3),
        Figure("latency", "latency_max_ms", "  max", "ms", decimals=3),
        Figure("round_trip", "rtt_p50_ms", "idle enqueue→result round trip p50, enqueue_and_wait"
               f" ({sizes.round_trips} calls, {sizes.latency_pause_s * 1000:g} ms apart)", "ms",
               1.0, False, 3),
        Figure("round_trip", "rtt_p99_ms", "  p99", "ms", decimals=3),
        Figure("raw_latency", "raw_latency_p50_ms", "ceiling: raw XADD → consumer blocked in"
               " XREADGROUP, p50", "ms", decimals=3),
        Figure("raw_latency", "raw_latency_p99_ms", "  p99", "ms", decimals=3),
        Figure("raw_latency", "ping_us", "  PING round trip (median)", "µs", decimals=0),
        Figure("raw_latency", "raw_rtt_p50_ms", "ceiling: raw round trip, script XADD → blocked"
               " consumer → script PUBLISH → subscriber thread → caller, p50", "ms", decimals=3),
        Figure("raw_latency", "raw_rtt_p99_ms", "  p99", "ms", decimals=3),
    ]
    m, mb = f"{sizes.memory_jobs:,}", f"{sizes.memory_big_jobs:,}"
    out += [
        Figure("memory", "mem_small_queued_b", f"Redis memory per queued job ({m} jobs,"
               " payload {\"n\": i})", "B", 200, False),
        Figure("memory", "mem_small_finished_b", "  per finished job kept for its result TTL",
               "B", 300, False),
        Figure("memory", "mem_small_record_b", "  record (MEMORY USAGE: key, object, hash)",
               "B", higher_is_better=False),
        Figure("memory", "mem_small_stream_b", "  ready stream entry", "B",
               higher_is_better=False, decimals=1),
        Figure("memory", "mem_small_events_b", "  events stream", "B",
               higher_is_better=False, decimals=1),
        Figure("memory", "mem_small_finished_record_b", "  finished record (MEMORY USAGE)",
               "B", higher_is_better=False),
        Figure("memory", "mem_200b_queued_b", f"Redis memory per queued job, 200-byte payload"
               f" ({mb} jobs)", "B", higher_is_better=False),
        Figure("memory", "mem_200b_finished_b", "  per finished job", "B",
               higher_is_better=False),
        Figure("memory", "mem_2kb_queued_b", f"Redis memory per queued job, 2-KB payload"
               f" ({mb} jobs)", "B", higher_is_better=False),
        Figure("memory", "mem_2kb_finished_b", "  per finished job", "B",
               higher_is_better=False),
    ]
    for item in sizes.sweep:
        sc, sf = parse_sweep(item)
        if (sc, sf) == (c, None):
            continue
        what = f"concurrency {sc}" + (f", fetch_batch {sf}" if sf else "")
        out += _drain_figures("sweep", sc, sf, f"streamq drain, {what}", False)
    return out


# ------------------------------------------------------------------------- machine


def machine_facts(client: redis.Redis) -> dict[str, Any]:
    info: Any = client.info("server")
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                capture_output=True, text=True, timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain",
                                     "--untracked-files=no", "streamq"], cwd=REPO,
                                    capture_output=True, text=True, timeout=5).stdout.strip())
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "", False
    try:
        import hiredis  # type: ignore[import-not-found,unused-ignore]

        hiredis_version = str(hiredis.__version__)
    except ImportError:
        hiredis_version = "not installed"
    try:
        load1 = os.getloadavg()[0]
    except OSError:
        load1 = -1.0
    return {
        "timestamp": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "cpu": model or platform.processor(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "redis_server": str(info.get("redis_version", "?")),
        "redis_py": redis.__version__,
        "hiredis": hiredis_version,
        "streamq": streamq.__version__,
        "commit": commit + ("+dirty" if dirty else ""),
        "persistence": "off (save '', appendonly no)",
        "load_1min_at_start": round(load1, 2),
    }


def machine_busy_s() -> float | None:
    """CPU seconds all processes on this machine have used so far (from /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:4]]
    except (OSError, ValueError):
        return None
    # user nice system; irq/softirq time (loopback traffic) is charged to no process
    return sum(fields) / os.sysconf("SC_CLK_TCK")


def own_cpu_s() -> float:
    """CPU seconds of this process and of its waited-for children (the worker processes)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class Background:
    """CPU used by other processes while a workload runs: a shared machine skews results."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.busy0: float | None = None
        self.own0 = self.redis0 = self.t0 = 0.0

    def start(self) -> None:
        self.busy0, self.own0 = machine_busy_s(), own_cpu_s()
        self.redis0, self.t0 = redis_cpu_s(self.client), time.perf_counter()

    def cores(self) -> float | None:
        """Average cores used by processes other than ours since start()."""
        busy = machine_busy_s()
        if busy is None or self.busy0 is None:
            return None
        ours = own_cpu_s() - self.own0 + redis_cpu_s(self.client) - self.redis0
        wall = time.perf_counter() - self.t0
        return max(0.0, (busy - self.busy0 - ours) / wall) if wall > 0 else None


def wait_quiet(client: redis.Redis, log: Callable[[str], None], limit_s: float,
               threshold: float = NOISY) -> None:
    """Wait (at most limit_s) until other processes use under ``threshold`` cores."""
    t0 = time.perf_counter()
    bg = Background(client)
    while time.perf_counter() - t0 < limit_s:
        bg.start()
        time.sleep(0.5)
        cores = bg.cores()
        if cores is None or cores < threshold:
            break
    waited = time.perf_counter() - t0
    if waited > 1:
        log(f"  waited {waited:.0f}s for other processes to quiet down")


# ------------------------------------------------------------------------- report


def summarise(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


Row = tuple[Figure, dict[str, float] | None]


def render_md(facts: dict[str, Any], sizes: Sizes, reps: int, rows: list[Row],
              failures: list[str]) -> str:
    lines = [
        f"Run {facts['timestamp']} on {facts['cores']} cores ({facts['cpu']}), Redis"
        f" {facts['redis_server']} (persistence off), Python {facts['python']}, redis-py"
        f" {facts['redis_py']} (hiredis {facts['hiredis']}), streamq {facts['streamq']}"
        f" at {facts['commit'] or '?'}. Median of {reps} repetition{'s' * (reps != 1)};"
        f" min{EN}max alongside.",
        "",
        f"| Figure | Unit | Median | Min{EN}max | Target | Met |",
        "|---|---|--:|--:|--:|:-:|",
    ]
    for fig, s in rows:
        label = fig.label
        if label.startswith("  "):
            label = "&nbsp;&nbsp;↳ " + label.strip()
        if s is None:
            lines.append(f"| {label} | {fig.unit} | failed | | {fig.target_text()} | |")
            continue
        met = fig.met(s["median"])
        mark = "" if met is None else ("yes" if met else "**no**")
        span = f"{fig.fmt(s['min'])}{EN}{fig.fmt(s['max'])}"
        lines.append(f"| {label} | {fig.unit} | {fig.fmt(s['median'])} | {span} |"
                     f" {fig.target_text()} | {mark} |")
    med = {f.key: s["median"] for f, s in rows if s is not None}
    drain, raw = med.get(f"{drain_key(sizes.concurrency)}_per_s"), med.get("raw_drain_per_s")
    many, xadd = med.get("enqueue_many_per_s"), med.get("raw_xadd_per_s")
    notes = []
    if drain and raw:
        notes.append(f"streamq drain reaches {drain / raw:.0%} of the raw XREADGROUP + XACK +"
                     " XDEL loop on the same server")
    if many and xadd:
        notes.append(f"enqueue_many reaches {many / xadd:.0%} of raw pipelined XADD")
    if notes:
        lines += ["", "; ".join(notes) + "."]
    bg = facts.get("background_cores")
    if bg:
        noisy = [f"{name} ({sum(c > NOISY for c in runs)} of {len(runs)})" for name, runs in
                 facts.get("background_cores_by_workload", {}).items()
                 if any(c > NOISY for c in runs)]
        lines += ["", f"Other processes on the machine used {bg['median']:.2f} cores (median over"
                  f" the workload runs; max {bg['max']:.2f}) while the workloads ran."
                  + (f" Runs with more than {NOISY} cores of such load, to be read with care:"
                     f" {', '.join(noisy)}." if noisy else "")]
    if failures:
        lines += ["", "Failures:", *(f"- {f}" for f in failures)]
    return "\n".join(lines) + "\n"


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


# ------------------------------------------------------------------------- main


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true",
                   help="tiny sizes, one repetition, results to a temp dir; fail on any error")
    p.add_argument("--out", type=Path, default=None,
                   help=f"results directory (default {RESULTS}; a temp dir with --smoke)")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3; smoke 1)")
    p.add_argument("--jobs", type=int, default=None, help="jobs per bulk workload (20,000)")
    p.add_argument("--concurrency", type=int, default=None, help="headline worker concurrency")
    p.add_argument("--sweep", default=None,
                   help="comma-separated extra drain runs, 'C' or 'C/FETCH_BATCH' ('' for none)")
    p.add_argument("--wait-quiet", type=float, default=None, metavar="SECONDS",
                   help="before each workload, wait up to this long for other processes to use"
                        " under a quarter core (default 30; 0 with --smoke)")
    p.add_argument("--only", default=None,
                   help=f"comma-separated workloads out of {','.join(WORKLOADS)}")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = SMOKE if args.smoke else Sizes()
    if args.jobs is not None:
        sizes = replace(sizes, jobs=args.jobs)
    if args.concurrency is not None:
        sizes = replace(sizes, concurrency=args.concurrency)
    if args.sweep is not None:
        sizes = replace(sizes, sweep=tuple(x.strip() for x in args.sweep.split(",") if x.strip()))
    try:
        for item in sizes.sweep:
            parse_sweep(item)
    except ValueError:
        print(f"malformed --sweep {args.sweep!r}: use e.g. 10,250,100/50", file=sys.stderr)
        return 2
    reps = args.reps or (1 if args.smoke else 3)
    names = list(WORKLOADS) if args.only is None else [x.strip() for x in args.only.split(",")]
    unknown = [x for x in names if x not in WORKLOADS]
    if unknown:
        print(f"unknown workloads {unknown}; choose from {list(WORKLOADS)}", file=sys.stderr)
        return 2
    out_dir: Path = args.out or (Path(tempfile.mkdtemp(prefix="streamq-bench-")) if args.smoke
                                 else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)
    quiet_s = args.wait_quiet if args.wait_quiet is not None else (0.0 if args.smoke else 30.0)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    values: dict[str, list[float]] = {}
    background: list[float] = []
    background_by: dict[str, list[float]] = {}
    failures: list[str] = []
    t_start = time.perf_counter()
    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url, protocol=2)
        facts = machine_facts(client)
        log(f"redis-server {facts['redis_server']} at {srv.url}; {reps} repetition(s) of"
            f" {', '.join(names)}")
        ctx = Ctx(srv.url, sizes, client, log)
        for rep in range(1, reps + 1):
            for name in names:
                if quiet_s > 0:
                    wait_quiet(client, log, quiet_s)
                bg = Background(client)
                bg.start()
                t0 = time.perf_counter()
                try:
                    res: Result = WORKLOADS[name](ctx)
                except (BenchError, redis.RedisError, OSError, ValueError, KeyError) as exc:
                    failures.append(f"rep {rep} {name}: {type(exc).__name__}: {exc}")
                    log(f"[{rep}/{reps}] {name} FAILED\n{traceback.format_exc()}")
                    continue
                for k, v in res.items():
                    values.setdefault(k, []).append(v)
                cores = bg.cores()
                if cores is not None:
                    background.append(cores)
                    background_by.setdefault(name, []).append(round(cores, 3))
                shown = ", ".join(f"{k}={v:,.3g}" for k, v in res.items())
                log(f"[{rep}/{reps}] {name} ({time.perf_counter() - t0:.1f}s, background"
                    f" {cores or 0:.2f} cores): {shown}")
        client.close()
    if background:
        facts["background_cores"] = {k: round(v, 3) for k, v in summarise(background).items()}
        facts["background_cores_by_workload"] = background_by

    rows: list[Row] = []
    for fig in figures(sizes):
        if fig.key in values:
            rows.append((fig, summarise(values[fig.key])))
        elif fig.workload in names:
            rows.append((fig, None))
    doc = {
        "machine": facts,
        "sizes": asdict(sizes),
        "repetitions": reps,
        "smoke": args.smoke,
        "duration_s": round(time.perf_counter() - t_start, 1),
        "figures": [
            {"key": f.key, "workload": f.workload, "label": f.label.strip(), "unit": f.unit,
             "target": f.target, "higher_is_better": f.higher_is_better,
             "runs": values.get(f.key, []), **(s or {}),
             "met": f.met(s["median"]) if s else None}
            for f, s in rows
        ],
        "failures": failures,
    }
    md = render_md(facts, sizes, reps, rows, failures)
    _write(out_dir / "latest.json", json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
    _write(out_dir / "latest.md", md)
    print(md)
    log(f"wrote {out_dir / 'latest.json'} and latest.md in {doc['duration_s']}s")
    if failures:
        log(f"{len(failures)} workload run(s) failed")
        return 1
    return 0
