# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""saq: asyncio, Redis lists + job hashes, results kept (job ttl 600 s after completion).

Worker: ``saq.Worker`` (what the ``saq`` CLI runs) with concurrency = C; defaults otherwise
(job timeout 10 s, sweep of stuck jobs every 60 s). ``--vt 5``: jobs enqueued with
timeout=5 and the worker sweeps every 5 s. Round trip: ``Queue.apply(poll_interval=0.001)``
(the default polls the job every 0.5 s).
"""
import asyncio
import logging
import os
import sys
import time

import _pre  # noqa: F401
import common
from saq import Queue, Worker


async def job(ctx, n=0):
    common.tally_start()
    s = common.sleep_s()
    if s:
        await asyncio.sleep(s)
    common.tally_done()


async def stamp(ctx):
    return time.time()


class SaqPeer(common.AsyncPeer):
    name = "saq"

    def setup(self):
        self.q = Queue.from_url(self.url, name="bench")
        self.run(self.q.connect())

    def close(self):
        self.run(self.q.disconnect())

    async def aenqueue_one(self, i):
        await self.q.enqueue("job", n=i)

    def enqueue_recovery(self, n):
        vt = self.args.vt

        async def go():
            for i in range(n):
                await self.q.enqueue("job", n=i, **({"timeout": int(vt)} if vt else {}))
        self.run(go())

    async def aroundtrip(self):
        return await self.q.apply("stamp", timeout=30, poll_interval=0.001)

    def worker_cmd(self, concurrency, vt):
        return [sys.executable, os.path.abspath(__file__), "_worker"]


async def _worker():
    q = Queue.from_url(os.environ["BENCH_URL"], name="bench")
    vt = os.environ.get("BENCH_VT")
    w = Worker(q, functions=[job, stamp], concurrency=int(os.environ["BENCH_CONC"]),
               **({"timers": {"sweep": int(float(vt))}} if vt else {}))
    await w.start()


if __name__ == "__main__":
    if sys.argv[1] == "_worker":
        logging.basicConfig(level=logging.WARNING)
        asyncio.run(_worker())
    else:
        sys.exit(common.main(SaqPeer))
