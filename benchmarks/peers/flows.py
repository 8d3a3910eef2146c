"""``python -m benchmarks.peers --flows [--fan 10000] [--chain 1000] [--reps 3]``: workflows
side by side (issue 29): streamq, BullMQ Flows and a celery chord / chain, in one run.

Each peer gets its own private redis-server for the whole run (persistence off) and, per
measure, one worker process started and warmed up by its adapter (``flowload.py``), the same
process and settings as the peers harness's drain: streamq ``Worker`` concurrency 100, BullMQ
``new Worker(..., {concurrency: 100})``, celery ``--pool solo`` (one task at a time, prefetch
4). Measures, each timed from the producer's first enqueue call to the end:

* ``plain``: N no-op jobs (each peer's bulk enqueue; celery: ``delay`` one by one), until the
  last completed (the reference);
* ``fan``: the N -> 1 fan-in: streamq ``chord(group([...]), callback)`` through
  ``enqueue_flow``; BullMQ ``FlowProducer.add`` of a parent with N children; celery
  ``chord(group(...), callback)`` on the Redis broker and result backend; until the callback
  ran (it reads every child's result);
* ``fandeps`` (streamq only): the same fan-in as ``enqueue_many`` + ``enqueue(...,
  depends_on=[...])``;
* ``chain``: C steps, each getting the previous step's result: streamq ``chain(...)``,
  BullMQ a C-deep flow (each step the one child of the next), celery ``chain(...)``;
* ``plain_pre`` and ``fan_pre``: the plain drain and the fan-in with everything enqueued
  before the worker starts, timed from the first job's start (the engine's side alone, as
  the peers drain and ``benchmarks.flow_bench`` measure it).

Repetitions interleave the peers (the peer order rotates each repetition) and each peer's
measures run back to back, so a fan-in's ratio to its own peer's plain drain is taken within
one repetition; every figure is the median of the repetitions (min-max). A run that fails
or times out is recorded with its error (and not repeated when it timed out). Results:
``benchmarks/results/peers_flows.{json,md}`` (``--out`` elsewhere; ``--smoke``: a temporary
directory).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import redis

from streamq._core.server import RedisServer

from ..harness import machine_facts
from . import setup as envs
from .harness import LOGDIR, PEERS, RESULTS, run_adapter

FLOW_PEERS = ("streamq", "bullmq", "celery")
MEASURES = {"streamq": ("plain", "fan", "fandeps", "chain", "plain_pre", "fan_pre")}
DEFAULT_MEASURES = ("plain", "fan", "chain", "plain_pre", "fan_pre")
RATIO_MEASURES = ("plain", "fan", "chain", "plain_pre", "fan_pre")
EN = "\N{EN DASH}"
TIMES = "\N{MULTIPLICATION SIGN}"
SETTINGS = {
    "streamq": "one worker process (streamq.Worker, WorkerConfig(concurrency=100)), one queue",
    "bullmq": "one node process (new Worker('bench', fn, {concurrency: 100})), one queue;"
              " completed jobs kept (BullMQ's default)",
    "celery": "one worker process, --pool solo (one task at a time; prefetch multiplier 4),"
              " Redis broker + Redis result backend; results kept (default)",
}
Runs = list[dict[str, Any]]


def stat(runs: Runs, key: str) -> dict[str, float] | None:
    xs = [r[key] for r in runs if "error" not in r and isinstance(r.get(key), (int, float))]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def fmt(s: dict[str, float] | None, dec: int = 0, unit: str = "") -> str:
    if s is None:
        return "n/a"
    f = f"{{:,.{dec}f}}"
    txt = f.format(s["median"]) + unit
    if s["n"] > 1:
        txt += f" ({f.format(s['min'])}{EN}{f.format(s['max'])})"
    return txt


def cell(runs: Runs, key: str, dec: int = 0, unit: str = "") -> str:
    if not runs:
        return "not run"
    txt = fmt(stat(runs, key), dec, unit)
    errs = [r["error"] for r in runs if "error" in r]
    if errs:
        if txt == "n/a":
            return f"**failed**: {errs[0][:160]}"
        txt += f" [{len(errs)} of {len(runs)} runs failed: {errs[0][:100]}]"
    return txt


def paired(a: Runs, b: Runs, key: str = "per_s") -> dict[str, float] | None:
    """Median (min-max) over the repetitions of a[rep][key] / b[rep][key]."""
    bb = {r["rep"]: r for r in b if "error" not in r and r.get(key)}
    xs = [r[key] / bb[r["rep"]][key] for r in a
          if "error" not in r and r.get(key) and r["rep"] in bb]
    if not xs:
        return None
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs)}


def ratios(doc: dict[str, Any]) -> dict[str, Any]:
    res = doc["results"]
    out: dict[str, Any] = {"fan_over_plain": {}, "streamq_over_peer": {}}
    for p, r in res.items():
        for fan in ("fan", "fandeps"):
            if fan in r:
                out["fan_over_plain"][f"{p}/{fan}"] = paired(r[fan], r.get("plain", []))
        if "fan_pre" in r:
            out["fan_over_plain"][f"{p}/fan_pre"] = paired(r["fan_pre"], r.get("plain_pre", []))
    sq = res.get("streamq", {})
    for p, r in res.items():
        if p == "streamq":
            continue
        out["streamq_over_peer"][p] = {m: paired(sq.get(m, []), r.get(m, []))
                                       for m in RATIO_MEASURES}
    return out


def render(doc: dict[str, Any]) -> str:
    m, res, rt, sz = doc["machine"], doc["results"], doc["ratios"], doc["sizes"]
    n, c = sz["fan"], sz["chain"]
    loads = [r["load1"] for runs in res.values() for rr in runs.values() for r in rr
             if "load1" in r]
    lines = [
        f"Run {m['timestamp']} on {m['cores']} cores ({m['cpu']}), Redis {m['redis_server']}"
        f" (one private server per peer, persistence off), Python {m['python']}, streamq"
        f" {m['streamq']} at {m['commit']}. `{doc['command']}`. Load average (1 min) at the"
        f" start {doc['load_avg_start']:.1f}, during the runs {min(loads, default=0):.1f}"
        f"{EN}{max(loads, default=0):.1f}, at the end {doc['load_avg_end']:.1f} (a shared"
        f" machine: read the ratios, taken within one repetition, rather than absolutes)."
        f" Median of {doc['reps']} interleaved repetition(s) (min{EN}max). Whole run"
        f" {doc['duration_s'] / 60:.1f} min.",
        "",
        f"Each figure is timed from the producer's first enqueue call to the end (the last"
        f" plain job's completion, the fan-in's callback, the chain's last step), the enqueue"
        f" included. Plain drain: {n:,} no-op jobs; fan-in: {n:,} no-op children and one"
        f" callback that reads all their results (jobs/s = {n:,} / time); chain: {c:,} steps,"
        f" each getting the previous step's result. Every run is checked (else listed as"
        f" failed): the callback saw all {n:,} results, the chain's last step counted {c:,}"
        f" (each step got its predecessor's result), every child / step ran exactly once."
        f" Fan-in enqueue / after: the producer's enqueue call, and the time from its return"
        f" to the callback (below 0: the callback ended before the enqueue call returned)."
        f" CPU: the worker process's and redis-server's, per job (children + callback;"
        f" steps), µs.",
        "",
        f"| peer | plain drain (jobs/s) | {n:,}{chr(0x2192)}1 fan-in (jobs/s) |"
        " fan-in / plain | fan-in: enqueue / after (s) |"
        f" {c:,}-step chain (steps/s) | worker CPU µs/job: plain, fan-in, chain |"
        " Redis CPU µs/job: plain, fan-in, chain |",
        "|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for p, r in res.items():
        if "install" in r:
            lines.append(f"| {p} | {r['install'][0]['error'][:160]} | | | | | | |")
            continue
        for fan in ("fan", "fandeps"):
            if fan not in r:
                continue
            label = p if fan == "fan" else f"{p} (`depends_on`)"
            first = fan == "fan"
            fr = rt["fan_over_plain"].get(f"{p}/{fan}")
            cpu = [cell(r.get(k, []), "worker_cpu_us_per_job") if first or k == fan else EN
                   for k in ("plain", fan, "chain")]
            rcpu = [cell(r.get(k, []), "redis_cpu_us_per_job") if first or k == fan else EN
                    for k in ("plain", fan, "chain")]
            lines.append(
                f"| {label} | {cell(r.get('plain', []), 'per_s') if first else ''} |"
                f" {cell(r[fan], 'per_s')} | {fmt(fr, 2) if fr else 'n/a'} |"
                f" {fmt(stat(r[fan], 'enqueue_s'), 2)} /"
                f" {fmt(stat(r[fan], 'after_enqueue_s'), 2)} |"
                f" {cell(r.get('chain', []), 'per_s') if first else ''} |"
                f" {', '.join(cpu)} | {', '.join(rcpu)} |")
    if any("fan_pre" in r for r in res.values()):
        lines += ["", "The engine's side alone: everything enqueued before the worker starts,"
                  " timed from the first job's start to the last completion / the callback"
                  " (as the peers drain measures):", "",
                  "| peer | plain drain (jobs/s) | fan-in (jobs/s) | fan-in / plain |",
                  "|---|--:|--:|--:|"]
        for p, r in res.items():
            if "fan_pre" in r:
                fr = rt["fan_over_plain"].get(f"{p}/fan_pre")
                lines.append(f"| {p} | {cell(r.get('plain_pre', []), 'per_s')} |"
                             f" {cell(r['fan_pre'], 'per_s')} | {fmt(fr, 2) if fr else 'n/a'} |")
    lines += ["", f"streamq's figure {TIMES} the peer's (above 1: streamq is faster), per"
              " repetition, median (min" + EN + "max):", "",
              "| streamq vs | plain drain | fan-in | chain | plain drain, prefilled |"
              " fan-in, prefilled |", "|---|--:|--:|--:|--:|--:|"]
    for p, by in rt["streamq_over_peer"].items():
        lines.append(f"| {p} | " + " | ".join(
            (f"{TIMES}" + fmt(by[k], 2)) if by.get(k) else "n/a"
            for k in RATIO_MEASURES) + " |")
    lines += ["", "Settings:", ""]
    lines += [f"- {p}: {SETTINGS[p]}" for p in res if p in SETTINGS]
    notes = [f"- {p} {k}: {x}" for p, by in doc["notes"].items() for k, x in by.items()]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.peers --flows", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fan", type=int, default=10_000, help="fan-in children (and plain N)")
    ap.add_argument("--chain", type=int, default=1_000, help="chain steps")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--peers", default=",".join(FLOW_PEERS))
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--skip", default="", help="measures to skip (e.g. plain_pre,fan_pre)")
    ap.add_argument("--timeout", type=float, default=600.0, help="per measure (s)")
    ap.add_argument("--smoke", action="store_true",
                    help="--fan 200 --chain 20 --reps 1, streamq only unless --peers")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--render", type=Path, default=None, metavar="JSON",
                    help="only rewrite the .md next to a peers_flows.json from it")
    raw = list(sys.argv[1:] if argv is None else argv)
    a = ap.parse_args(raw)
    if a.render:
        md = render(json.loads(a.render.read_text()))
        a.render.with_suffix(".md").write_text(md)
        print(md)
        return 0
    if a.smoke:
        a.fan, a.chain, a.reps, a.timeout = 200, 20, 1, 120.0
        if "--peers" not in raw:
            a.peers = "streamq"
    peers = [p for p in a.peers.split(",") if p]
    skip = set(filter(None, a.skip.split(",")))
    unknown = [p for p in peers if p not in PEERS]
    if unknown:
        ap.error(f"unknown peers {unknown}")
    out_dir = a.out or (Path(os.environ.get("TMPDIR", "/tmp")) / "streamq-peers-flows"
                        if a.smoke else RESULTS)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    t_start = time.perf_counter()
    load0 = os.getloadavg()[0]
    needed = sorted({e for p in peers if (e := PEERS[p][0])})
    install = envs.ensure_all(needed, log) if needed else {}
    res: dict[str, dict[str, Runs]] = {p: {} for p in peers}
    notes: dict[str, dict[str, str]] = {p: {} for p in peers}
    live = [p for p in peers if not install.get(PEERS[p][0] or "")]
    for p in peers:
        if p not in live:
            res[p]["install"] = [{"error": "install failed: "
                                  + str(install.get(PEERS[p][0] or ""))[:300]}]
    with contextlib.ExitStack() as stack:
        servers = {p: stack.enter_context(RedisServer()) for p in live}
        client = redis.Redis.from_url(next(iter(servers.values())).url if servers else
                                      stack.enter_context(RedisServer()).url, protocol=2)
        facts = machine_facts(client)
        client.close()
        log(f"redis-server {facts['redis_server']}; peers {live}; fan {a.fan}, chain {a.chain}")
        for rep in range(1, a.reps + 1):
            log(f"== repetition {rep}/{a.reps}")
            k = (rep - 1) % max(1, len(live))
            for p in live[k:] + live[:k]:
                for m in MEASURES.get(p, DEFAULT_MEASURES):
                    if m in skip:
                        continue
                    what, pre = (m[:-4], True) if m.endswith("_pre") else (m, False)
                    runs = res[p].setdefault(m, [])
                    if any("timed out" in r.get("error", "") for r in runs):
                        notes[p][m] = "timed out; not repeated"
                        continue
                    n = a.chain if what == "chain" else a.fan
                    out = run_adapter(p, "flow", servers[p].url,
                                      ["--what", what, "--n", str(n), "--concurrency",
                                       str(a.concurrency), "--timeout", str(a.timeout),
                                       *(["--prefill"] if pre else [])],
                                      a.timeout + 180, log)
                    out.update(rep=rep, load1=round(os.getloadavg()[0], 2))
                    runs.append(out)
    duration = time.perf_counter() - t_start
    cmd = "python -m benchmarks.peers --flows " + " ".join(raw)
    doc: dict[str, Any] = {
        "machine": facts, "command": cmd.strip(), "duration_s": round(duration, 1),
        "load_avg_start": load0, "load_avg_end": os.getloadavg()[0], "reps": a.reps,
        "sizes": {"fan": a.fan, "chain": a.chain, "concurrency": a.concurrency},
        "settings": {p: SETTINGS.get(p, "") for p in peers},
        "versions": {e: envs.installed_versions(e) for e in needed}
        | ({"bullmq": _bullmq_version()} if "bullmq" in peers else {}),
        "results": res, "notes": notes, "logs": str(LOGDIR), "smoke": a.smoke}
    doc["ratios"] = ratios(doc)
    (out_dir / "peers_flows.json").write_text(json.dumps(doc, indent=1) + "\n")
    md = render(doc)
    (out_dir / "peers_flows.md").write_text(md)
    print(md)
    log(f"wrote {out_dir}/peers_flows.md and .json in {duration:.0f} s; logs in {LOGDIR}")
    if a.smoke:
        bad = [r for by in res.values() for runs in by.values() for r in runs if "error" in r]
        return 1 if bad else 0
    return 0


def _bullmq_version() -> str:
    pkg = envs.BULLMQ_DIR / "node_modules" / "bullmq" / "package.json"
    try:
        bull = json.loads(pkg.read_text())["version"]
    except (OSError, ValueError, KeyError):
        bull = "?"
    try:
        node = subprocess.run(["node", "--version"], capture_output=True, text=True,
                              timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        node = "?"
    return f"bullmq {bull}, node {node}"


if __name__ == "__main__":
    sys.exit(main())
