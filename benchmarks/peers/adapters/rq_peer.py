# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""rq: one job at a time per worker process, Redis lists + job hashes, results kept 500 s.

``rq worker bench --url URL -q`` with ``--worker-class rq.worker.SimpleWorker`` (runs jobs in
the worker process) or the default ``Worker`` (forks a child per job; ``BENCH_RQ_FORK=1``).
Bulk: ``Queue.enqueue_many`` (one pipeline). Round trip: ``Job.latest_result(timeout=30)``
(blocks on the job's result stream).

Recovery (rq 3.0.0): no visibility timeout or redelivery setting (``--vt`` is ignored). A
worker holds one job at a time, so a SIGKILLed worker leaves one job behind (the other 99 are
still queued: 99/100). That job stays in the queue's StartedJobRegistry under a score of its
start + heartbeat TTL (``SimpleWorker.get_heartbeat_ttl``: job timeout 180 s + 60 s; the
forking ``Worker``: min(timeout, job_monitoring_interval 30 s) + 60 s after its last
heartbeat). Only a worker's maintenance looks at expired entries (``Worker.clean_registries``:
at worker start, then every ``maintenance_interval``, 600 s), and
``StartedJobRegistry.cleanup`` re-enqueues an abandoned job only if it has ``retries_left``
(enqueued with ``Retry``); otherwise it records ``AbandonedJobError`` and moves it to the
FailedJobRegistry. The jobs here are enqueued without ``Retry`` (rq's default).

cpu workload (mode 'procs'): K separate ``rq worker`` processes (rq has no multi-process
option in one command; the fork per job of ``BENCH_RQ_FORK=1`` is its isolation).
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

    def recovery_limit(self, vt):
        ttl = ("90 s after the work horse's last heartbeat" if FORK
               else "240 s: job timeout 180 s + 60 s")
        return ("rq has no visibility timeout and never redelivers by itself: the killed"
                " worker's one job stays in the StartedJobRegistry until its entry expires"
                f" ({ttl}) and a worker's maintenance (at start, then every 600 s) runs"
                " StartedJobRegistry.cleanup, which re-enqueues it only if it was enqueued"
                " with Retry, else fails it with AbandonedJobError (rq 3.0.0). The other 99"
                " were still queued: a worker holds one job at a time.")


if __name__ == "__main__":
    import rq_peer  # the tasks must live in the module, not __main__
    sys.exit(common.main(rq_peer.RqPeer))
