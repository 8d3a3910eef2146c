# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""BullMQ (Node): the orchestration is common.py's (run from the project venv); the worker
is ``node bullmq/worker.mjs`` (``new Worker("bench", fn, {concurrency: C})``, defaults
otherwise: lockDuration 30 s, stalledInterval 30 s, maxStalledCount 1; ``--vt 5`` sets both
to 5,000 ms), the producer ``node bullmq/producer.mjs`` (``Queue.add``, ``Queue.addBulk``
1,000 per call, round trip ``Job.waitUntilFinished(QueueEvents)``). Completed jobs are kept
(removeOnComplete unset: BullMQ's default keeps them all).

flow workload (``python -m benchmarks.peers --flows``): ``node bullmq/flows.mjs`` (a
``FlowProducer.add`` of a parent with N children; a chain as an N-deep tree, each step the
one child of the next), timed from just before its first add (its own clock); the same worker.

"""
import json
import os
import subprocess
import sys

import _pre  # noqa: F401
import common

DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bullmq")


def _node(*args: str) -> dict:
    p = subprocess.run(["node", os.path.join(DIR, "producer.mjs"), *args], capture_output=True,
                       text=True, timeout=600, cwd=DIR)
    if p.returncode != 0:
        raise RuntimeError(p.stderr[-800:])
    return json.loads(p.stdout.strip().splitlines()[-1])


class BullmqPeer(common.Peer):
    name = "bullmq"
    bulk_api = "Queue.addBulk"

    def enqueue_jobs(self, n):
        _node(self.url, "fill", str(n))

    def worker_cmd(self, concurrency, vt):
        return ["node", os.path.join(DIR, "worker.mjs")]

    def flow_enqueue(self, what, n):
        p = subprocess.run(["node", os.path.join(DIR, "flows.mjs"), self.url, what, str(n)],
                           capture_output=True, text=True, timeout=600, cwd=DIR)
        if p.returncode != 0:
            raise RuntimeError(f"flows.mjs {what} {n}: {p.stderr[-800:]}")
        out = json.loads(p.stdout.strip().splitlines()[-1])
        return float(out["t0"]), float(out["enqueue_s"])


def run_node_workload(argv):
    import argparse
    p = argparse.ArgumentParser()
    p.add_argument("workload")
    p.add_argument("--url")
    p.add_argument("--n", type=int, default=0)
    p.add_argument("--warmup", type=int, default=20)
    a, _ = p.parse_known_args(argv)
    import redis
    redis.Redis.from_url(a.url).flushdb()
    peer = BullmqPeer(a.url, a)
    procs = []
    if a.workload == "latency":
        procs.append(common._start_worker(peer, 100, None, {"BENCH_KIND": "latency"}))
    try:
        out = _node(a.url, a.workload, str(a.n), str(a.warmup))
    except Exception as exc:  # noqa: BLE001
        out = {"error": f"{type(exc).__name__}: {exc}"[:800]}
    finally:
        common._stop(procs)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    if sys.argv[1] in ("enqueue", "latency"):
        run_node_workload(sys.argv[1:])
    else:
        sys.exit(common.main(BullmqPeer))
