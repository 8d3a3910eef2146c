# mypy: ignore-errors
# (runs in the peer's own venv, with the peer's packages)
"""streamq through the peer protocol (runs in the project venv).

Worker: ``streamq.Worker`` on queue ``bench``, ``WorkerConfig(concurrency=C)`` and defaults
otherwise (visibility timeout 30 s; ``--vt`` sets ``visibility_timeout_s``). Producer:
``Queue.enqueue`` / ``Queue.enqueue_many``; round trip: ``Queue.enqueue_and_wait`` (pub/sub
notification on completion).

flow workload (``python -m benchmarks.peers --flows``): ``chord(group([JobSpec("fnoop")] * N),
JobSpec("fsink"))`` and ``chain(JobSpec("cstep") * N)`` through ``Queue.enqueue_flow`` (one
queue: every edge resolves inline in the child's terminal script), the same worker process;
'fandeps': the fan-in as ``enqueue_many`` + ``enqueue(..., depends_on=[...])``.

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
import flowload
from common import sleep_s, tally_done, tally_start

from streamq import Job, JobSpec, Queue, Registry, Worker, WorkerConfig, chain, chord, group

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


# the flow workload (flowload.py): a chord's members and callback, a chain's steps. The
# worker reads a waiting job's dependency results (page by page) before its handler starts.
@registry.handler("fnoop")
async def fnoop(j: Job) -> int:
    tally_start()
    tally_done()
    return 1


@registry.handler("fsink")
async def fsink(j: Job) -> int:
    seen = len(j.dependency_results())
    flowload.flow_end(seen)
    return seen


@registry.handler("cstep")
async def cstep(j: Job) -> int:
    tally_start()
    v = (j.previous_result() or 0) + 1
    if j.payload.get("last"):
        flowload.flow_end(v)
    tally_done()
    return v


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

    def flow_fan(self, n: int) -> None:
        flow = chord(group([JobSpec("fnoop") for _ in range(n)]), JobSpec("fsink"))
        self.q.enqueue_flow(flow, flow_id="fan")

    def flow_fan_deps(self, n: int) -> None:
        """The same fan-in as one ``enqueue_many`` of the children and one ``enqueue`` of the
        callback with ``depends_on`` (docs/workflows.md: the primitive under the sugar)."""
        self.q.enqueue_many([{"type": "fnoop", "job_id": f"f{i}"} for i in range(n)])
        self.q.enqueue("fsink", job_id="sink", depends_on=[f"f{i}" for i in range(n)])

    def flow_chain(self, n: int) -> None:
        flow = chain(*(JobSpec("cstep", {"last": i == n - 1}) for i in range(n)))
        self.q.enqueue_flow(flow, flow_id="chain")

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
