"""Cancel figure (issue 17): the time from ``cancel(job_id)`` of a running job to its async
handler's ``finally`` running, p50 and p99.

``python -m benchmarks.cancel_bench [--jobs 300]``. A private redis-server and one worker
process (``Worker.run()`` of this module's ``--serve`` mode) whose handler sleeps until
cancelled and records ``CLOCK_MONOTONIC`` (system-wide, so comparable across processes) when it
starts and in its ``finally``, in a file. The benchmark enqueues one job at a time, waits until
it runs, takes the time, calls ``Queue.cancel`` and waits for the ``finally`` line. Prints JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from streamq import Job, Queue, Registry, Worker, WorkerConfig
from streamq._core.server import RedisServer


def _pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p / 100 * len(s)))]


def serve(url: str, queue: str, out: str) -> None:
    fd = os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    reg = Registry()

    @reg.handler("long")
    async def long(job: Job) -> None:
        os.write(fd, f"start {job.id} {time.monotonic_ns()}\n".encode())
        try:
            await asyncio.sleep(3600)
        finally:
            os.write(fd, f"end {job.id} {time.monotonic_ns()}\n".encode())

    Worker(url, [queue], reg, WorkerConfig(concurrency=4)).run()


def _lines(path: Path) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for line in path.read_text().splitlines():
        ev, job, t = line.split()
        out[(ev, job)] = int(t)
    return out


def _wait(path: Path, key: tuple[str, str], timeout_s: float = 10.0) -> int:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        got = _lines(path).get(key)
        if got is not None:
            return got
        time.sleep(0.0005)
    raise SystemExit(f"cancel_bench: timed out waiting for {key}")


def run(jobs: int) -> dict[str, Any]:
    with RedisServer() as srv, tempfile.TemporaryDirectory() as tmp:
        marks = Path(tmp) / "marks"
        marks.touch()
        q = Queue.from_url(srv.url, "cancel-bench")
        proc = subprocess.Popen([sys.executable, "-m", "benchmarks.cancel_bench", "--serve",
                                 srv.url, q.name, str(marks)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        lat_ms: list[float] = []
        try:
            for i in range(jobs):
                job_id = f"j{i}"
                q.enqueue("long", job_id=job_id)
                _wait(marks, ("start", job_id), 30.0 if i == 0 else 10.0)
                t0 = time.monotonic_ns()
                res = q.cancel(job_id)
                assert res.code == "cancel_requested", res
                lat_ms.append((_wait(marks, ("end", job_id)) - t0) / 1e6)
        finally:
            proc.terminate()
            proc.wait(10)
            q.close()
    return {"jobs": jobs, "cancel_to_finally_ms": {
        "p50": round(_pct(lat_ms, 50), 3), "p99": round(_pct(lat_ms, 99), 3),
        "max": round(max(lat_ms), 3)}}


def main(argv: list[str]) -> int:
    if argv[:1] == ["--serve"]:
        serve(*argv[1:4])
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.cancel_bench")
    p.add_argument("--jobs", type=int, default=300)
    args = p.parse_args(argv)
    print(json.dumps(run(args.jobs), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
