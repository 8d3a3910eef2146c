# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""celery with the Redis broker and the Redis result backend.

No-op drain: ``celery -A celery_peer worker --pool solo`` (one process, no pool IPC;
prefork would add child processes); I/O, latency and recovery: ``--pool threads -c 100``.
``--loglevel WARNING`` (no line per task), ``worker_prefetch_multiplier`` 4 (default).
'job' ignores its result (``ignore_result=True``, as the docs recommend when it is not
used); 'stamp' keeps it (round trip: ``AsyncResult.get()``, pub/sub on the Redis backend).
Default acks: early (on receipt), so a SIGKILLed worker's jobs are lost; ``--vt 5``:
``task_acks_late=True`` and ``visibility_timeout=5`` in broker_transport_options.
No bulk enqueue API.
"""
import os
import sys
import time

import _pre  # noqa: F401
import common
from celery import Celery

_url = os.environ.get("BENCH_URL") or (sys.argv[sys.argv.index("--url") + 1]
                                       if "--url" in sys.argv else "redis://127.0.0.1:1")
app = Celery("bench", broker=_url, backend=_url)
app.conf.task_default_queue = "bench"
app.conf.broker_connection_retry_on_startup = True
if os.environ.get("BENCH_VT"):
    app.conf.task_acks_late = True
    app.conf.broker_transport_options = {"visibility_timeout": float(os.environ["BENCH_VT"])}


@app.task(ignore_result=True)
def job(n=0):
    common.tally_start()
    s = common.sleep_s()
    if s:
        time.sleep(s)
    common.tally_done()


@app.task
def stamp():
    return time.time()


class CeleryPeer(common.Peer):
    name = "celery"

    def enqueue_one(self, i):
        job.delay(i)

    def roundtrip(self):
        return stamp.delay().get(timeout=30)

    def worker_cmd(self, concurrency, vt):
        cmd = [os.path.join(os.path.dirname(sys.executable), "celery"), "-A", "celery_peer",
               "worker", "--loglevel", "WARNING", "-Q", "bench", "--without-gossip",
               "--without-mingle", "--without-heartbeat"]
        if self.kind == "drain":
            return [*cmd, "--pool", "solo"]
        return [*cmd, "--pool", "threads", "-c", str(concurrency)]


if __name__ == "__main__":
    import celery_peer  # the tasks must live in the module, not __main__
    sys.exit(common.main(celery_peer.CeleryPeer))
