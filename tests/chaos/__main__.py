"""``python -m tests.chaos --minutes M --seed S --out FILE``: one chaos run, summary table on
stdout, the full report as JSON in FILE; exit status 1 when a check failed."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path
from typing import Any

from .cluster import ClusterOptions, render_cluster, run_cluster
from .flows import LONG, FlowOptions, render_flows, run_flows
from .harness import FAULTS, Options, render, run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    p.add_argument("--minutes", type=float, default=15.0,
                   help="length of the fault phase (default 15); draining and checks follow")
    p.add_argument("--seed", type=int, default=None, help="default: from the clock (printed)")
    p.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    p.add_argument("--workdir", type=Path, default=None,
                   help="keep the Redis directory, ledger and logs here (default: a temporary"
                   " directory, removed after a passing run)")
    p.add_argument("--rate", type=float, default=Options.rate, help="jobs per second offered")
    p.add_argument("--workers", type=int, default=Options.workers)
    p.add_argument("--fault-every", type=float, default=Options.fault_every_s,
                   help="mean seconds between two faults")
    p.add_argument("--filler-keys", type=int, default=Options.filler_keys,
                   help="filler keys that make each Redis restart spend a while LOADING")
    p.add_argument("--faults", default=",".join(FAULTS),
                   help="the fault menu, comma-separated (default: all of them), e.g."
                   " term_short,term_long,reload,reload_proc for deploys only")
    p.add_argument("--quiet", action="store_true", help="no progress lines")
    p.add_argument("--cluster", action="store_true",
                   help="the cluster run instead (tests/chaos/cluster.py): a sharded, grouped,"
                   " prioritised queue on a loopback Redis Cluster while primaries are"
                   " SIGKILLed (failover) and its slots migrated; --minutes, --seed, --out,"
                   " --workdir, --quiet apply")
    p.add_argument("--reshard", action="store_true",
                   help="with --cluster: reshard the queue 3 -> 6 -> 3 ... at random times"
                   " (some begins abandoned half-way, finished by a producer or the next"
                   " call) while workers are SIGKILLed and SIGTERMed too; ends on 3 shards and"
                   " checks the old ones deleted (tests/chaos/reshard_soak.py)")
    p.add_argument("--reshard-every", type=float, default=ClusterOptions.reshard_every_s,
                   help="with --reshard: mean seconds between two reshards")
    p.add_argument("--flows", action="store_true",
                   help="with --cluster: the workflow run (tests/chaos/flows.py): a fan-in, a"
                   " chain, a random DAG with mixed edge policies and two batches with callbacks"
                   " across two sharded queues while workers are killed and stopped and a"
                   " primary fails over; --minutes, --seed, --out, --workdir, --quiet apply")
    p.add_argument("--scale", type=float, default=1.0,
                   help="with --flows: the flows' sizes as a fraction of the long run's (fan-in"
                   f" {LONG['fan']:,}, chain {LONG['chain']:,}, DAG {LONG['dag']:,}, batch"
                   f" {LONG['batch']:,}; default 1)")
    p.add_argument("--concurrency", type=int, default=FlowOptions.concurrency,
                   help=f"with --flows: handlers per worker (default {FlowOptions.concurrency})")
    a = p.parse_args(argv)
    seed = a.seed if a.seed is not None else int(time.time()) % 100_000
    faults = tuple(f for f in a.faults.split(",") if f)
    if unknown := set(faults) - set(FAULTS):
        p.error(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    opts = Options(minutes=a.minutes, seed=seed, out=a.out, workdir=a.workdir, rate=a.rate,
                   workers=a.workers, fault_every_s=a.fault_every, filler_keys=a.filler_keys,
                   verbose=not a.quiet, faults=faults)
    # SIGTERM (a CI timeout, kill PID) unwinds like Ctrl-C: the harness stops what it started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.flows:
        sizes: dict[str, Any] = {k: max(2, int(v * a.scale)) for k, v in LONG.items()}
        rep = run_flows(FlowOptions(minutes=a.minutes, seed=seed, out=a.out, workdir=a.workdir,
                                    verbose=not a.quiet, concurrency=a.concurrency,
                                    **sizes))
        print(render_flows(rep))
    elif a.cluster:
        rep = run_cluster(ClusterOptions(minutes=a.minutes, seed=seed, out=a.out,
                                         workdir=a.workdir, verbose=not a.quiet,
                                         reshard=a.reshard,
                                         reshard_every_s=a.reshard_every))
        print(render_cluster(rep))
    else:
        rep = run(opts)
        print(render(rep))
    if not rep["ok"]:
        print(f"\nlogs, ledger and Redis directory kept in {rep.get('workdir')}", file=sys.stderr)
    return 0 if rep["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
