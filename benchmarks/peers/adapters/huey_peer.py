# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""huey: RedisHuey (a Redis list per queue, blocking pop; results in a hash).

``huey_consumer huey_peer.huey -k thread -w W`` (W = 8 for no-op drains, 100 for I/O,
latency and recovery). Results are stored for tasks that return a value (``stamp``); no
result TTL (kept until read). Round trip: ``Result.get(blocking=True)``. No bulk enqueue API.

Recovery (huey 3.5.4 ``RedisStorage.dequeue``): a worker takes a task off the queue list with
BRPOP (RPOP when not blocking) and nothing else in Redis records it: there is no
acknowledgement, in-flight list or visibility timeout (none of huey's Redis storages has
one; ``--vt`` is ignored), so the tasks of a worker that dies are lost.
"""
import os
import sys
import time

import _pre  # noqa: F401
import common
from huey import RedisHuey

_url = os.environ.get("BENCH_URL") or (sys.argv[sys.argv.index("--url") + 1]
                                       if "--url" in sys.argv else "redis://127.0.0.1:1")
huey = RedisHuey("bench", url=_url)


@huey.task()
def job(n=0):
    common.tally_start()
    s = common.sleep_s()
    if s:
        time.sleep(s)
    common.tally_done()


@huey.task()
def stamp():
    return time.time()


class HueyPeer(common.Peer):
    name = "huey"

    def enqueue_one(self, i):
        job(i)

    def roundtrip(self):
        return stamp().get(blocking=True, timeout=30)

    def worker_cmd(self, concurrency, vt):
        w = 8 if self.kind == "drain" else 100
        return [os.path.join(os.path.dirname(sys.executable), "huey_consumer"),
                "huey_peer.huey", "-k", "thread", "-w", str(w), "-q"]

    def recovery_limit(self, vt):
        return ("huey removes a task from Redis when a worker pops it (RedisStorage.dequeue:"
                " BRPOP) and keeps no acknowledgement or in-flight record, so the tasks a"
                " SIGKILLed worker was running are lost; there is no visibility timeout to"
                " set (huey 3.5.4)")


if __name__ == "__main__":
    import huey_peer  # the tasks must live in the module, not __main__
    sys.exit(common.main(huey_peer.HueyPeer))
