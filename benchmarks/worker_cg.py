"""Worker instructions per drained job, under callgrind:
``python -m benchmarks.worker_cg [--jobs 24000] [--base 4000] [--repeat 1]``.

A private redis-server (``streamq._core.server.RedisServer``) gets N no-op jobs
(``Queue.enqueue_many``); one worker process (``benchmarks.worker_proc --mode drain``,
concurrency 100) drains them under ``valgrind --tool=callgrind``, and the total instructions of
that process are read from its out file (``summary:``/``totals:``). The same is done for a
drain of ``--base`` jobs, and the difference per job, ``(I(jobs) - I(base)) / (jobs - base)``,
is printed as ``worker_ir_per_job``: the worker's steady instructions per drained job, with its
start, imports and stop taken out. The whole process is counted, so the drain's periodic
work (lease renewal, heartbeats, the completion poll) adds with wall time, which callgrind
and a busy machine stretch: 101-105k per job at 9d8020c under load 6-14, where a quiet
reference machine read 91.8k. Compare two trees only from runs made at the same time. The
completion poll is slowed to 0.5 s (its 2 ms default added about 4k per job at load 6).

Prints one JSON object. The worker runs the tree this module was imported from (its directory
is the worker's working directory and ``PYTHONPATH``): to measure a base commit, run from a
clone of it, ``cd /tmp/base && PYTHONPATH=/tmp/base /work/wt/.venv/bin/python -m
benchmarks.worker_cg`` (``repo`` in the output names the tree measured).
``--keep DIR`` copies the out files (for ``callgrind_annotate``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from streamq import Queue
from streamq._core.server import RedisServer

from .workloads import REPO, _jobs, _last_json, worker_cmd


def _env() -> dict[str, str]:
    """The worker's environment: this tree alone on its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO)
    return env


def _total(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def drain_ir(n: int, keep: Path | None = None) -> dict[str, Any]:
    """Instructions of one worker process that drains n no-op jobs (all its threads)."""
    tmp = Path(tempfile.mkdtemp(prefix="worker-cg-"))
    out_file = tmp / "cg.out"
    try:
        with RedisServer() as srv:
            with Queue.from_url(srv.url, "floor") as q:
                q.enqueue_many(_jobs(n))
            cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out_file}",
                   *worker_cmd(srv.url, "floor", "drain", "--jobs", str(n), "--concurrency",
                               "100", "--timeout", "3000", "--poll", "0.5")]
            proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=_env(),
                                  timeout=3600, check=False)
            if proc.returncode != 0:
                raise SystemExit(f"drain worker failed: {proc.stderr[-2000:]}")
            summary = _last_json(proc.stdout)
        if keep is not None:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.copy(out_file, keep / f"worker-{n}.callgrind")
        return {"jobs": n, "ir": _total(out_file), "completed": summary["completed"]}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.worker_cg")
    ap.add_argument("--jobs", type=int, default=24_000)
    ap.add_argument("--base", type=int, default=4_000)
    ap.add_argument("--repeat", type=int, default=1, help="pairs of drains (median)")
    ap.add_argument("--keep", type=Path, default=None, help="copy the out files here")
    args = ap.parse_args(argv)
    if args.jobs <= args.base:
        raise SystemExit("--jobs must be more than --base")
    pairs = []
    for _ in range(args.repeat):
        big = drain_ir(args.jobs, args.keep)
        small = drain_ir(args.base, args.keep)
        pairs.append({"ir_jobs": big["ir"], "ir_base": small["ir"],
                      "per_job": (big["ir"] - small["ir"]) / (args.jobs - args.base)})
    res = {"jobs": args.jobs, "base": args.base, "pairs": pairs,
           "worker_ir_per_job": statistics.median(p["per_job"] for p in pairs),
           "repo": str(REPO),
           "loadavg": Path("/proc/loadavg").read_text().split()[:3]}
    print(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
