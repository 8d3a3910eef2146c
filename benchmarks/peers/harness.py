"""``python -m benchmarks.peers``: streamq against real peers, one private redis-server, one run.

Each peer runs through its adapter (``adapters/<peer>_peer.py``) in its own virtualenv
(``.bench-venvs/<peer>``, see ``setup.py``); the harness only starts processes and reads one
JSON line from each. Results: ``benchmarks/results/peers.{md,json}`` and ``peers.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from streamq._core.server import RedisServer

from ..harness import machine_facts
from ..workloads import Ctx, Sizes, ceiling
from . import setup as envs

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results"
EN = "\N{EN DASH}"
TIMES = "\N{MULTIPLICATION SIGN}"

# peer -> (python env or None for the project venv, adapter file, extra env)
PEERS: dict[str, tuple[str | None, str, dict[str, str]]] = {
    "streamq": (None, "streamq_peer.py", {}),
    "streaq": ("streaq", "streaq_peer.py", {}),
    "arq": ("arq", "arq_peer.py", {}),
    "saq": ("saq", "saq_peer.py", {}),
    "rq": ("rq", "rq_peer.py", {}),
    "rq-fork": ("rq", "rq_peer.py", {"BENCH_RQ_FORK": "1"}),
    "taskiq": ("taskiq", "taskiq_peer.py", {}),
    "dramatiq": ("dramatiq", "dramatiq_peer.py", {}),
    "celery": ("celery", "celery_peer.py", {}),
    "huey": ("huey", "huey_peer.py", {}),
    "bullmq": ("bullmq", "bullmq_peer.py", {}),
    # BullMQ as its docs recommend for production throughput ("Auto-removal of jobs":
    # removeOnComplete {count: 1000}, removeOnFail {count: 5000}); its finished-memory figure
    # is then that of 1,000 kept jobs, not of every job (streamq keeps each for its TTL)
    "bullmq-tuned": ("bullmq", "bullmq_peer.py", {"BENCH_BULL_REMOVE": "1"}),
}
# Peers that run one job at a time per process get smaller N (the same N would take minutes).
SLOW_N = {"rq": 0.1, "rq-fork": 0.05}
NO_VT = {"rq", "rq-fork", "huey"}
"""Peers with no visibility timeout / lock / heartbeat setting to shorten."""
SLOW_LATENCY_N = {"arq": 40}  # arq workers poll every 0.5 s: 40 round trips take 20 s


def python_for(env: str | None) -> list[str]:
    if env is None or env == "bullmq":
        return [sys.executable]
    return [str(envs.venv_python(env))]


def run_adapter(peer: str, workload: str, url: str, args: list[str], timeout: float,
                log: Callable[[str], None]) -> dict[str, Any]:
    env_name, script, extra = PEERS[peer]
    env = dict(os.environ)
    env.update(extra)
    env["BENCH_LOGDIR"] = str(LOGDIR)
    env["PYTHONPATH"] = str(HERE.parent.parent)
    cmd = [*python_for(env_name), str(HERE / "adapters" / script), workload, "--url", url,
           *args]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=HERE / "adapters")
    except subprocess.TimeoutExpired:
        return {"error": f"adapter timed out after {timeout:g}s"}
    (LOGDIR / f"{peer}-{workload}-{int(time.time())}.stderr").write_text(p.stderr)
    lines = [x for x in p.stdout.strip().splitlines() if x.startswith("{")]
    if not lines:
        return {"error": f"no JSON from adapter (exit {p.returncode}): {p.stderr[-400:]}"}
    out: dict[str, Any] = json.loads(lines[-1])
    log(f"  {peer} {workload} {' '.join(args)} ({time.perf_counter() - t0:.1f}s): "
        + (out["error"][:200] if "error" in out else
           ", ".join(f"{k}={v:,.4g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in out.items())))
    return out


LOGDIR = Path(tempfile.mkdtemp(prefix="streamq-peers-"))


def main(argv: list[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    if "--flows" in raw:  # workflows side by side: flows.py
        from .flows import main as flows_main

        return flows_main([x for x in raw if x != "--flows"])
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers", description=__doc__)
    ap.add_argument("--smoke", action="store_true", help="streamq + huey, tiny N, one rep")
    ap.add_argument("--peers", default=None, help="comma-separated subset")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of drain/enqueue/latency")
    ap.add_argument("--n", type=int, default=20_000, help="jobs per drain / io run")
    ap.add_argument("--single", type=int, default=2_000, help="one-at-a-time enqueues")
    ap.add_argument("--latency-n", type=int, default=500)
    ap.add_argument("--io-n", type=int, default=20_000)
    ap.add_argument("--cap", type=float, default=120.0, help="recovery wait cap (s)")
    ap.add_argument("--skip", default="", help="workloads to skip (drain2,io,recovery,...)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--flows", action="store_true",
                    help="the workflows comparison instead (python -m benchmarks.peers --flows"
                         " --help)")
    a = ap.parse_args(raw)
    if a.smoke:
        a.peers = a.peers or "streamq,huey"
        a.reps, a.n, a.single, a.latency_n, a.io_n, a.cap = 1, 300, 50, 20, 300, 20
        a.skip = a.skip or "recovery"
    peers = a.peers.split(",") if a.peers else list(PEERS)
    skip = set(filter(None, a.skip.split(",")))
    out_dir = a.out or (Path(tempfile.mkdtemp(prefix="streamq-peers-out-")) if a.smoke
                        else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    install: dict[str, str | None] = {}
    needed = sorted({e for p in peers if (e := PEERS[p][0])})
    install.update(envs.ensure_all(needed, log) if needed else {})
    versions = {e: envs.installed_versions(e) for e in needed}
    res: dict[str, dict[str, list[Any]]] = {p: {} for p in peers}
    notes: dict[str, list[str]] = {p: [] for p in peers}

    def record(peer: str, key: str, out: dict[str, Any]) -> None:
        res[peer].setdefault(key, []).append(out)

    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url, protocol=2)
        facts = machine_facts(client)
        log(f"redis-server {facts['redis_server']} at {srv.url}; peers {peers}")
        ctx = Ctx(srv.url, Sizes(jobs=a.n), client, log)
        ceil: list[dict[str, float]] = []
        live = [p for p in peers if not install.get(PEERS[p][0] or "")]
        for p in peers:
            if p not in live:
                res[p]["install"] = [{"error": "install failed: "
                                      + str(install.get(PEERS[p][0] or ""))[:300]}]
        for rep in range(1, a.reps + 1):
            log(f"== repetition {rep}/{a.reps}")
            ceil.append(ceiling(ctx))
            log(f"  ceiling: {ceil[-1]}")
            for p in live:
                n = max(100, int(a.n * SLOW_N.get(p, 1)))
                single = max(50, int(a.single * SLOW_N.get(p, 1) * 5)) if p in SLOW_N \
                    else a.single
                if "drain" not in skip:
                    record(p, "drain1", run_adapter(p, "drain", srv.url,
                                                    ["--n", str(n), "--workers", "1"], 900, log))
                if "drain2" not in skip:
                    record(p, "drain2", run_adapter(p, "drain", srv.url,
                                                    ["--n", str(n), "--workers", "2"], 900, log))
                if "enqueue" not in skip:
                    record(p, "enqueue", run_adapter(p, "enqueue", srv.url,
                                                     ["--n", str(single), "--bulk-n",
                                                      str(a.n)], 600, log))
                if "latency" not in skip:
                    ln = min(a.latency_n, SLOW_LATENCY_N.get(p, a.latency_n))
                    record(p, "latency", run_adapter(p, "latency", srv.url,
                                                     ["--n", str(ln)], 600, log))
        # I/O and recovery: one repetition (time box; see docs/performance.md)
        if "io" not in skip:
            for p in live:
                n = max(100, int(a.io_n * SLOW_N.get(p, 1) * (0.25 if p in SLOW_N else 1)))
                record(p, "io", run_adapter(p, "io", srv.url, ["--n", str(n),
                                                               "--concurrency", "100"],
                                            900, log))
        if "recovery" not in skip:
            # all peers at once, each in its own Redis database: the waits are timeouts, not
            # CPU, and run one after the other they would take 11 x 2 x 2 minutes
            for vt in (None, 5.0):
                threads = []
                for i, p in enumerate(live):
                    url = srv.url.rsplit("/", 1)[0] + f"/{i + 1}"
                    args = ["--cap", str(a.cap)] + (["--vt", str(vt)] if vt else [])
                    key = "recovery_vt5" if vt else "recovery"
                    t = threading.Thread(target=lambda p=p, url=url, args=args, key=key: record(
                        p, key, run_adapter(p, "recovery", url, args, a.cap + 120, log)))
                    t.start()
                    threads.append(t)
                    time.sleep(0.3)
                for t in threads:
                    t.join()
        client.close()
    duration = time.perf_counter() - t_start
    doc = {"machine": facts, "duration_s": round(duration, 1), "reps": a.reps,
           "sizes": {"n": a.n, "single": a.single, "latency_n": a.latency_n, "io_n": a.io_n,
                     "cap_s": a.cap, "slow_n_factor": SLOW_N,
                     "latency_n_override": SLOW_LATENCY_N},
           "ceiling": ceil, "results": res, "notes": notes, "versions": versions,
           "smoke": a.smoke}
    (out_dir / "peers.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = render(doc)
    (out_dir / "peers.md").write_text(md)
    print(md)
    plot = envs.venv_python("plot")
    if plot.exists():
        subprocess.run([str(plot), str(HERE / "plot.py"), str(out_dir / "peers.json"),
                        str(out_dir / "peers.png")], check=False)
    log(f"wrote {out_dir}/peers.md, peers.json, peers.png in {duration:.0f}s; logs in {LOGDIR}")
    if a.smoke:
        bad = [p for p in peers for runs in res[p].values() for r in runs if "error" in r]
        return 1 if bad else 0
    return 0


# ------------------------------------------------------------------------------ report


def stat(runs: list[dict[str, Any]], key: str) -> dict[str, float] | None:
    xs = [r[key] for r in runs if isinstance(r.get(key), (int, float))]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def cell(runs: list[dict[str, Any]] | None, key: str, dec: int = 0) -> str:
    if not runs:
        return "not run"
    s = stat(runs, key)
    if s is None:
        errs = [r["error"] for r in runs if "error" in r]
        return f"failed ({errs[0][:90]})" if errs else "n/a"
    f = f"{{:,.{dec}f}}"
    txt = f.format(s["median"])
    if s["n"] > 1:
        txt += f" ({f.format(s['min'])}{EN}{f.format(s['max'])})"
    errs = [r["error"] for r in runs if "error" in r]
    if errs:  # a repetition that failed its own check is reported, not dropped
        txt += f" [{len(errs)} of {len(runs)} runs failed: {errs[0][:70]}]"
    return txt


def ratio(doc: dict[str, Any], peer: str, wk: str, key: str, lower_better: bool = False
          ) -> str:
    a = stat(doc["results"].get("streamq", {}).get(wk, []), key)
    b = stat(doc["results"].get(peer, {}).get(wk, []), key)
    if not a or not b or not b["median"] or not a["median"]:
        return ""
    r = (b["median"] / a["median"]) if lower_better else (a["median"] / b["median"])
    return f" **{TIMES}{r:.1f}**" if peer != "streamq" else ""


def rec_cell(runs: list[dict[str, Any]] | None) -> str:
    if not runs:
        return "not run"
    r = runs[0]
    if "error" in r:
        return f"failed ({r['error'][:80]})"
    if r.get("recovered_s") is not None:
        return f"{r['recovered_s']:.1f} s" + (f" (held {r['held']})" if r["held"] != 100
                                               else "")
    return f"> {r['cap_s']:.0f} s ({r['done']}/100 done)"


def render(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    res = doc["results"]
    c = doc["ceiling"]
    raw = statistics.median([x["raw_drain_per_s"] for x in c]) if c else 0
    xadd = statistics.median([x["raw_xadd_per_s"] for x in c]) if c else 0
    lines = [
        f"Run {m['timestamp']} on {m['cores']} cores ({m['cpu']}), Redis {m['redis_server']}"
        f" (persistence off), Python {m['python']}, streamq {m['streamq']} at {m['commit']}."
        f" Whole run {doc['duration_s'] / 60:.1f} min. Throughput and latency: median of"
        f" {doc['reps']} repetition(s) with min{EN}max; I/O and recovery: one run."
        f" **{TIMES}k** = how many times better streamq's figure is than the peer's"
        " (below 1: the peer is better), from the same run.",
        "",
        f"Ceiling (raw redis-py, same server): XREADGROUP+XACK+XDEL loop {raw:,.0f} entries/s,"
        f" pipelined XADD {xadd:,.0f} entries/s.",
        "",
        "| peer | drain, 1 proc (jobs/s) | drain, 2 procs (jobs/s) | enqueue 1-by-1 (jobs/s) |"
        " bulk enqueue (jobs/s) | round trip p50 / p99 (ms) | enqueue→start p50 (ms) |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for p, r in res.items():
        if "install" in r:
            lines.append(f"| {p} | {r['install'][0]['error'][:120]} | | | | | |")
            continue
        n = ""
        d1 = r.get("drain1") or []
        if d1 and "jobs" in d1[0] and d1[0]["jobs"] != doc["sizes"]["n"]:
            n = f" [N={d1[0]['jobs']:,}]"
        bulk = cell(r.get("enqueue"), "bulk_per_s")
        if bulk == "n/a":
            bulk = "no bulk API"
        lat = r.get("latency")
        lines.append(
            f"| {p}{n} | {cell(d1, 'per_s')}{ratio(doc, p, 'drain1', 'per_s')} |"
            f" {cell(r.get('drain2'), 'per_s')}{ratio(doc, p, 'drain2', 'per_s')} |"
            f" {cell(r.get('enqueue'), 'single_per_s')}"
            f"{ratio(doc, p, 'enqueue', 'single_per_s')} |"
            f" {bulk}{ratio(doc, p, 'enqueue', 'bulk_per_s') if 'API' not in bulk else ''} |"
            + (f" {cell(lat, 'rtt_p50_ms', 2)}{ratio(doc, p, 'latency', 'rtt_p50_ms', True)}"
               f" / {cell(lat, 'rtt_p99_ms', 2)} | {cell(lat, 'start_p50_ms', 2)} |"
               if stat(lat or [], "rtt_p50_ms") else f" {cell(lat, 'rtt_p50_ms', 2)} | |"))
    lines += [
        "",
        "| peer | I/O: 10 ms sleeps, 1 proc, concurrency 100 (jobs/s) | recovery, defaults |"
        " recovery, visibility 5 s | Redis MB / 100k queued | Redis MB / 100k finished |",
        "|---|--:|--:|--:|--:|--:|",
    ]
    for p, r in res.items():
        if "install" in r:
            continue
        io = r.get("io") or []
        n = f" [N={io[0]['jobs']:,}]" if io and "jobs" in io[0] and \
            io[0]["jobs"] != doc["sizes"]["io_n"] else ""
        d1 = [x for x in (r.get("drain1") or []) + (r.get("drain2") or []) if "error" not in x]
        mq = stat(d1[:1], "mem_queued_per_100k")
        mf = stat(d1[:1], "mem_finished_per_100k")
        vt5 = "no such setting" if p in NO_VT else rec_cell(r.get("recovery_vt5"))
        lines.append(
            f"| {p} | {cell(io, 'per_s')}{n}{ratio(doc, p, 'io', 'per_s')} |"
            f" {rec_cell(r.get('recovery'))} | {vt5} |"
            f" {mq['median'] / 1e6:,.1f} |" if mq else f"| {p} | {cell(io, 'per_s')}{n}"
            f"{ratio(doc, p, 'io', 'per_s')} |"
            f" {rec_cell(r.get('recovery'))} | {vt5} | n/a |")
        if mq:
            lines[-1] += f" {mf['median'] / 1e6:,.1f} |" if mf else " n/a |"
        else:
            lines[-1] += " n/a |"
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
