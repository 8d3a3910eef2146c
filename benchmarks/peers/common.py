# mypy: ignore-errors
# (imported inside every peer's own venv)
"""The adapter protocol, shared by every peer adapter (stdlib + redis-py only: it runs inside
each peer's own virtualenv).

``python adapters/<peer>.py WORKLOAD --url URL [--n N] [--workers K] [--concurrency C]
[--vt SECONDS]`` prints one JSON line: the figures, or ``{"error": "..."}``.

Workloads: ``drain`` (N no-op jobs pre-enqueued, then K worker processes; also the Redis memory
of the queued and of the finished jobs), ``enqueue`` (N one at a time, then N through the bulk
API if there is one), ``latency`` (N sequential enqueue → result-available round trips, after a
warm-up), ``io`` (N jobs sleeping 10 ms, one worker process at concurrency C), ``recovery``
(a worker holding 100 long jobs is SIGKILLed; seconds until another worker completed all 100;
``--vt`` configures the peer's visibility timeout / lock / heartbeat where it has one),
``cpu`` (N CPU-bound jobs, ``--loop L`` iterations of :func:`burn` each, 0 = no-op, drained by
``--workers K`` processes in the peer's ``--mode``: see :meth:`Peer.cpu_cmds`; the runtime
benchmark, ``python -m benchmarks.peers.runtime``).

Completion is counted the same way for every peer: each task calls :func:`tally_start` and
:func:`tally_done`; a per-process thread adds the count to ``bench:done`` every 50 ms (one
INCRBY for many jobs, so the count costs the peer almost nothing) with the wall-clock time of
the process's first job start and last completion. Peers whose tasks run in a forked child
(rq's default Worker) flush synchronously per job (``BENCH_SYNC_FLUSH=1``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import redis

HERE = os.path.dirname(os.path.abspath(__file__))

# ------------------------------------------------------------------ task side (worker procs)

_lock = threading.Lock()
_state: dict[str, Any] = {"pid": None, "count": 0, "flushed": 0, "first": None, "last": 0.0}
_client: redis.Redis | None = None


def _redis() -> redis.Redis:
    global _client
    if _client is None or _state["pid"] != os.getpid():
        _client = redis.Redis.from_url(os.environ["BENCH_URL"])
    return _client


# read once per process (the environment of a worker process does not change while it runs;
# reading it per task cost each peer a few µs per job, as much as a fast peer's whole job)
_SLEEP_S = float(os.environ.get("BENCH_SLEEP_MS", "0")) / 1000.0
_COUNT_START = bool(os.environ.get("BENCH_COUNT_START"))
_SYNC_FLUSH = bool(os.environ.get("BENCH_SYNC_FLUSH"))
_CPU_LOOP = int(os.environ.get("BENCH_CPU_LOOP") or 0)


def burn(loop: int) -> int:
    """Pure-Python CPU work (holds the GIL): ``loop`` iterations, about 5 ms for the loop
    count the runtime benchmark calibrates."""
    x = 0
    for i in range(loop):
        x += i * i % 7
    return x


def sleep_s() -> float:
    return _SLEEP_S


def tally_start() -> None:
    """Call at the start of every task."""
    if _COUNT_START:
        _redis().incr("bench:started")
    if _state["first"] is None or _state["pid"] != os.getpid():
        _reset_if_forked()
        if _state["first"] is None:
            _state["first"] = time.time()
    if _CPU_LOOP:  # the cpu workload: the job's work (timed from its start, as every job)
        burn(_CPU_LOOP)


def _reset_if_forked() -> None:
    if _state["pid"] == os.getpid():
        return
    with _lock:  # several task threads may get here at once
        if _state["pid"] != os.getpid():
            global _client
            _client = None
            _state.update(pid=os.getpid(), count=0, flushed=0, first=None, last=0.0)
            if not _SYNC_FLUSH:
                threading.Thread(target=_flusher, daemon=True).start()


def tally_done() -> None:
    """Call when a task finished."""
    _reset_if_forked()
    with _lock:
        _state["count"] += 1
        _state["last"] = time.time()
    if _SYNC_FLUSH:
        _flush()


def _flush() -> None:
    with _lock:
        delta = _state["count"] - _state["flushed"]
        first, last = _state["first"], _state["last"]
        _state["flushed"] = _state["count"]
    if delta <= 0:
        return
    pipe = _redis().pipeline(transaction=False)
    pipe.incrby("bench:done", delta)
    if first is not None:
        pipe.zadd("bench:first", {str(os.getpid()): first}, nx=True)
    pipe.zadd("bench:last", {str(os.getpid()): last}, gt=True)
    pipe.execute()


def _flusher() -> None:
    while True:
        # every 50 ms: a 10 ms flusher thread cost a Python worker ~10% of its no-op drain
        # (measured on streamq: its GIL hand-offs); the figures come from the timestamps
        # taken in the task, so the interval only delays the harness seeing the end
        time.sleep(0.05)
        try:
            _flush()
        except Exception:  # noqa: BLE001 - keep counting through a hiccup
            traceback.print_exc()


# ------------------------------------------------------------------ adapter side


class Peer:
    """What an adapter provides. Unsupported pieces raise NotImplementedError."""

    name = "?"
    kind = "plain"
    """drain, io, latency or recovery: set before worker_cmd() is called."""
    bulk_api: str | None = None
    """Name of the bulk enqueue call, None when the peer has none."""
    per_process_concurrency = True
    """False: one worker process runs one job at a time (rq)."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        self.url = url
        self.args = args

    # producers
    def setup(self) -> None: ...
    def close(self) -> None: ...
    def enqueue_one(self, i: int) -> None: raise NotImplementedError
    def enqueue_bulk(self, n: int) -> None: raise NotImplementedError
    def roundtrip(self) -> float:
        """Enqueue a 'stamp' job and wait until its result is available; the result."""
        raise NotImplementedError

    # worker processes
    def worker_cmd(self, concurrency: int, vt: float | None) -> list[str]:
        raise NotImplementedError

    def worker_env(self, vt: float | None) -> dict[str, str]:
        return {}

    def cpu_cmds(self, mode: str, workers: int) -> list[list[str]]:
        """The cpu workload's worker command lines: ``workers`` processes the way ``mode``
        says (the peer's own multi-process option, or its pool). Default: ``workers``
        separate worker processes of :meth:`worker_cmd` at concurrency 1 (mode 'procs')."""
        if mode != "procs":
            raise NotImplementedError(f"mode {mode!r}")
        return [self.worker_cmd(1, None) for _ in range(workers)]

    def enqueue_recovery(self, n: int) -> None:
        """The recovery jobs (default: the bulk or single enqueue)."""
        self.enqueue_jobs(n)

    def recovery_limit(self, vt: float | None) -> str | None:
        """Why this peer, so configured, cannot get a killed worker's jobs back within the
        cap (its mechanism, from its source / docs), or None when it should. Reported with
        the figure when the jobs were not all done in time."""
        return None

    def explain_error(self, workload: str, exc: Exception) -> str | None:
        """A precise cause for a failed workload (e.g. from the peer's own records), or
        None. Reported next to the error."""
        return None

    # the flow workload (flowload.py, ``python -m benchmarks.peers --flows``)
    def flow_fan(self, n: int) -> None:
        """N no-op children ('fnoop', counted) and one callback waiting for all of them that
        reads their results and calls ``flowload.flow_end(len(results))``."""
        raise NotImplementedError

    def flow_fan_deps(self, n: int) -> None:
        """The same fan-in through the peer's lower-level dependency API (streamq's
        ``depends_on``), where it has one besides its flow sugar."""
        raise NotImplementedError

    def flow_chain(self, n: int) -> None:
        """A chain of N steps, each getting the previous one's result r and returning r + 1
        (the first: 1), all counted; the last calls ``flowload.flow_end(its value)``."""
        raise NotImplementedError

    def flow_enqueue(self, what: str, n: int) -> tuple[float, float]:
        """The flow workload's producer: (wall-clock time of the first enqueue call, seconds
        the enqueue took). 'plain' is :meth:`enqueue_jobs`."""
        t0, p0 = time.time(), time.perf_counter()
        if what == "plain":
            self.enqueue_jobs(n)
        elif what == "fan":
            self.flow_fan(n)
        elif what == "fandeps":
            self.flow_fan_deps(n)
        elif what == "chain":
            self.flow_chain(n)
        else:
            raise ValueError(what)
        return t0, time.perf_counter() - p0

    def enqueue_jobs(self, n: int) -> None:
        try:
            self.enqueue_bulk(n)
        except NotImplementedError:
            for i in range(n):
                self.enqueue_one(i)


