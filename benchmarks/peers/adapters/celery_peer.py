# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""celery with the Redis broker and the Redis result backend.

No-op drain: ``celery -A celery_peer worker --pool solo`` (one process, no pool IPC;
prefork would add child processes); I/O, latency and recovery: ``--pool threads -c 100``.
``--loglevel WARNING`` (no line per task), ``worker_prefetch_multiplier`` 4 (default).
'job' ignores its result (``ignore_result=True``, as the docs recommend when it is not
used); 'stamp' keeps it (round trip: ``AsyncResult.get()``, pub/sub on the Redis backend).
No bulk enqueue API.

flow workload (``python -m benchmarks.peers --flows``): ``chord(group(fnoop.s() x N),
fsink.s()).apply_async()`` and ``chain(cstep.s() x N).apply_async()`` on the same worker as the
drain (``--pool solo``); the Redis result backend's native chord join (a counter and a list of
the header's results, no chord_unlock polling task).

cpu workload: mode 'prefork' (``--pool prefork -c K``: K forked children, celery's default
pool) or 'solo' (K worker processes of ``--pool solo``, no pool).

Recovery (celery 5.7.0, kombu 5.7.0 ``kombu.transport.redis``): kombu's Redis QoS keeps each
delivered message in the ``unacked`` hash / ``unacked_index`` sorted set (score = delivery
time) until it is acked, and ``QoS.restore_visible`` puts back the ones delivered more than
``visibility_timeout`` ago (default 3,600 s). By default celery acks a task when a pool
thread starts it (``task_acks_late=False``, ``Request.on_accepted``), which removes it from
the unacked index (``QoS.ack``): a SIGKILLed worker's running tasks are gone. In a worker
(event loop) ``restore_visible`` runs every ``unacked_restore_interval`` (10 s) but scans only
on every ``unacked_restore_throttle``-th call (10): once per ~100 s, so ``visibility_timeout``
alone still takes ~100 s. ``--vt 5``: ``task_acks_late=True`` and broker_transport_options
``visibility_timeout=5``, ``unacked_restore_interval=1``, ``unacked_restore_throttle=1``
(kombu's documented settings for a low visibility_timeout: a scan every second).
"""
import os
import sys
import time

import _pre  # noqa: F401
import common
import flowload
from celery import Celery, chain, chord, group

_url = os.environ.get("BENCH_URL") or (sys.argv[sys.argv.index("--url") + 1]
                                       if "--url" in sys.argv else "redis://127.0.0.1:1")
app = Celery("bench", broker=_url, backend=_url)
app.conf.task_default_queue = "bench"
app.conf.broker_connection_retry_on_startup = True
if os.environ.get("BENCH_VT"):
    app.conf.task_acks_late = True
    app.conf.broker_transport_options = {"visibility_timeout": float(os.environ["BENCH_VT"]),
                                         "unacked_restore_interval": 1,
                                         "unacked_restore_throttle": 1}


@app.task(ignore_result=True)
def job(n=0):
    common.tally_start()
    s = common.sleep_s()
    if s:
        time.sleep(s)
    common.tally_done()


# the flow workload (flowload.py): results kept (celery's default; a chord's header needs
# them, the Redis backend's chord counter and result list)
@app.task
def fnoop():
    common.tally_start()
    common.tally_done()
    return 1


@app.task
def fsink(results):
    flowload.flow_end(len(results))
    return len(results)


@app.task
def cstep(prev=None, last=False):
    common.tally_start()
    v = (prev or 0) + 1
    if last:
        flowload.flow_end(v)
    common.tally_done()
    return v


@app.task
def stamp():
    return time.time()


class CeleryPeer(common.Peer):
    name = "celery"

    def enqueue_one(self, i):
        job.delay(i)

    def flow_fan(self, n):
        chord(group(fnoop.s() for _ in range(n)), fsink.s()).apply_async()

    def flow_chain(self, n):
        chain(*(cstep.s(last=i == n - 1) for i in range(n))).apply_async()

    def roundtrip(self):
        return stamp.delay().get(timeout=30)

    def worker_cmd(self, concurrency, vt):
        cmd = [os.path.join(os.path.dirname(sys.executable), "celery"), "-A", "celery_peer",
               "worker", "--loglevel", "WARNING", "-Q", "bench", "--without-gossip",
               "--without-mingle", "--without-heartbeat"]
        if self.kind in ("drain", "flow"):
            return [*cmd, "--pool", "solo"]
        return [*cmd, "--pool", "threads", "-c", str(concurrency)]

    def cpu_cmds(self, mode, workers):
        cmd = [
            os.path.join(os.path.dirname(sys.executable), "celery"), "-A", "celery_peer",
            "worker", "--loglevel", "WARNING", "-Q", "bench", "--without-gossip",
            "--without-mingle", "--without-heartbeat"]
        if mode == "prefork":
            return [[*cmd, "--pool", "prefork", "-c", str(workers)]]
        if mode == "solo":
            return [[*cmd, "--pool", "solo"] for _ in range(workers)]
        raise NotImplementedError(f"mode {mode!r}")

    def recovery_limit(self, vt):
        if vt:
            return None
        return ("with celery's default early acks (task_acks_late=False) a task is acked when"
                " a pool thread starts it (Request.on_accepted), which deletes it from kombu's"
                " Redis unacked index (QoS.ack): nothing is left to redeliver after a SIGKILL"
                " (celery 5.7.0, kombu 5.7.0; with acks_late the default visibility_timeout"
                " is 3,600 s)")


if __name__ == "__main__":
    import celery_peer  # the tasks must live in the module, not __main__
    sys.exit(common.main(celery_peer.CeleryPeer))
