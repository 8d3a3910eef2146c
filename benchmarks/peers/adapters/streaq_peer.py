# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""streaq: asyncio on Redis Streams (consumer groups), results kept 5 min (task ttl).

Worker: ``streaq.Worker(concurrency=C)``, run like ``streaq run`` does (``run_sync``);
tasks registered with ``silent=True`` (no log line per task), defaults otherwise
(idle_timeout 60 s: a task whose worker stopped renewing is reclaimed after it).
``--vt 5``: idle_timeout=5. Bulk: ``Worker.enqueue_many``. Round trip: ``Task.result()``.
"""
import asyncio
import os
import sys
import time

import _pre  # noqa: F401
import common
from streaq import Worker

_vt = os.environ.get("BENCH_VT")
worker = Worker(redis_url=os.environ.get("BENCH_URL", "redis://127.0.0.1:1"),
                concurrency=int(os.environ.get("BENCH_CONC", "100") or 100),
                queue_name="bench", **({"idle_timeout": float(_vt)} if _vt else {}))


@worker.task(silent=True)
async def job(n: int = 0) -> None:
    common.tally_start()
    s = common.sleep_s()
    if s:
        await asyncio.sleep(s)
    common.tally_done()


@worker.task(silent=True)
async def stamp() -> float:
    return time.time()


class StreaqPeer(common.AsyncPeer):
    name = "streaq"
    bulk_api = "Worker.enqueue_many"

    def setup(self):
        global worker
        worker = Worker(redis_url=self.url, queue_name="bench")
        self.w = worker
        self.job = self.w.task(silent=True)(job.fn)
        self.stamp = self.w.task(silent=True)(stamp.fn)
        self.cm = self.w.__asynccontextmanager__()
        self.run(self.cm.__aenter__())

    def close(self):
        self.run(self.cm.__aexit__(None, None, None))

    async def aenqueue_one(self, i):
        await self.job.enqueue(i)

    def enqueue_bulk(self, n):
        self.run(self.w.enqueue_many([self.job.enqueue(i) for i in range(n)]))

    async def aroundtrip(self):
        t = await self.stamp.enqueue()
        res = await t.result(timeout=30)
        return res.result

    def worker_cmd(self, concurrency, vt):
        return [sys.executable, os.path.abspath(__file__), "_worker"]


if __name__ == "__main__":
    if sys.argv[1] == "_worker":
        worker.run_sync()
    else:
        import streaq_peer  # the tasks must live in the module, not __main__
        sys.exit(common.main(streaq_peer.StreaqPeer))
