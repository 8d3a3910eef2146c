"""A worker process of the chaos run: ``Worker.run()`` with handlers that record every execution
in a ledger file outside the Redis under test.

Usage: ``python worker.py URL QUEUE LEDGER NAME CONFIG_JSON`` where CONFIG_JSON is
``{"worker": {WorkerConfig kwargs}, "events_maxlen": N, "grace_file": PATH}`` (and
``"queue": {QueueConfig kwargs}`` for the cluster run's sharded, grouped queue).

SIGTERM (or SIGINT) stops the worker gracefully, as ``Worker.run()`` does, with the grace
period the harness wrote into ``grace_file`` just before the signal (a deploy's short or long
one; the configured one when the file is absent); a second signal hurries the stop.

The ledger holds one JSON line per event, each written with a single ``write`` on an
``O_APPEND`` descriptor (lines of several processes and threads never interleave, and a SIGKILL
cannot leave half a line):

- ``{"ev": "boot", "w", "pid", "t"}`` when the process starts;
- ``{"ev": "s", "job", "a", "w", "pid", "x", "t"}`` when a handler begins: ``a`` is the attempt,
  ``x`` an execution id unique across all processes (``name/pid/n``);
- ``{"ev": "e", "job", "a", "x", "o", "r", "t"}`` when it ends: outcome ``o`` is ``ok`` (``r``
  is the value returned, which the job record must then hold), ``retry`` or ``fail``;
- ``{"ev": "stall", "w", "pid", "t0", "t1"}`` when a watchdog thread overslept by more than
  half a second (the process was frozen by SIGSTOP or starved of CPU): evidence for a lapse.

Every ``t`` is the host's real clock (``clock_gettime(CLOCK_REALTIME)``), even when the harness
runs this process under a stepped ``time.time()`` (``fakeclock.py``): the ledger and the
harness's fault log share one clock.

Job types (``chaos.<kind>``): ``instant`` and ``delayed`` return at once; ``retry`` raises
``Retry`` while ``attempt <= payload["fails"]``; ``cron`` (fired by the schedulers' cron
entries, ``cron_entries.py``) returns at once; ``slow`` sleeps ``payload["s"]`` seconds on the
event loop, ``slow_sync`` in the thread pool; ``fail`` raises ``Fail`` (its reason carries the
execution id). Every value returned is ``{"x", "w", "a"}``: it identifies the execution.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import attrs

from streamq import ALL_EVENTS, Fail, Job, QueueConfig, Registry, Retry, Worker, WorkerConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "procs"))
from worker_proc import dump_state  # tests/procs: SIGUSR1 dumps every stack

STALL_S = 0.5


def wall() -> float:
    """The host's real clock, whatever ``time.time`` says in this process."""
    return time.clock_gettime(time.CLOCK_REALTIME)


class Ledger:
    def __init__(self, path: str, worker: str) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.worker = worker
        self.pid = os.getpid()
        self._seq = itertools.count(1)
        self.write({"ev": "boot", "w": worker, "pid": self.pid, "t": wall()})

    def write(self, rec: dict[str, Any]) -> None:
        os.write(self._fd, (json.dumps(rec, separators=(",", ":")) + "\n").encode())

    def begin(self, job: Job) -> str:
        x = f"{self.worker}/{self.pid}/{next(self._seq)}"
        self.write({"ev": "s", "job": job.id, "a": job.attempt, "w": self.worker,
                    "pid": self.pid, "x": x, "t": wall()})
        return x

    def end(self, job: Job, x: str, outcome: str, result: Any = None) -> None:
        self.write({"ev": "e", "job": job.id, "a": job.attempt, "x": x, "o": outcome,
                    "r": result, "t": wall()})

    def watch(self) -> None:
        """Record every time this process did not run for more than STALL_S (a thread)."""
        while True:
            t0 = time.monotonic()
            time.sleep(0.1)
            late = time.monotonic() - t0 - 0.1
            if late > STALL_S:
                now = wall()
                self.write({"ev": "stall", "w": self.worker, "pid": self.pid, "t0": now - late,
                            "t1": now})