def _start_worker(peer: Peer, concurrency: int, vt: float | None,
                  extra_env: dict[str, str], cmd: list[str] | None = None
                  ) -> subprocess.Popen[bytes]:
    env = dict(os.environ)
    env.update(peer.worker_env(vt))
    env.update(extra_env)
    env["BENCH_URL"] = peer.url
    env["BENCH_CONC"] = str(concurrency)
    env["BENCH_VT"] = "" if vt is None else f"{vt:g}"
    peer.kind = extra_env.get("BENCH_KIND", "plain")
    env["PYTHONPATH"] = os.pathsep.join([HERE, os.path.join(HERE, "adapters")]
                                        + [p for p in [env.get("PYTHONPATH")] if p])
    log = open(os.path.join(os.environ.get("BENCH_LOGDIR", "/tmp"),  # noqa: SIM115
                            f"bench-{peer.name}-worker-{os.getpid()}-{time.time():.0f}.log"),
               "ab")
    return subprocess.Popen(cmd or peer.worker_cmd(concurrency, vt), env=env, cwd=HERE,
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _stop(procs: list[subprocess.Popen[bytes]], sig: int = signal.SIGTERM) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, sig)
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()


def _wait_count(r: redis.Redis, key: str, n: int, timeout_s: float,
                procs: list[subprocess.Popen[bytes]]) -> int:
    end = time.monotonic() + timeout_s
    while True:
        got = int(r.get(key) or 0)
        if got >= n or time.monotonic() > end:
            return got
        for p in procs:
            if p.poll() is not None:
                raise RuntimeError(f"worker process exited {p.returncode} with {got}/{n} done")
        time.sleep(0.005)


