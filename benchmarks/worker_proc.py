"""One benchmark worker process: ``python -m benchmarks.worker_proc --mode drain|serve ...``.

``drain``: start a Worker on a queue that already holds ``--jobs`` no-op jobs, exit once this
worker has completed all of them, and print one JSON line with the worker's own CPU time
(``time.process_time()``, all threads; ``cpu_start_s``: the part spent before the first
handler started) and the wall time from the first handler start to the
last completion.

``serve``: start a Worker, print ``{"ready": true}``, run until stdin closes (or SIGTERM), then
print the same JSON summary. Handlers: ``noop`` returns None; ``stamp`` returns ``time.time()``
at handler start (stored as the job's result, read back by the latency workload).

``raw``: the latency ceiling. A plain redis-py consumer blocked in XREADGROUP on ``--queue``
(a stream key here); each entry carries the producer's ``time.time()`` in field ``t``. Prints
``{"ready": true}``, then on stdin close the list of receive - send latencies in ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from streamq import Job, QueueConfig, Registry, Worker, WorkerConfig

_first_start: float | None = None
_first_cpu: float | None = None


def build_registry() -> Registry:
    reg = Registry()

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        global _first_start, _first_cpu
        if _first_start is None:
            _first_start = time.perf_counter()
            _first_cpu = time.process_time()

    @reg.handler("stamp")
    async def stamp(job: Job) -> float:
        return time.time()

    return reg


registry = build_registry()
"""Also usable with the CLI: ``streamq worker benchmarks.worker_proc:registry ...``."""


def _summary(worker: Worker, cpu0: float, wall_end: float | None, cpu_end: float,
             timed_out: bool) -> dict[str, Any]:
    s = worker.stats
    wall = (wall_end - _first_start) if (wall_end is not None and _first_start) else None
    return {
        "completed": s.completed, "started": s.started, "failed": s.failed,
        "retried": s.retried, "lost": s.lost, "released": s.released,
        "cpu_s": cpu_end - cpu0, "wall_s": wall, "timed_out": timed_out,
        "cpu_start_s": (_first_cpu - cpu0) if _first_cpu is not None else None,
    }


async def _drain(worker: Worker, jobs: int, timeout_s: float, poll_s: float) -> dict[str, Any]:
    cpu0 = time.process_time()
    deadline = time.perf_counter() + timeout_s
    timed_out = False
    async with worker:
        while worker.stats.completed < jobs:
            if time.perf_counter() > deadline:
                timed_out = True
                break
            await asyncio.sleep(poll_s)
        wall_end = time.perf_counter()
        cpu_end = time.process_time()
    return _summary(worker, cpu0, None if timed_out else wall_end, cpu_end, timed_out)


async def _serve(worker: Worker) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)

    def wait_stdin() -> None:  # the parent closes our stdin (or dies): stop
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_stdin, daemon=True).start()
    cpu0 = time.process_time()
    async with worker:
        print(json.dumps({"ready": True}), flush=True)
        await stop.wait()
        cpu_end = time.process_time()
        wall_end = time.perf_counter()
    return _summary(worker, cpu0, wall_end, cpu_end, False)


def _raw(url: str, stream: str) -> dict[str, Any]:
    import redis

    client = redis.Redis.from_url(url, protocol=2)
    client.xgroup_create(stream, "raw", id="0", mkstream=True)  # a fresh key: no BUSYGROUP
    stop = threading.Event()

    def wait_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=wait_stdin, daemon=True).start()
    publish = client.register_script("return redis.call('PUBLISH', KEYS[1], ARGV[1])")
    print(json.dumps({"ready": True}), flush=True)
    latencies: list[float] = []
    while not stop.is_set():
        reply: Any = client.xreadgroup("raw", "c", {stream: ">"}, count=100, block=100)
        now = time.time()
        if not reply:
            continue
        entries = reply[0][1]
        latencies += [(now - float(fields[b"t"])) * 1000 for _eid, fields in entries
                      if b"t" in fields]
        for eid, fields in entries:  # a round trip: answer on the entry's channel, by script
            if b"r" in fields:
                publish(keys=[fields[b"r"]], args=[eid])
        ids = [eid for eid, _fields in entries]
        client.xack(stream, "raw", *ids)
        client.xdel(stream, *ids)
    client.close()
    return {"latencies_ms": latencies}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.worker_proc")
    p.add_argument("--url", required=True)
    p.add_argument("--queue", required=True)
    p.add_argument("--mode", choices=("drain", "serve", "raw"), required=True)
    p.add_argument("--jobs", type=int, default=0, help="drain: exit after this many completions")
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--fetch-batch", type=int, default=None)
    p.add_argument("--group-concurrency", type=int, default=None,
                   help="QueueConfig.group_concurrency (groups_bench)")
    p.add_argument("--timeout", type=float, default=300.0, help="drain: give up after (s)")
    p.add_argument("--poll", type=float, default=0.002, help="drain: completion poll (s)")
    args = p.parse_args(argv)
    if args.mode == "raw":
        print(json.dumps(_raw(args.url, args.queue)), flush=True)
        return 0
    cfg = WorkerConfig(concurrency=args.concurrency)
    if args.fetch_batch is not None:
        cfg = WorkerConfig(concurrency=args.concurrency, fetch_batch=args.fetch_batch)
    qcfg = QueueConfig(group_concurrency=args.group_concurrency or 1)
    worker = Worker(args.url, [args.queue], registry, cfg, queue_config=qcfg)
    if args.mode == "drain":
        out = asyncio.run(_drain(worker, args.jobs, args.timeout, args.poll))
        ok = out["completed"] == args.jobs and not out["timed_out"]
    else:
        out = asyncio.run(_serve(worker))
        ok = True
    print(json.dumps(out), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
