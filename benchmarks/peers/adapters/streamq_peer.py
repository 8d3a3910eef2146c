# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""streamq through the peer protocol (runs in the project venv).

Worker: ``streamq.Worker`` on queue ``bench``, ``WorkerConfig(concurrency=C)`` and defaults
otherwise (visibility timeout 30 s; ``--vt`` sets ``visibility_timeout_s``). Producer:
``Queue.enqueue`` / ``Queue.enqueue_many``; round trip: ``Queue.enqueue_and_wait`` (pub/sub
notification on completion).

cpu workload (``python -m benchmarks.peers.runtime``): a sync handler ('cpujob') run by the
CLI, ``streamq worker streamq_peer:registry --concurrency 4`` with, by mode: 'thread' (one
process, the handler in threads), 'processes' (``--processes K``: a supervisor and K worker
processes), 'pool' (``--pool process --pool-size K``: one worker, the handler in K children).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))))

import common
from common import sleep_s, tally_done, tally_start

from streamq import Job, Queue, Registry, Worker, WorkerConfig

registry = Registry()


@registry.handler("job")
async def job(j: Job) -> None:
    tally_start()
    s = sleep_s()
    if s:
        await asyncio.sleep(s)
    tally_done()


@registry.handler("cpujob")
def cpujob(j: Job) -> None:
    tally_start()  # (runs the cpu workload's burn())
    tally_done()


@registry.handler("stamp")
async def stamp(j: Job) -> float:
    return time.time()


class StreamqPeer(common.Peer):
    name = "streamq"
    bulk_api = "Queue.enqueue_many"

    def setup(self) -> None:
        self.q = Queue.from_url(self.url, "bench")

    def close(self) -> None:
        self.q.close()

    def enqueue_one(self, i: int) -> None:
        self.q.enqueue("job", {"n": i})

    def enqueue_bulk(self, n: int) -> None:
        kind = "cpujob" if self.kind == "cpu" else "job"
        res = self.q.enqueue_many([{"type": kind, "payload": {"n": i}} for i in range(n)])
        assert all(r.status == "queued" for r in res)

    def roundtrip(self) -> float:
        return float(self.q.enqueue_and_wait("stamp", timeout=30))

    def worker_cmd(self, concurrency: int, vt: float | None) -> list[str]:
        return [sys.executable, os.path.abspath(__file__), "_worker", str(concurrency),
                str(vt or "")]


    def cpu_cmds(self, mode: str, workers: int) -> list[list[str]]:
        cmd = [sys.executable, "-m", "streamq", "worker", "streamq_peer:registry", "--url",
               self.url, "--queue", "bench", "--concurrency", "4", "--log-level", "WARNING"]
        if mode == "thread":
            return [cmd]
        if mode == "processes":
            return [[*cmd, "--processes", str(workers)]]
        if mode == "pool":
            return [[*cmd, "--pool", "process", "--pool-size", str(workers)]]
        raise NotImplementedError(f"mode {mode!r}")


def _worker(concurrency: str, vt: str) -> None:
    cfg = WorkerConfig(concurrency=int(concurrency), **({"visibility_timeout_s": float(vt)}
                                                         if vt else {}))
    Worker(os.environ["BENCH_URL"], ["bench"], registry, cfg).run()


if __name__ == "__main__":
    if sys.argv[1] == "_worker":
        _worker(*sys.argv[2:4])
    else:
        sys.exit(common.main(StreamqPeer))