def used_memory(r: redis.Redis) -> int:
    return int(r.info("memory")["used_memory"])


def run_drain(peer: Peer, r: redis.Redis, n: int, workers: int, concurrency: int,
              sleep_ms: int, timeout_s: float) -> dict[str, Any]:
    r.flushdb()
    mem0 = used_memory(r)
    t = time.perf_counter()
    peer.enqueue_jobs(n)
    enqueue_s = time.perf_counter() - t
    mem_queued = used_memory(r) - mem0
    env = {"BENCH_SLEEP_MS": str(sleep_ms), "BENCH_KIND": "io" if sleep_ms else "drain"}
    procs = [_start_worker(peer, concurrency, None, env) for _ in range(workers)]
    try:
        got = _wait_count(r, "bench:done", n, timeout_s, procs)
        if got < n:
            raise RuntimeError(f"only {got} of {n} jobs done after {timeout_s:g}s")
        time.sleep(0.05)
        first = r.zrange("bench:first", 0, 0, withscores=True)[0][1]
        last = r.zrevrange("bench:last", 0, 0, withscores=True)[0][1]
        extra = int(r.get("bench:done") or 0) - n
        time.sleep(0.5)  # let the peer write its last results / acks
        mem_done = used_memory(r) - mem0
    finally:
        _stop(procs)
    if extra:
        raise RuntimeError(f"{extra} jobs ran more than once")
    wall = last - first
    return {"per_s": n / wall, "wall_s": wall, "jobs": n, "prefill_s": enqueue_s,
            "mem_queued_per_100k": mem_queued * 100_000 / n,
            "mem_finished_per_100k": mem_done * 100_000 / n}


def session_cpu_s(sessions: set[int]) -> float:
    """CPU seconds (user + system, with reaped children's) of every live process in the given
    sessions (each worker command starts its own): the workers, their pool children and
    supervisors. Linux /proc."""
    total = 0
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) in sessions:
            total += sum(int(x) for x in fields[11:15])
    return total / os.sysconf("SC_CLK_TCK")