def build_registry(ledger: Ledger) -> Registry:
    reg = Registry()

    def done(job: Job, x: str) -> dict[str, Any]:
        result = {"x": x, "w": ledger.worker, "a": job.attempt}
        ledger.end(job, x, "ok", result)
        return result

    async def instant(job: Job) -> dict[str, Any]:
        return done(job, ledger.begin(job))

    reg.register("chaos.instant", instant)
    reg.register("chaos.delayed", instant)
    reg.register("chaos.cron", instant)

    @reg.handler("chaos.retry")
    async def retry(job: Job) -> dict[str, Any]:
        x = ledger.begin(job)
        if job.attempt <= int(job.payload["fails"]):
            ledger.end(job, x, "retry")
            raise Retry(f"attempt {job.attempt} fails on purpose [{x}]",
                        delay_s=float(job.payload["d"]))
        return done(job, x)

    @reg.handler("chaos.slow")
    async def slow(job: Job) -> dict[str, Any]:
        x = ledger.begin(job)
        await asyncio.sleep(float(job.payload["s"]))
        return done(job, x)

    @reg.handler("chaos.slow_sync")
    def slow_sync(job: Job) -> dict[str, Any]:
        x = ledger.begin(job)
        time.sleep(float(job.payload["s"]))
        return done(job, x)

    @reg.handler("chaos.fail")
    async def fail(job: Job) -> None:
        x = ledger.begin(job)
        ledger.end(job, x, "fail")
        raise Fail(f"always fails [{x}]")

    return reg


def grace(worker: Worker, grace_file: str | None) -> None:
    """Give the stop the grace period the harness chose for it (the file holds seconds)."""
    if not grace_file:
        return
    with contextlib.suppress(OSError, ValueError):
        s = float(Path(grace_file).read_text().strip())
        worker.config = attrs.evolve(worker.config, grace_period_s=s)


def written(path: str, n: int) -> None:
    """Write ``n`` into ``path`` at once (a rename: a reader never sees half of it)."""
    tmp = Path(path + ".tmp")
    tmp.write_text(f"{n}\n")
    tmp.replace(path)


async def serve(worker: Worker, grace_file: str | None, ready_file: str | None = None) -> None:
    """``Worker.run()``'s loop, with the grace period read at the signal; ``ready_file``
    gets a 0 once the worker is up."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        if stop.is_set():
            worker.hurry()
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    await worker.start()
    if ready_file:  # up, signals handled: the harness may stop it gracefully now
        written(ready_file, 0)
    try:
        await stop.wait()
    finally:
        grace(worker, grace_file)
        await worker.stop()


def setup(argv: list[str]) -> tuple[str, str, str, dict[str, Any], Ledger]:
    """Logging, the stack dump on SIGUSR1, the ledger and its watchdog: (url, queue, name,
    config, ledger)."""
    url, queue, ledger_path, name, config_json = argv
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s {name} %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGUSR1, dump_state)
    config = json.loads(config_json)
    ledger = Ledger(ledger_path, name)
    threading.Thread(target=ledger.watch, name="chaos-watchdog", daemon=True).start()
    return url, queue, name, config, ledger


def make_worker(url: str, queue: str, name: str, config: dict[str, Any],
                ledger: Ledger) -> Worker:
    qcfg = QueueConfig(**{"events_maxlen": int(config["events_maxlen"]),
                          "event_kinds": ALL_EVENTS, **config.get("queue", {})})
    return Worker(url, [queue], build_registry(ledger), WorkerConfig(**config["worker"]), qcfg,
                  consumer=name)


def main(argv: list[str]) -> int:
    url, queue, name, config, ledger = setup(argv)
    asyncio.run(serve(make_worker(url, queue, name, config, ledger), config.get("grace_file"),
                      config.get("reload_file")))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
