# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""taskiq + taskiq-redis: RedisStreamBroker (Redis Streams consumer group; ack after the
result is saved, taskiq's default ack type) with RedisAsyncResultBackend (result_ex_time
3600 s; results of every task are stored).

``taskiq worker taskiq_peer:broker --workers 1 --max-async-tasks C``. ``consumer_id="0"``
(the default "$" would skip messages enqueued before the worker created the group).
Round trip: ``TaskiqResult.wait_result(check_interval=0.001)``. No bulk enqueue API.

Recovery (taskiq-redis 1.2.4 ``RedisStreamBroker.listen``): a dead worker's delivered but
unacknowledged entries stay in the group's pending list; a worker takes them over with
XAUTOCLAIM (``min_idle_time=idle_timeout``, default 600,000 ms, up to
``unacknowledged_batch_size`` 100 per pass). ``--vt 5`` sets ``idle_timeout=5000``, the
documented knob. But ``listen`` reaches its XAUTOCLAIM pass only after an ``XREADGROUP ... >``
(blocking ``xread_block`` 2,000 ms) that returned new entries (``if not fetched: continue``):
a worker that finds no new message never claims, so once a killed worker's jobs are the only
ones left (this workload enqueues nothing after the kill) they are not recovered with any
``idle_timeout``, until some new task arrives.
"""
import asyncio
import os
import sys
import time

import _pre  # noqa: F401
import common
from taskiq_redis import RedisAsyncResultBackend, RedisStreamBroker

_url = os.environ.get("BENCH_URL") or (sys.argv[sys.argv.index("--url") + 1]
                                       if "--url" in sys.argv else "redis://127.0.0.1:1")
_vt = os.environ.get("BENCH_VT")
broker = RedisStreamBroker(url=_url, queue_name="bench", consumer_id="0",
                           **({"idle_timeout": int(float(_vt) * 1000)} if _vt else {})
                           ).with_result_backend(
    RedisAsyncResultBackend(redis_url=_url, result_ex_time=3600))


@broker.task
async def job(n: int = 0) -> None:
    common.tally_start()
    s = common.sleep_s()
    if s:
        await asyncio.sleep(s)
    common.tally_done()


@broker.task
async def stamp() -> float:
    return time.time()


class TaskiqPeer(common.AsyncPeer):
    name = "taskiq"

    def setup(self):
        self.run(broker.startup())

    def close(self):
        self.run(broker.shutdown())

    async def aenqueue_one(self, i):
        await job.kiq(i)

    async def aroundtrip(self):
        t = await stamp.kiq()
        res = await t.wait_result(check_interval=0.001, timeout=30)
        return res.return_value

    def worker_cmd(self, concurrency, vt):
        return [os.path.join(os.path.dirname(sys.executable), "taskiq"), "worker",
                "taskiq_peer:broker", "--workers", "1", "--max-async-tasks", str(concurrency),
                "--log-level", "WARNING"]

    def recovery_limit(self, vt):
        idle = f"{vt:g} s" if vt else "600 s, the default idle_timeout"
        return ("taskiq-redis reclaims a dead worker's pending entries with XAUTOCLAIM"
                f" (min idle {idle}), but"
                " RedisStreamBroker.listen runs that pass only after an XREADGROUP that"
                " returned new entries ('if not fetched: continue'): with no new task"
                " enqueued after the kill, the worker never claims them (taskiq-redis 1.2.4)")


if __name__ == "__main__":
    import taskiq_peer  # the tasks must live in the module, not __main__
    sys.exit(common.main(taskiq_peer.TaskiqPeer))
