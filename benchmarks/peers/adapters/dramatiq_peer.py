# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""dramatiq with the Redis broker (lists + a per-queue message hash; acked on completion).

``dramatiq dramatiq_peer --processes 1 --threads T`` (T = 8, dramatiq's default, for no-op
drains; T = 100 for the I/O workload: time.sleep in threads, dramatiq's concurrency model).
Results middleware with the Redis backend only on the 'stamp' actor (round trip:
``Message.get_result(block=True)``). Recovery: the default heartbeat_timeout (60 s) after
which a dead worker's unacked messages are requeued; ``--vt 5`` sets heartbeat_timeout=5000.
No bulk enqueue (``group`` sends one message at a time).
"""
import os
import sys
import time

import _pre  # noqa: F401
import common
import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

_url = os.environ.get("BENCH_URL") or (sys.argv[sys.argv.index("--url") + 1]
                                       if "--url" in sys.argv else "redis://127.0.0.1:1")
_vt = os.environ.get("BENCH_VT")
broker = RedisBroker(url=_url, **({"heartbeat_timeout": int(float(_vt) * 1000)} if _vt else {}))
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


if __name__ == "__main__":
    import dramatiq_peer  # the tasks must live in the module, not __main__
    sys.exit(common.main(dramatiq_peer.DramatiqPeer))
