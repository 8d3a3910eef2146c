# mypy: ignore-errors
# (imported inside every peer's own venv: stdlib + redis-py + common only)
"""The ``flow`` workload of the peers harness (``python -m benchmarks.peers --flows``).

``python adapters/<peer>_peer.py flow --what plain|fan|chain --n N --url URL``: one worker
process of the peer (:meth:`Peer.worker_cmd`, ``BENCH_KIND=flow``) is started and warmed up
(one plain job run to the end), then, timed from the producer's first enqueue call
(``t0``, taken by the producer itself):

* ``plain``: N no-op jobs through the peer's bulk enqueue (the reference), until the last
  one completed (the latest completion any worker thread noted, as the drain workload);
* ``fan``: N no-op children and one callback that waits for all of them and reads their
  results (:meth:`Peer.flow_fan`), until the callback ran;
* ``fandeps``: the same through a lower-level API where the peer has one (streamq:
  ``enqueue_many`` + ``enqueue(..., depends_on=[...])``);
* ``chain``: N steps, each waiting for the previous one and getting its result
  (:meth:`Peer.flow_chain`), until the last step ran.

The children and steps count themselves like the drain's jobs (:func:`common.tally_done`);
the callback / last step calls :func:`flow_end` with what it saw (the number of results, or
the chain's running count), which the harness checks. CPU: the worker process's (its whole
session, with children) and redis-server's (``INFO cpu``), from just before ``t0`` to the
end, per job.

``--prefill``: everything is enqueued first, then the worker starts, and the time runs from
the first job's start (the drain workload's way: the engine's side alone, no producer in
the span; no CPU figures, which would include the worker's start-up).
"""

from __future__ import annotations

import time
from typing import Any

import common

END_KEY = "bench:flow_end"
SEEN_KEY = "bench:flow_n"


def flow_end(seen: int) -> None:
    """The fan-in's callback / the chain's last step: note the time and what it saw."""
    pipe = common._redis().pipeline(transaction=False)
    pipe.set(END_KEY, repr(time.time()))
    pipe.set(SEEN_KEY, int(seen))
    pipe.execute()


def redis_cpu_s(r) -> float:
    info = r.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _progress(r) -> str:
    return f"{int(r.get('bench:done') or 0)} children/steps done"


def run_flow(peer, r, what: str, n: int, concurrency: int, timeout_s: float,
             prefill: bool = False) -> dict[str, Any]:
    r.flushdb()
    proc = None
    if prefill:  # everything enqueued first, then the worker; timed from its first start
        t0, enqueue_s = peer.flow_enqueue(what, n)
    else:
        proc = common._start_worker(peer, concurrency, None, {"BENCH_KIND": "flow"})
    try:
        if prefill:
            proc = common._start_worker(peer, concurrency, None, {"BENCH_KIND": "flow"})
        else:
            # warm-up: the worker is up and has run one job before the clock starts
            peer.flow_enqueue("plain", 1)
            got = common._wait_count(r, "bench:done", 1, 120, [proc])
            if got < 1:
                raise RuntimeError("the worker did not run the warm-up job in 120 s")
            time.sleep(0.2)  # its count flushed (every 50 ms)
            r.delete("bench:done", "bench:first", "bench:last", END_KEY, SEEN_KEY)
        cpu0, rcpu0 = common.session_cpu_s({proc.pid}), redis_cpu_s(r)
        if not prefill:
            t0, enqueue_s = peer.flow_enqueue(what, n)
        deadline = time.monotonic() + timeout_s
        while True:
            if what == "plain":
                if int(r.get("bench:done") or 0) >= n:
                    break
            elif r.exists(END_KEY):
                break
            if proc.poll() is not None:
                raise RuntimeError(f"worker exited {proc.returncode}; {_progress(r)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout_s:g} s; {_progress(r)}")
            time.sleep(0.005)
        cpu1, rcpu1 = common.session_cpu_s({proc.pid}), redis_cpu_s(r)
        if what == "plain":
            time.sleep(0.1)  # every worker thread's last completion flushed
            end = r.zrevrange("bench:last", 0, 0, withscores=True)[0][1]
            seen = n
        else:
            end = float(r.get(END_KEY))
            seen = int(r.get(SEEN_KEY) or -1)
        time.sleep(0.2)
        done = int(r.get("bench:done") or 0)
        if prefill:  # the first child / step's start (as the drain workload)
            t0 = r.zrange("bench:first", 0, 0, withscores=True)[0][1]
    finally:
        if proc is not None:
            common._stop([proc])
    jobs = n + 1 if what.startswith("fan") else n
    out: dict[str, Any] = {
        "what": what, "n": n, "jobs": jobs, "prefill": prefill, "wall_s": end - t0,
        "per_s": n / (end - t0), "enqueue_s": enqueue_s, "seen": seen, "done": done}
    if not prefill:  # (a prefilled run's worker CPU would include its start-up)
        out.update(after_enqueue_s=end - t0 - enqueue_s,
                   worker_cpu_us_per_job=(cpu1 - cpu0) / jobs * 1e6,
                   redis_cpu_us_per_job=(rcpu1 - rcpu0) / jobs * 1e6)
    bad = []
    if seen != n:
        who = "callback" if what.startswith("fan") else "last step"
        bad.append(f"the {who} saw {seen}, not {n}")
    if done != n:
        bad.append(f"{done} children/steps counted, not {n}")
    if bad:
        out["error"] = "; ".join(bad)
    return out
