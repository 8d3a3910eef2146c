"""A worker process for the group fault tests: handler ``g`` records its start and end in a
ledger file outside Redis (one JSON line per event, one ``write`` on an ``O_APPEND``
descriptor), with the group from its payload and the host's clock.

Usage: ``python group_worker.py URL QUEUE LEDGER CONSUMER CONFIG_JSON`` where CONFIG_JSON is
``{"worker": {WorkerConfig kwargs}, "queue": {QueueConfig kwargs}}``. Payload: ``{"g": group,
"s": seconds to sleep, "s1": seconds to sleep on the first attempt instead (optional)}``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time

from streamq import Job, QueueConfig, Registry, Worker, WorkerConfig


def main(argv: list[str]) -> int:
    url, queue, ledger_path, consumer, config_json = argv
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format=f"%(asctime)s {consumer} %(levelname)s %(name)s: %(message)s")
    fd = os.open(ledger_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    cfg = json.loads(config_json)
    reg = Registry()

    def write(ev: str, job: Job) -> None:
        os.write(fd, (json.dumps({"ev": ev, "job": job.id, "g": job.payload["g"],
                                  "pid": os.getpid(), "a": job.attempt,
                                  "t": time.time()}) + "\n").encode())

    @reg.handler("g")
    async def g(job: Job) -> None:
        write("s", job)
        secs = job.payload.get("s1") if job.attempt == 1 else None
        await asyncio.sleep(float(secs if secs is not None else job.payload.get("s", 0)))
        write("e", job)

    Worker(url, [queue], reg, WorkerConfig(**cfg["worker"]), QueueConfig(**cfg["queue"]),
           consumer=consumer).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
