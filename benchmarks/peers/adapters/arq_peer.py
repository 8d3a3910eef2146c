# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""arq: asyncio, jobs in a sorted set, results kept (keep_result 3600 s by default).

Worker: ``arq.worker.run_worker(WorkerSettings)`` (what the ``arq`` CLI does), max_jobs = C,
defaults otherwise (job_timeout 300 s; a job whose worker died is picked up again once its
in-progress key expires, job_timeout + 10 s). ``--vt 5`` sets job_timeout=5 (the only knob:
effective re-pickup after 15 s). Round trip: ``Job.result(poll_delay=0.001)``.
"""
import asyncio
import logging
import os
import sys
import time

import _pre  # noqa: F401
import common
from arq import create_pool
from arq.connections import RedisSettings


async def job(ctx, n=0):
    common.tally_start()
    s = common.sleep_s()
    if s:
        await asyncio.sleep(s)
    common.tally_done()


async def stamp(ctx):
    return time.time()


class WorkerSettings:
    functions = [job, stamp]  # noqa: RUF012 - arq's settings style
    redis_settings = RedisSettings.from_dsn(os.environ.get("BENCH_URL", "redis://x:1"))
    max_jobs = int(os.environ.get("BENCH_CONC", "100") or 100)
    if os.environ.get("BENCH_VT"):
        job_timeout = float(os.environ["BENCH_VT"])


class ArqPeer(common.AsyncPeer):
    name = "arq"

    def setup(self):
        self.pool = self.run(create_pool(RedisSettings.from_dsn(self.url)))

    def close(self):
        self.run(self.pool.aclose())

    async def aenqueue_one(self, i):
        await self.pool.enqueue_job("job", i)

    async def aroundtrip(self):
        j = await self.pool.enqueue_job("stamp")
        return await j.result(timeout=30, poll_delay=0.001)

    def worker_cmd(self, concurrency, vt):
        return [sys.executable, os.path.abspath(__file__), "_worker"]


if __name__ == "__main__":
    if sys.argv[1] == "_worker":
        logging.basicConfig(level=logging.WARNING)
        from arq.worker import run_worker
        run_worker(WorkerSettings)
    else:
        sys.exit(common.main(ArqPeer))
