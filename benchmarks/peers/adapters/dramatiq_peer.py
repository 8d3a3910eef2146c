# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""dramatiq with the Redis broker (lists + a per-queue message hash; acked on completion).

``dramatiq dramatiq_peer --processes 1 --threads T`` (T = 8, dramatiq's default, for no-op
drains; T = 100 for the I/O workload: time.sleep in threads, dramatiq's concurrency model).
Results middleware with the Redis backend only on the 'stamp' actor (round trip:
``Message.get_result(block=True)``). No bulk enqueue (``group`` sends one message at a time).

Recovery (dramatiq 2.2.1 ``RedisBroker``, ``brokers/redis/dispatch.lua``): a fetched message
id sits in the worker's ``__acks__.<broker_id>.<queue>`` set until acked, and every broker
command stamps the worker's heartbeat. The only thing that requeues a dead worker's acks is
the queue maintenance inside the dispatch script, run on a random ``maintenance_chance``
out of 1,000,000 commands (default 1,000, acks and nacks excluded): it moves back the acks of
workers whose heartbeat is older than ``heartbeat_timeout`` (default 60,000 ms). An idle
worker fetches about once a second per queue (``worker_timeout`` 1,000 ms back-off; two
queues, ``bench`` and its delay queue), so with the defaults maintenance comes ~370 s apart
on average. ``--vt 5``: ``heartbeat_timeout=5000`` and ``maintenance_chance=1,000,000``
(``MAINTENANCE_SCALE``: maintenance on every command) so the 5 s timeout is what decides.
cpu workload (mode 'procs'): ``--processes K --threads 1`` (one job at a time per process,
as celery prefork's children; more threads only share one GIL).

``dead_message_ttl`` only expires dead-lettered messages (the ``.XQ`` set): not involved.
"""
import os
import sys
import time

import _pre  # noqa: F401
import common
import dramatiq
from dramatiq.brokers.redis import MAINTENANCE_SCALE, RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

_url = os.environ.get("BENCH_URL") or (sys.argv[sys.argv.index("--url") + 1]
                                       if "--url" in sys.argv else "redis://127.0.0.1:1")
_vt = os.environ.get("BENCH_VT")
broker = RedisBroker(url=_url, **({"heartbeat_timeout": int(float(_vt) * 1000),
                                   "maintenance_chance": MAINTENANCE_SCALE} if _vt else {}))
broker.add_middleware(Results(backend=RedisBackend(url=_url)))
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", max_retries=3)
def job(n=0):
    common.tally_start()
    s = common.sleep_s()
    if s:
        time.sleep(s)
    common.tally_done()


@dramatiq.actor(queue_name="bench", store_results=True)
def stamp():
    return time.time()


class DramatiqPeer(common.Peer):
    name = "dramatiq"

    def enqueue_one(self, i):
        job.send(i)

    def roundtrip(self):
        return stamp.send().get_result(block=True, timeout=30_000)

    def worker_cmd(self, concurrency, vt):
        threads = 100 if self.kind in ("io", "recovery", "latency") else 8
        return [os.path.join(os.path.dirname(sys.executable), "dramatiq"), "dramatiq_peer",
                "--processes", "1", "--threads", str(threads)]

    def cpu_cmds(self, mode, workers):
        if mode != "procs":
            raise NotImplementedError(f"mode {mode!r}")
        return [[os.path.join(os.path.dirname(sys.executable), "dramatiq"), "dramatiq_peer",
                 "--processes", str(workers), "--threads", "1"]]

    def recovery_limit(self, vt):
        if vt:
            return None
        return ("dramatiq requeues a dead worker's unacked messages only in the queue"
                " maintenance of its dispatch script, which runs on a random 1,000 in"
                " 1,000,000 commands (maintenance_chance) once the worker's heartbeat is 60 s"
                " old (heartbeat_timeout): an idle worker fetching about twice a second"
                " triggers it every ~370 s on average (dramatiq 2.2.1 RedisBroker,"
                " dispatch.lua)")


if __name__ == "__main__":
    import dramatiq_peer  # the tasks must live in the module, not __main__
    sys.exit(common.main(dramatiq_peer.DramatiqPeer))