def run_cpu(peer: Peer, r: redis.Redis, n: int, workers: int, mode: str, loop: int,
            timeout_s: float) -> dict[str, Any]:
    """N jobs of ``loop`` :func:`burn` iterations pre-enqueued, then the peer's worker
    processes (:meth:`Peer.cpu_cmds`). ``per_s``: the steady rate, from the moment 10% of the
    jobs are done and every one of the ``workers`` processes ran a job (a process that starts
    late, as a supervisor's second child, does not count against the set) to 90%; and the CPU
    time the worker processes spent per job over the same span (less distorted by a busy
    machine than wall time). The done count is flushed every 50 ms, at both marks alike.
    ``drain_per_s``: N / (last completion - first start), as the drain workload."""
    r.flushdb()
    peer.kind = "cpu"
    peer.enqueue_jobs(n)
    env = {"BENCH_CPU_LOOP": str(loop), "BENCH_KIND": "cpu"}
    cmds = peer.cpu_cmds(mode, workers)
    procs = [_start_worker(peer, 1, None, env, cmd) for cmd in cmds]
    sessions = {p.pid for p in procs}
    # (jobs done, CPU s of the workers, time) at 10% (once every process ran a job) and 90%
    marks: list[tuple[int, float, float]] = []
    try:
        end = time.monotonic() + timeout_s
        got = 0
        while got < n and time.monotonic() < end:
            got = int(r.get("bench:done") or 0)
            if (not marks and got >= n * 0.1 and r.zcard("bench:first") >= workers) \
                    or (len(marks) == 1 and got >= n * 0.9):
                marks.append((got, session_cpu_s(sessions), time.monotonic()))
            for p in procs:
                if p.poll() is not None:
                    raise RuntimeError(f"worker exited {p.returncode} with {got}/{n} done")
            time.sleep(0.005)
        if got < n:
            raise RuntimeError(f"only {got} of {n} jobs done after {timeout_s:g}s")
        time.sleep(0.1)
        first = r.zrange("bench:first", 0, 0, withscores=True)[0][1]
        last = r.zrevrange("bench:last", 0, 0, withscores=True)[0][1]
        extra = int(r.get("bench:done") or 0) - n
        pids = r.zcard("bench:first")
    finally:
        _stop(procs)
    if extra:
        raise RuntimeError(f"{extra} jobs ran more than once")
    wall = last - first
    # (a span of under 40% of the jobs, when the last process came late, is too short for
    # CPU times counted in 10 ms ticks: then the whole drain's rate and no CPU figure)
    steady = len(marks) == 2 and marks[1][0] - marks[0][0] >= 0.4 * n
    cpu = (marks[1][1] - marks[0][1]) / (marks[1][0] - marks[0][0]) * 1e6 if steady else None
    per_s = ((marks[1][0] - marks[0][0]) / (marks[1][2] - marks[0][2]) if steady
             else n / wall)
    return {"per_s": per_s, "us_per_job": 1e6 / per_s, "cpu_us_per_job": cpu,
            "drain_per_s": n / wall, "steady": steady, "wall_s": wall, "jobs": n,
            "mode": mode, "workers": workers, "loop": loop, "job_pids": pids,
            "cmd": " ".join(os.path.basename(c) if i == 0 else c
                            for i, c in enumerate(cmds[0]) if not c.startswith("redis://"))}


def run_recovery(peer: Peer, r: redis.Redis, vt: float | None, cap_s: float,
                 n: int = 100) -> dict[str, Any]:
    r.flushdb()
    peer.enqueue_recovery(n)
    hold = n if peer.per_process_concurrency else 1
    victim = _start_worker(peer, max(n, 1) if peer.per_process_concurrency else 1, vt,
                           {"BENCH_SLEEP_MS": "3600000", "BENCH_COUNT_START": "1",
                            "BENCH_KIND": "recovery"})
    try:
        got = _wait_count(r, "bench:started", hold, 60, [victim])
        if got < hold:
            raise RuntimeError(f"victim started only {got} of {hold} jobs in 60 s")
        time.sleep(0.3)
    except BaseException:
        _stop([victim], signal.SIGKILL)
        raise
    _stop([victim], signal.SIGKILL)
    t0 = time.perf_counter()
    rescuer = _start_worker(peer, n, vt, {"BENCH_SLEEP_MS": "0", "BENCH_KIND": "recovery"})
    try:
        end = t0 + cap_s
        done = 0
        while time.perf_counter() < end:
            done = int(r.get("bench:done") or 0)
            if done >= n:
                break
            if rescuer.poll() is not None:
                raise RuntimeError(f"rescuer exited {rescuer.returncode}")
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
    finally:
        _stop([rescuer])
    out: dict[str, Any] = {"held": hold, "done": done,
                           "recovered_s": elapsed if done >= n else None, "cap_s": cap_s}
    if done < n:
        out["reason"] = peer.recovery_limit(vt) or "not explained (the peer should recover)"
    return out


