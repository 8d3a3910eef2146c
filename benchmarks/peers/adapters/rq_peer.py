# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""rq: one job at a time per worker process, Redis lists + job hashes, results kept 500 s.

``rq worker bench --url URL -q`` with ``--worker-class rq.worker.SimpleWorker`` (runs jobs in
the worker process) or the default ``Worker`` (forks a child per job; ``BENCH_RQ_FORK=1``).
Bulk: ``Queue.enqueue_many`` (one pipeline). Round trip: ``Job.latest_result(timeout=30)``
(blocks on the job's result stream). No visibility timeout: a job whose worker was SIGKILLed
stays in the StartedJobRegistry until a worker's maintenance marks it abandoned (failed).
"""
import os
import sys
import time

import _pre  # noqa: F401
import common
from redis import Redis
from rq import Queue

FORK = bool(os.environ.get("BENCH_RQ_FORK"))


def job(n=0):
    common.tally_start()
    s = common.sleep_s()
    if s:
        time.sleep(s)
    common.tally_done()


def stamp():
    return time.time()


class RqPeer(common.Peer):
    name = "rq-fork" if FORK else "rq"
    bulk_api = "Queue.enqueue_many"
    per_process_concurrency = False

    def setup(self):
        self.conn = Redis.from_url(self.url)
        self.q = Queue("bench", connection=self.conn)

    def enqueue_one(self, i):
        self.q.enqueue(job, i)

    def enqueue_bulk(self, n):
        for s in range(0, n, 1000):
            self.q.enqueue_many([Queue.prepare_data(job, (i,))
                                 for i in range(s, min(n, s + 1000))])

    def roundtrip(self):
        j = self.q.enqueue(stamp)
        res = j.latest_result(timeout=30)
        return res.return_value

    def worker_cmd(self, concurrency, vt):
        cmd = [os.path.join(os.path.dirname(sys.executable), "rq"), "worker", "bench",
               "--url", self.url, "-q"]
        if not FORK:
            cmd += ["--worker-class", "rq.worker.SimpleWorker"]
        return cmd

    def worker_env(self, vt):
        return {"BENCH_SYNC_FLUSH": "1"} if FORK else {}


if __name__ == "__main__":
    import rq_peer  # the tasks must live in the module, not __main__
    sys.exit(common.main(rq_peer.RqPeer))
