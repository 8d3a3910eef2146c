"""``streamq demo``: a self-contained tour in under a minute.

Starts a private redis-server when no URL is given, enqueues a mix of jobs (instant, delayed,
failing-then-succeeding, always-failing, slow), runs three worker processes and a scheduler,
SIGKILLs one worker in the middle of its jobs to show recovery, shows live progress, and ends
with a summary checked against what it enqueued.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from typing import Any

from .._core.config import RetryPolicy
from .._core.errors import Fail, Retry
from .._core.model import Job
from .._core.server import RedisServer
from .._producer.queue import AsyncQueue
from .._worker.registry import Registry
from ..admin import AsyncAdmin
from . import demo_procs

registry = Registry()


@registry.handler("demo.instant")
async def instant(job: Job) -> int:
    return int(job.payload["n"]) * 2


@registry.handler("demo.flaky", max_attempts=4, retry=RetryPolicy(base_s=0.2, cap_s=0.5))
async def flaky(job: Job) -> str:
    if job.attempt < 2:
        raise Retry("transient failure, trying again")
    return f"ok on attempt {job.attempt}"


@registry.handler("demo.broken")
async def broken(job: Job) -> None:
    raise Fail("this job can never succeed")


@registry.handler("demo.slow")
def slow(job: Job) -> str:
    time.sleep(1.5)  # sync handlers run in a thread pool
    return "slow done"


VISIBILITY_S = 3.0


def _spawn(url: str, *args: str) -> subprocess.Popen[bytes]:
    return demo_procs.spawn(["--log-level", "ERROR", *args, "--url", url],
                            stderr=subprocess.PIPE)


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = int(width * done / max(total, 1))
    return "#" * filled + "." * (width - filled)


async def _run(url: str, n: int, stop: asyncio.Event) -> int:
    qname = f"demo-{random.randrange(1 << 24):06x}"
    q = AsyncQueue.from_url(url, qname)
    admin = AsyncAdmin.from_url(url)
    counts = {"instant": n, "delayed": n // 10, "flaky": n // 20, "broken": n // 50,
              "slow": 12}
    jobs: list[dict[str, Any]] = [{"type": "demo.instant", "payload": {"n": i}}
                                  for i in range(counts["instant"])]
    jobs += [{"type": "demo.instant", "payload": {"n": i}, "delay": 2 + i % 5}
             for i in range(counts["delayed"])]
    jobs += [{"type": "demo.slow"} for _ in range(counts["slow"])]
    jobs += [{"type": "demo.flaky"} for _ in range(counts["flaky"])]
    jobs += [{"type": "demo.broken"} for _ in range(counts["broken"])]
    total = len(jobs)
    expect_dead = counts["broken"]
    print(f"queue {qname}: enqueueing {total} jobs "
          + ", ".join(f"{v} {k}" for k, v in counts.items()))
    t0 = time.perf_counter()
    await q.enqueue_many(jobs)
    print(f"  enqueued in {time.perf_counter() - t0:.2f}s")
    workers = [_spawn(url, "worker", "streamq.cli.demo:registry", "--queue", qname,
                      "--concurrency", "8", "--visibility-timeout", str(VISIBILITY_S),
                      "--no-promote")
               for _ in range(3)]
    scheduler = _spawn(url, "scheduler", "--queue", qname, "--visibility-timeout",
                       str(VISIBILITY_S))
    print(f"started 3 worker processes (pids {', '.join(str(w.pid) for w in workers)})"
          " and a scheduler")
    killed = False
    start = time.perf_counter()
    try:
        while True:
            await asyncio.sleep(0.25)
            if stop.is_set():  # SIGTERM (its cancel can be absorbed inside a Redis call)
                raise asyncio.CancelledError
            s = await admin.stats(qname)
            c = s.counters
            done = c.get("completed", 0) + c.get("failed", 0)
            line = (f"\r  [{_bar(done, total)}] {done}/{total}  completed {c.get('completed', 0)}"
                    f"  dead {c.get('failed', 0)}  retried {c.get('retried', 0)}"
                    f"  reclaimed {c.get('reclaimed', 0)}  scheduled {s.scheduled}"
                    f"  in flight {s.pending}  ")
            print(line, end="", flush=True)
            if not killed and c.get("started", 0) > total // 2:
                victims = [p for p in (await admin.pending(qname, count=100)).items
                           if p.type == "demo.slow"]
                if victims:
                    owner = victims[0].consumer
                    pid = int(owner.split(":")[1])
                    os.kill(pid, signal.SIGKILL)
                    killed = True
                    print(f"\n  SIGKILLed worker {pid} while it ran a slow job; its jobs come"
                          f" back after the {VISIBILITY_S:g}s visibility timeout")
            if done >= total or time.perf_counter() - start > 50:
                break
            failed = [p for p in [*workers, scheduler] if p.poll() not in (None, -9)]
            if failed:
                err = (failed[0].stderr.read() if failed[0].stderr else b"").decode()
                print(f"\n  a demo process exited early:\n{err}")
                break
    finally:  # also when a signal cancelled the demo: no worker is left behind
        demo_procs.stop([*workers, scheduler], grace_s=15)
    print()
    s = await admin.stats(qname)
    c = s.counters
    await q.close()
    await admin.close()
    print(f"summary after {time.perf_counter() - start:.1f}s: {c.get('completed', 0)} completed,"
          f" {c.get('failed', 0)} dead-lettered, {c.get('retried', 0)} retries,"
          f" {c.get('reclaimed', 0)} reclaimed from the killed worker")
    ok = c.get("completed", 0) == total - expect_dead and c.get("failed", 0) == expect_dead
    print(f"expected {total - expect_dead} completed and {expect_dead} dead: "
          + ("the numbers match, nothing was lost" if ok else "MISMATCH"))
    print(f"\nnext: the dashboard over a live queue, with a panel to add jobs, workers, failures"
          f" and hangs:\n  {_command()} demo --web\nthen open {WEB_URL}")
    return 0 if ok else 1


WEB_URL = "http://127.0.0.1:8080/queue?q=demo&tab=charts"
"""Where ``streamq demo --web`` serves the demo queue with its default --host and --port."""


def _command() -> str:
    """How this process was started (`.venv/bin/streamq` under `make demo`), else `streamq`."""
    argv0 = sys.argv[0] if sys.argv else ""
    return argv0 if os.path.basename(argv0) == "streamq" else "streamq"


async def _cancelled_on_sigterm(url: str, n: int) -> int:
    """The tour, cancelled by SIGTERM as asyncio.run cancels it on Ctrl-C."""
    stop = asyncio.Event()
    task = asyncio.ensure_future(_run(url, n, stop))
    loop = asyncio.get_running_loop()
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm() -> None:
        stop.set()
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    try:
        return await task
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, previous)


def _main(url: str, n: int) -> int:
    try:
        return asyncio.run(_cancelled_on_sigterm(url, n))
    except asyncio.CancelledError:  # SIGTERM: the workers and scheduler were stopped
        print("\nstopped")
        return 143


def run_demo(url: str | None, n: int = 2000) -> int:
    if url:
        return _main(url, n)
    try:
        server = RedisServer()
    except RuntimeError as exc:
        raise SystemExit(f"streamq demo: no --url given and {exc}") from None
    with demo_procs.interrupt_on_sigterm(), server:  # SIGTERM outside the tour: closed too
        print(f"started a private redis-server at {server.url} (stopped when the demo ends)")
        return _main(server.url, n)