def percentile(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[max(1, min(len(s), math.ceil(p * len(s) / 100))) - 1]


def run_latency(peer: Peer, r: redis.Redis, n: int, warmup: int) -> dict[str, Any]:
    r.flushdb()
    proc = _start_worker(peer, 100, None, {"BENCH_KIND": "latency"})
    try:
        # warm-up (also waits for the worker to come up)
        end = time.monotonic() + 60
        peer.roundtrip()
        if time.monotonic() > end:
            raise RuntimeError("worker did not come up")
        for _ in range(warmup):
            peer.roundtrip()
        rtt, start = [], []
        for _ in range(n):
            time.sleep(0.005)
            t0 = time.time()
            p0 = time.perf_counter()
            stamp = peer.roundtrip()
            rtt.append((time.perf_counter() - p0) * 1000)
            start.append((float(stamp) - t0) * 1000)
    finally:
        _stop([proc])
    return {"rtt_p50_ms": percentile(rtt, 50), "rtt_p99_ms": percentile(rtt, 99),
            "start_p50_ms": percentile(start, 50), "start_p99_ms": percentile(start, 99)}


def run_enqueue(peer: Peer, r: redis.Redis, n: int, bulk_n: int) -> dict[str, Any]:
    r.flushdb()
    peer.enqueue_one(-1)
    t = time.perf_counter()
    for i in range(n):
        peer.enqueue_one(i)
    out: dict[str, Any] = {"single_per_s": n / (time.perf_counter() - t)}
    if peer.bulk_api:
        r.flushdb()
        t = time.perf_counter()
        peer.enqueue_bulk(bulk_n)
        out["bulk_per_s"] = bulk_n / (time.perf_counter() - t)
        out["bulk_api"] = peer.bulk_api
    return out


def main(make: Callable[[str, argparse.Namespace], Peer], argv: Sequence[str] | None = None
         ) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("workload", choices=("drain", "enqueue", "latency", "io", "recovery",
                                        "cpu", "flow"))
    p.add_argument("--what", default="plain", help="flow: plain, fan, fandeps or chain")
    p.add_argument("--prefill", action="store_true", help="flow: enqueue, then the worker")
    p.add_argument("--url", required=True)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--bulk-n", type=int, default=None)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--concurrency", type=int, default=100)
    p.add_argument("--vt", type=float, default=None)
    p.add_argument("--cap", type=float, default=120.0)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--mode", default="procs", help="cpu: how the peer runs its processes")
    p.add_argument("--loop", type=int, default=0, help="cpu: burn() iterations per job")
    args = p.parse_args(argv)
    peer = make(args.url, args)
    r = redis.Redis.from_url(args.url)
    try:
        peer.setup()
        if args.workload == "drain":
            out = run_drain(peer, r, args.n, args.workers, args.concurrency, 0, args.timeout)
        elif args.workload == "io":
            out = run_drain(peer, r, args.n, 1, args.concurrency, 10, args.timeout)
        elif args.workload == "cpu":
            out = run_cpu(peer, r, args.n, args.workers, args.mode, args.loop, args.timeout)
        elif args.workload == "flow":
            import flowload

            out = flowload.run_flow(peer, r, args.what, args.n, args.concurrency, args.timeout,
                                    args.prefill)
        elif args.workload == "enqueue":
            out = run_enqueue(peer, r, args.n, args.bulk_n or args.n)
        elif args.workload == "latency":
            out = run_latency(peer, r, args.n, args.warmup)
        else:
            out = run_recovery(peer, r, args.vt, args.cap)
    except Exception as exc:  # noqa: BLE001 - reported to the harness
        traceback.print_exc()
        out = {"error": f"{type(exc).__name__}: {exc}"[:800]}
        try:
            reason = peer.explain_error(args.workload, exc)
        except Exception:  # noqa: BLE001 - the explanation is best effort
            traceback.print_exc()
            reason = None
        if reason:
            out["reason"] = reason
    finally:
        with contextlib.suppress(Exception):
            peer.close()
    print(json.dumps(out), flush=True)
    return 0


def median(xs: list[float]) -> float:
    return statistics.median(xs)


class AsyncPeer(Peer):
    """A peer whose producer API is async: one private event loop; the pre-fill enqueues
    (not timed as the enqueue figure) run 200 at a time."""

    def __init__(self, url: str, args: argparse.Namespace) -> None:
        super().__init__(url, args)
        import asyncio

        self.loop = asyncio.new_event_loop()

    def run(self, coro: Any) -> Any:
        return self.loop.run_until_complete(coro)

    async def aenqueue_one(self, i: int) -> None:
        raise NotImplementedError

    async def aroundtrip(self) -> float:
        raise NotImplementedError

    def enqueue_one(self, i: int) -> None:
        self.run(self.aenqueue_one(i))

    def roundtrip(self) -> float:
        return float(self.run(self.aroundtrip()))

    def enqueue_jobs(self, n: int) -> None:
        try:
            self.enqueue_bulk(n)
            return
        except NotImplementedError:
            pass
        import asyncio

        async def fill() -> None:
            for s in range(0, n, 200):
                await asyncio.gather(*(self.aenqueue_one(i) for i in range(s, min(n, s + 200))))

        self.run(fill())


def kind_of(concurrency: int) -> str:
    """What the worker process is for, from its environment: io, victim, or plain."""
    if os.environ.get("BENCH_KIND"):
        return os.environ["BENCH_KIND"]
    return "plain"
