"""``python -m benchmarks.peers.runtime``: the production-runtime figures of issue 30, side by
side in one run, through the peers harness (its adapters, venvs and ``cpu`` workload).

* **CPU-bound jobs** (``--cpu-n`` jobs of about 5 ms of pure-Python work each, the loop count
  calibrated here, best of 5): jobs/s with streamq in one process (the sync handler in
  threads), ``--processes 1`` / ``2`` and ``--pool process`` with 1 / 2 children, against
  celery prefork ``-c 1`` / ``-c 2``, dramatiq ``--processes 1`` / ``2`` (``--threads 1``) and
  rq (one ``rq worker`` process, then two).
* **No-op jobs** (``--noop-n``): the per-job cost of process isolation, as the difference of
  the per-job wall time of a drain with and without it, in one process at the same settings:
  streamq ``--pool process`` (1 child) against the thread runner; celery prefork ``-c 1``
  against ``--pool solo``; rq's fork per job against its ``SimpleWorker``. And the no-op drain
  with ``--processes 2`` against ``--processes 1``.

Every jobs/s figure is the steady rate of a drain: jobs done between the moment 10% were done
and every process of the set had run a job, and the moment 90% were (start-up and a late
second process excluded); CPU µs/job is the CPU time of all the worker's processes over the
same span. Median of ``--reps`` repetitions (min-max); the runs of one repetition are
interleaved so a load spike on a shared machine hits every peer alike. Results:
``benchmarks/results/runtime_peers.{json,md}`` (``--out`` elsewhere). Each run is one
adapter process; no run takes more than a few seconds at the default sizes (the whole run
about 3-5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import redis

from streamq._core.server import RedisServer

from ..harness import machine_facts
from . import common
from . import setup as envs
from .harness import LOGDIR, PEERS, RESULTS, run_adapter

CPU_RUNS: list[tuple[str, str, str, int]] = [
    # (label, peer, mode, processes)
    ("streamq, 1 process (handler in threads)", "streamq", "thread", 1),
    ("streamq `--processes 1`", "streamq", "processes", 1),
    ("streamq `--processes 2`", "streamq", "processes", 2),
    ("streamq `--pool process`, 1 child", "streamq", "pool", 1),
    ("streamq `--pool process`, 2 children", "streamq", "pool", 2),
    ("celery prefork `-c 1`", "celery", "prefork", 1),
    ("celery prefork `-c 2`", "celery", "prefork", 2),
    ("dramatiq `--processes 1`", "dramatiq", "procs", 1),
    ("dramatiq `--processes 2`", "dramatiq", "procs", 2),
    ("rq, 1 worker", "rq", "procs", 1),
    ("rq, 2 workers", "rq", "procs", 2),
]
NOOP_RUNS: list[tuple[str, str, str, int]] = [
    ("streamq, 1 process (handler in threads)", "streamq", "thread", 1),
    ("streamq `--pool process`, 1 child", "streamq", "pool", 1),
    ("streamq `--processes 1`", "streamq", "processes", 1),
    ("streamq `--processes 2`", "streamq", "processes", 2),
    ("celery `--pool solo`", "celery", "solo", 1),
    ("celery prefork `-c 1`", "celery", "prefork", 1),
    ("rq, 1 worker (SimpleWorker)", "rq", "procs", 1),
    ("rq, 1 worker (fork per job)", "rq-fork", "procs", 1),
]
ISOLATION = [  # (what, without isolation, with it): rows of NOOP_RUNS
    ("streamq: process pool vs thread", NOOP_RUNS[0][0], NOOP_RUNS[1][0]),
    ("celery: prefork vs solo", NOOP_RUNS[4][0], NOOP_RUNS[5][0]),
    ("rq: fork per job vs SimpleWorker", NOOP_RUNS[6][0], NOOP_RUNS[7][0]),
]
SLOW_N = {"rq-fork": 0.15}
"""rq forks a work horse per job (tens of ms): fewer jobs keep the run short."""


def calibrate(target_s: float) -> tuple[int, float]:
    """The loop count of :func:`common.burn` that takes about ``target_s`` (best of 5), and
    the measured time of one job at it."""
    n = 50_000
    best = min(_timed(n) for _ in range(5))
    loop = max(1000, int(n * target_s / best))
    return loop, min(_timed(loop) for _ in range(5))


def _timed(n: int) -> float:
    t = time.perf_counter()
    common.burn(n)
    return time.perf_counter() - t


def stat(runs: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    xs = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def cell(runs: list[dict[str, Any]], key: str, dec: int = 0) -> str:
    s = stat(runs, key)
    if s is None:
        errs = [r.get("error", "") for r in runs]
        return f"failed ({errs[0][:80]})" if errs else "not run"
    f = f"{{:,.{dec}f}}"
    txt = f.format(s["median"])
    if s["n"] > 1:
        txt += f" ({f.format(s['min'])}{chr(0x2013)}{f.format(s['max'])})"
    return txt


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    cpu, noop = doc["results"]["cpu"], doc["results"]["noop"]
    lines = [
        f"Run {m['timestamp']} on {m['cores']} cores ({m['cpu']}), Redis {m['redis_server']},"
        f" Python {m['python']}, streamq at {m['commit']}; load average at the start"
        f" {doc['load_avg_start']:.1f}, at the end {doc['load_avg_end']:.1f} (a shared, busy"
        f" machine: compare rows, not absolutes). Median of {doc['reps']} repetition(s)"
        f" (min{chr(0x2013)}max). Whole run {doc['duration_s'] / 60:.1f} min.",
        "",
        f"CPU-bound job: {doc['cpu_loop']:,} iterations of pure-Python arithmetic"
        f" ({doc['cpu_job_ms']:.1f} ms alone), {doc['sizes']['cpu_n']:,} jobs per run.",
        "",
        "| runtime | CPU-bound jobs/s | 2 processes / 1 | CPU-bound: CPU µs/job |"
        " no-op jobs/s | no-op: CPU µs/job |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for label, peer, mode, procs in CPU_RUNS:
        runs = cpu.get(label, [])
        one = next((lb for lb, p, md, k in CPU_RUNS if (p, md, k) == (peer, mode, 1)), "")
        base, mine = stat(cpu.get(one, []), "per_s"), stat(runs, "per_s")
        x = (f"{mine['median'] / base['median']:.2f}" if base and mine and procs > 1
             else "")
        nl = noop.get(label) or []
        lines.append(f"| {label} | {cell(runs, 'per_s')} | {x} |"
                     f" {cell(runs, 'cpu_us_per_job')} |"
                     f" {cell(nl, 'per_s') if nl else ''} |"
                     f" {cell(nl, 'cpu_us_per_job') if nl else ''} |")
    for label, _peer, _mode, _procs in NOOP_RUNS:
        if label not in cpu:
            nl = noop.get(label, [])
            lines.append(f"| {label} | | | | {cell(nl, 'per_s')} |"
                         f" {cell(nl, 'cpu_us_per_job')} |")
    lines += ["", "Per-job cost of process isolation (no-op jobs, one worker process: with"
              " isolation minus without, as wall time per job and as CPU time per job of all"
              " the worker's processes; µs):", "",
              "| | wall without | wall with | wall cost | CPU without | CPU with |"
              " CPU cost |",
              "|---|--:|--:|--:|--:|--:|--:|"]
    for what, a, b in ISOLATION:
        row = f"| {what} |"
        for key in ("us_per_job", "cpu_us_per_job"):
            sa, sb = stat(noop.get(a, []), key), stat(noop.get(b, []), key)
            cost = f"{sb['median'] - sa['median']:,.0f}" if sa and sb else "n/a"
            row += f" {cell(noop.get(a, []), key)} | {cell(noop.get(b, []), key)} | {cost} |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers.runtime", description=__doc__)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--cpu-n", type=int, default=300, help="CPU-bound jobs per run")
    ap.add_argument("--noop-n", type=int, default=1000, help="no-op jobs per run")
    ap.add_argument("--cpu-ms", type=float, default=5.0, help="target ms of work per job")
    ap.add_argument("--peers", default="streamq,celery,dramatiq,rq,rq-fork")
    ap.add_argument("--out", type=Path, default=RESULTS)
    a = ap.parse_args(argv)
    peers = set(a.peers.split(","))

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    needed = sorted({e for p in peers if (e := PEERS[p][0])})
    # (ensure_all of no env would install every peer: streamq alone needs none)
    bad = {e: err for e, err in (envs.ensure_all(needed, log) if needed else {}).items()
           if err}
    if bad:
        log(f"install failed: {bad}")
        return 1
    loop, job_s = calibrate(a.cpu_ms / 1000)
    log(f"cpu job: {loop} iterations, {job_s * 1000:.2f} ms")
    res: dict[str, dict[str, list[dict[str, Any]]]] = {"cpu": {}, "noop": {}}
    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url, protocol=2)
        facts = machine_facts(client)
        for rep in range(1, a.reps + 1):
            log(f"== repetition {rep}/{a.reps}")
            for kind, table, n, lp in (("cpu", CPU_RUNS, a.cpu_n, loop),
                                       ("noop", NOOP_RUNS, a.noop_n, 0)):
                for label, peer, mode, procs in table:
                    if peer not in peers:
                        continue
                    nn = max(100, int(n * SLOW_N.get(peer, 1)))
                    out = run_adapter(peer, "cpu", srv.url,
                                      ["--n", str(nn), "--workers", str(procs), "--mode", mode,
                                       "--loop", str(lp), "--timeout", "240"], 300, log)
                    res[kind].setdefault(label, []).append(out)
        client.close()
    doc = {"machine": facts, "load_avg_start": load0, "load_avg_end": os.getloadavg()[0],
           "duration_s": round(time.perf_counter() - t0, 1), "reps": a.reps,
           "cpu_loop": loop, "cpu_job_ms": round(job_s * 1000, 2),
           "sizes": {"cpu_n": a.cpu_n, "noop_n": a.noop_n, "slow_n_factor": SLOW_N},
           "settings": {"streamq": "streamq worker --concurrency 4 (per process); sync handler",
                        "celery": "-Q bench --without-gossip --without-mingle"
                                  " --without-heartbeat; prefetch multiplier 4 (default)",
                        "dramatiq": "--threads 1",
                        "rq": "rq worker (SimpleWorker; rq-fork: the default forking Worker)"},
           "versions": {e: envs.installed_versions(e) for e in needed},
           "results": res, "logs": str(LOGDIR)}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "runtime_peers.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = render(doc)
    (a.out / "runtime_peers.md").write_text(md)
    print(md)
    log(f"wrote {a.out}/runtime_peers.json and .md in {doc['duration_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
