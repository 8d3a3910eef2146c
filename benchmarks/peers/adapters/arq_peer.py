# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""arq: asyncio, jobs in a sorted set, results kept (keep_result 3600 s by default).

Worker: ``arq.worker.run_worker(WorkerSettings)`` (what the ``arq`` CLI does), max_jobs = C,
defaults otherwise. Round trip: ``Job.result(poll_delay=0.001)``.

Recovery (arq 0.28.0 ``Worker.start_jobs`` / ``Worker.finish_job``): a job stays in the queue
sorted set until it finishes; starting it sets ``arq:in-progress:<id>`` (PSETEX, WATCHed so
only one worker wins) for ``in_progress_timeout_s`` = the largest job timeout + 10 s, and
every worker skips a job whose in-progress key exists. Nothing renews or releases the key
of a dead worker, so its jobs are started again by the next poll (every 0.5 s) after the
key expires: 310 s with the default job_timeout of 300 s. ``--vt 5``: ``job_timeout=5``,
the only knob (it is also the jobs' run-time limit): the key lives 15 s.
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

    def recovery_limit(self, vt):
        key_s = (vt or 300) + 10
        if key_s < self.args.cap:
            return None
        return (f"a started job is claimed by its arq:in-progress key (PSETEX job_timeout +"
                f" 10 s = {key_s:g} s, job_timeout default 300 s), which nothing releases when"
                " the worker dies: other workers skip the job until the key expires (arq"
                " 0.28.0 Worker.start_jobs, in_progress_timeout_s)")


if __name__ == "__main__":
    if sys.argv[1] == "_worker":
        logging.basicConfig(level=logging.WARNING)
        from arq.worker import run_worker
        run_worker(WorkerSettings)
    else:
        sys.exit(common.main(ArqPeer))
