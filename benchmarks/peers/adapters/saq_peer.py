# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""saq: asyncio, Redis lists + job hashes, results kept (job ttl 600 s after completion).

Worker: ``saq.Worker`` (what the ``saq`` CLI runs) with concurrency = C; defaults otherwise
(job timeout 10 s, retries 1, sweep of stuck jobs every 60 s). Round trip:
``Queue.apply(poll_interval=0.001)`` (the default polls the job every 0.5 s).

Recovery (saq 0.26.4 ``RedisQueue.sweep`` / ``Job.stuck`` / ``Job.retryable``): every
``timers["sweep"]`` seconds (default 60, also once at worker start; one sweep per queue per
period, a Redis lock) a worker looks at every job in the active list; a job still marked
active but running longer than ``Job.timeout`` (or not touched for ``Job.heartbeat``) is
"stuck": the sweep aborts it, waits up to 5 s for the abort to be acknowledged (a dead worker
never does), then re-queues it only if ``retries > attempts``. The default ``retries=1``
means a dead worker's jobs end ABORTED, never re-run. ``--vt 5``: jobs enqueued with
``timeout=5, retries=2`` and the worker sweeps every 5 s.

The sweep also treats a job whose stored status is not "active" as stuck. A worker moves a
job to the active list (BLMOVE) *before* it writes status "active", so a sweep that lands
in that window aborts and re-queues a job that is running: it runs twice (tobymao/saq#277,
open). The worker here records what each sweep aborted (``bench:saq:swept``, status and
attempts as the sweep saw them) so a failed drain can say so; this does not change saq.
"""
import asyncio
import json
import logging
import os
import sys
import time

import _pre  # noqa: F401
import common
import redis
import redis.asyncio
from saq import Queue, Worker

SWEPT_KEY = "bench:saq:swept"


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
        opts = {"timeout": int(vt), "retries": 2} if vt else {}

        async def go():
            for i in range(n):
                await self.q.enqueue("job", n=i, **opts)
        self.run(go())

    async def aroundtrip(self):
        return await self.q.apply("stamp", timeout=30, poll_interval=0.001)

    def worker_cmd(self, concurrency, vt):
        return [sys.executable, os.path.abspath(__file__), "_worker"]

    def recovery_limit(self, vt):
        if not vt:
            return ("no recovery with saq's defaults: the sweep (every 60 s) aborts a dead"
                    " worker's jobs once they run past Job.timeout (10 s) and re-queues them"
                    " only if retries > attempts; Job.retries defaults to 1, so they end"
                    " ABORTED (saq 0.26.4 RedisQueue.sweep, Job.retryable)")
        return ("recovers one job per ~5 s: the sweep handles stuck jobs one after the other"
                " and waits up to 5 s for each abort to be acknowledged (RedisQueue.sweep"
                " abort=5.0, not settable through Worker), which a dead worker never does:"
                " 100 jobs take ~500 s after Job.timeout (saq 0.26.4)")

    def explain_error(self, workload, exc):
        if workload not in ("drain", "io"):
            return None
        swept = redis.Redis.from_url(self.url).hgetall(SWEPT_KEY)
        if not swept:
            return None
        seen = [json.loads(v) for v in swept.values()]
        queued = sum(1 for s in seen if s["status"] == "queued")
        effect = ("so it ran again" if "more than once" in str(exc)
                  else "re-queuing it (runs twice) or leaving it aborted")
        return (f"saq's sweep aborted {len(swept)} job(s) that a worker was running"
                f" ({queued} still marked 'queued': moved to the active list by BLMOVE, not"
                " yet marked active); the sweep runs at worker start and every 60 s"
                " (timers['sweep']) and takes any non-active job in the active list for"
                f" stuck, {effect} (saq 0.26.4 RedisQueue.sweep; tobymao/saq#277)")


async def _worker():
    q = Queue.from_url(os.environ["BENCH_URL"], name="bench")
    bench = redis.asyncio.Redis.from_url(os.environ["BENCH_URL"])
    abort = q.abort

    async def recording_abort(job, error, ttl=5):
        # only the sweep calls Queue.abort in a worker: record what it saw, then abort
        if error == q.swept_error_message:
            await bench.hset(SWEPT_KEY, job.key, json.dumps(
                {"status": str(job.status.value), "attempts": job.attempts}))
        await abort(job, error, ttl)

    q.abort = recording_abort
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
