"""Instructions per job of a batch's first steps alone (``Running._start_jobs`` and
``Attempts.attempt``), under callgrind: ``python -m benchmarks.attempt_cg [--jobs 3000]``.

No Redis, no fetch, no settling: a Worker that is never started gets batches of 75 started
leases of no-op jobs (``noop {"n": i}`` bodies, as a claim hands them over), runs their first
steps, and its buffered outcomes are dropped. The child process runs under ``valgrind
--tool=callgrind --instr-atstart=no`` and switches instrumentation on (``callgrind_control``)
after a warm-up batch, so the figure is the measured loop only, repeatable to about +-10
instructions per job and independent of the machine's load. The lease objects the harness
makes are counted (``new_lease``, as a claim makes them in fetch.py). Prints JSON. To
measure another tree, run from a clone of it with ``PYTHONPATH`` pointing at it (``repo``
names the tree measured; a tree before 5c1a19e has no ``new_lease``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from streamq import Job, Registry, Worker

from .workloads import REPO

_BATCH = 75


def _registry() -> Registry:
    reg = Registry()

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        return None

    return reg


def _ctl(*args: str) -> None:
    """Tell callgrind (this process's) to switch instrumentation or dump."""
    subprocess.run(["callgrind_control", *args, str(os.getpid())], check=True,
                   capture_output=True)


async def _run(n: int, instrument: bool) -> None:
    from streamq._core.timeseries import SeriesRecorder
    from streamq._worker.invoke import SyncRunner
    from streamq._worker.lease import new_lease
    from streamq._worker.progress import Progress

    reg = _registry()
    w = Worker("redis://127.0.0.1:1/0", ["floor"], reg)
    attempts = w._attempts
    w._progress = attempts.progress = Progress(None, w.queue_config)  # type: ignore[arg-type]
    attempts.series = SeriesRecorder(["floor"])
    attempts.known_types = frozenset(reg.names())
    attempts.runner = SyncRunner(4, 4, logging.getLogger("attempt_cg"))
    qs = next(iter(w._qs.values()))
    datas = [b'noop {"n":%d}' % i for i in range(max(n, _BATCH))]

    def batch(first: int, k: int, prefix: str) -> None:
        for i in range(first, first + k):
            lease = new_lease(qs.keys, f"{prefix}{i}", f"1-{i}", "tok", 0.0)
            w._to_start.append((qs, lease, 1, datas[i], (0, 5, 10)))
        w._start_jobs()
        if len(qs.buf) != k:
            raise SystemExit(f"{len(qs.buf)} outcomes for {k} jobs")
        qs.buf.clear()
        w._unsettled = 0
        w._slots.free = 0

    batch(0, _BATCH, "w")  # warm-up
    if instrument:
        _ctl("-i", "on")
    done = 0
    while done < n:
        k = min(_BATCH, n - done)
        batch(done, k, "j")
        done += k
    if instrument:
        _ctl("-d", "run")
        _ctl("-i", "off")


def _total(path: Path) -> int:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.attempt_cg")
    ap.add_argument("--jobs", type=int, default=3000)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        asyncio.run(_run(args.jobs, True))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="attempt-cg-"))
    try:
        env = dict(os.environ)
        env.setdefault("PYTHONPATH", str(REPO))
        subprocess.run(["valgrind", "--tool=callgrind", "--instr-atstart=no",
                        f"--callgrind-out-file={tmp}/cg.%p", sys.executable, "-m",
                        "benchmarks.attempt_cg", "--child", "--jobs", str(args.jobs)],
                       check=True, cwd=REPO, env=env, capture_output=True)
        dumps = [p for p in tmp.glob("cg.*") if "Trigger: " in p.read_text(errors="replace")
                 and "dump run" in p.read_text(errors="replace")]
        if len(dumps) != 1:
            raise SystemExit(f"expected one dump, found {dumps}")
        total = _total(dumps[0])
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps({"jobs": args.jobs, "ir_per_job": round(total / args.jobs),
                      "repo": str(REPO)}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
