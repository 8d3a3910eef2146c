"""A worker process for the fault-injection tests: ``Worker.run()`` with ledger-recording handlers.

Usage: ``python worker_proc.py URL QUEUE LEDGER CONSUMER CONFIG_JSON``

CONFIG_JSON holds keyword arguments of :class:`streamq.WorkerConfig` (and ``shards``, the
queue's shard count, 1 when left out). Every execution of a
handler is recorded in LEDGER, a file outside the Redis under test, one JSON line per event,
written with a single ``write`` on an ``O_APPEND`` descriptor (so lines from several processes
never interleave):

- ``{"ev": "start", "job": ..., "attempt": ..., "pid": ..., "consumer": ...}`` when a handler
  begins, and
- ``{"ev": "end", ...}`` (same fields) when it returns normally.

Handler ``job`` reads its payload (a dict, all keys optional):

- ``sleep``: seconds to sleep on every execution;
- ``sleep_first``: seconds to sleep when this is the job's first execution according to the
  ledger (later executions, in whatever process, do not sleep).

It returns ``{"pid": ..., "consumer": ..., "attempt": ...}`` so tests can tell who wrote a result.
"""

from __future__ import annotations

import asyncio
import faulthandler
import json
import logging
import os
import signal
import sys
from typing import Any

from streamq import ALL_EVENTS, Job, QueueConfig, Registry, Worker, WorkerConfig


class Ledger:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def record(self, ev: str, job: Job, consumer: str) -> None:
        line = json.dumps({"ev": ev, "job": job.id, "attempt": job.attempt,
                           "pid": os.getpid(), "consumer": consumer}) + "\n"
        os.write(self._fd, line.encode())

    def starts(self, job_id: str) -> int:
        n = 0
        with open(self.path, encoding="utf-8") as f:
            for line in f:
                rec = json.loads(line)
                if rec["ev"] == "start" and rec["job"] == job_id:
                    n += 1
        return n


def build_registry(ledger: Ledger, consumer: str) -> Registry:
    reg = Registry()

    @reg.handler("job")
    async def job_handler(job: Job) -> dict[str, Any]:
        payload: dict[str, Any] = job.payload if isinstance(job.payload, dict) else {}
        first = "sleep_first" in payload and ledger.starts(job.id) == 0
        ledger.record("start", job, consumer)
        if first:
            await asyncio.sleep(float(payload["sleep_first"]))
        if payload.get("sleep"):
            await asyncio.sleep(float(payload["sleep"]))
        ledger.record("end", job, consumer)
        return {"pid": os.getpid(), "consumer": consumer, "attempt": job.attempt}

    return reg


def dump_state(_sig: int, _frame: object) -> None:
    """SIGUSR1: print every thread's stack and every asyncio task's stack (for hang reports)."""
    faulthandler.dump_traceback(all_threads=True)
    try:
        tasks = asyncio.all_tasks(asyncio.get_running_loop())
    except RuntimeError:
        return
    for task in tasks:
        print(f"--- task {task.get_name()}: {task.get_coro()!r}", file=sys.stderr)
        task.print_stack(file=sys.stderr)
    sys.stderr.flush()


def main(argv: list[str]) -> int:
    url, queue, ledger_path, consumer, config_json = argv
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format=f"%(asctime)s {consumer} %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGUSR1, dump_state)
    ledger = Ledger(ledger_path)
    options = json.loads(config_json)
    shards = int(options.pop("shards", 1))  # the queue's (QueueConfig), not the worker's
    config = WorkerConfig(**options)
    # every lifecycle event is recorded: the fault tests check exactly-once through them too
    Worker(url, [queue], build_registry(ledger, consumer), config,
           QueueConfig(event_kinds=ALL_EVENTS, shards=shards), consumer=consumer).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
