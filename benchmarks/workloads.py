"""The benchmark workloads. Each one runs one repetition and returns its figures by key.

All of them run against the harness's private redis-server; the keyspace is flushed before
each one, so repetitions start from the same state. A workload raises ``BenchError`` when what
it measured is not what it was asked to do (lost jobs, leftovers, a worker that failed).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from streamq import AsyncQueue, Queue
from streamq._core.keys import GROUP, Keys

REPO = Path(__file__).resolve().parent.parent


class BenchError(RuntimeError):
    """A workload did not do what it was asked (the run exits non-zero)."""


@dataclass(frozen=True)
class Sizes:
    jobs: int = 20_000
    """Jobs for the ceiling, enqueue_many and drain workloads."""
    single: int = 2_000
    """Sequential single enqueues."""
    latency_jobs: int = 500
    latency_pause_s: float = 0.005
    latency_warmup: int = 20
    concurrency: int = 100
    """Worker concurrency of the headline drain figure and of the latency worker."""
    sweep: tuple[str, ...] = ("10", "50", "250", "1000", "100/50")
    """Further drain runs (context rows, no target): "concurrency" or "concurrency/fetch_batch"."""
    raw_count: int = 100
    """COUNT of the raw XREADGROUP loop."""
    memory_jobs: int = 100_000
    """Jobs of the memory workload's small-payload run."""
    memory_big_jobs: int = 20_000
    """Jobs of its 200-byte and 2-KB payload runs."""
    round_trips: int = 500
    """enqueue_and_wait calls of the round_trip workload (after latency_warmup ones)."""
    producers: int = 100
    """Coroutines of the enqueue_concurrent workload, each enqueueing one job at a time."""
    worker_timeout_s: float = 300.0


@dataclass
class Ctx:
    url: str
    sizes: Sizes
    client: redis.Redis
    log: Callable[[str], None]


Result = dict[str, float]


def flush(client: redis.Redis, timeout_s: float = 60.0) -> None:
    """Empty the server and wait until it has freed what it held. ``FLUSHALL SYNC``: a plain
    FLUSHALL frees in a background thread where ``lazyfree-lazy-user-flush`` is on (Valkey 8+
    by default), and the server's other lazy frees (expired and deleted keys) may still be
    under way, so the next figure would count bytes and CPU of the previous run. Waits for
    ``INFO memory`` ``lazyfree_pending_objects`` to reach 0."""
    client.execute_command("FLUSHALL", "SYNC")  # type: ignore[no-untyped-call]
    settle(client, timeout_s)


def settle(client: redis.Redis, timeout_s: float = 60.0) -> None:
    """Wait until the server's background (lazy) freeing is done: ``lazyfree_pending_objects``
    is 0 (a server without the field has none)."""
    end = time.monotonic() + timeout_s
    while int(client.info("memory").get("lazyfree_pending_objects", 0)):
        if time.monotonic() > end:
            raise BenchError(f"lazy freeing still pending after {timeout_s:.0f} s")
        time.sleep(0.01)


def _fresh(ctx: Ctx, prefix: str) -> str:
    flush(ctx.client)
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def redis_cpu_s(client: redis.Redis) -> float:
    info: Any = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _jobs(n: int, job_type: str = "noop") -> list[dict[str, Any]]:
    return [{"type": job_type, "payload": {"n": i}} for i in range(n)]


def _check_empty(client: redis.Redis, keys: Keys, expect_completed: int | None) -> None:
    left = int(client.xlen(keys.stream))
    pending: Any = client.xpending(keys.stream, GROUP)
    if left or int(pending["pending"]):
        raise BenchError(f"{keys.queue}: {left} entries left in the stream,"
                         f" {pending['pending']} pending after the drain")
    if expect_completed is not None:
        done = int(client.hget(keys.stats, "completed") or 0)
        if done != expect_completed:
            raise BenchError(f"{keys.queue}: stats say {done} completed, expected"
                             f" {expect_completed}")


# --------------------------------------------------------------------------- ceiling


def ceiling(ctx: Ctx) -> Result:
    """Raw redis-py on the same server: pipelined XADD, then XREADGROUP COUNT k + XACK + XDEL."""
    n = ctx.sizes.jobs
    count = ctx.sizes.raw_count
    r = ctx.client
    stream = f"raw:{{{_fresh(ctx, 'raw')}}}:stream"
    group, consumer = "g", "c"
    r.xgroup_create(stream, group, id="0", mkstream=True)
    ids = [os.urandom(16).hex() for _ in range(n)]
    t0 = time.perf_counter()
    for i in range(0, n, 1000):
        pipe = r.pipeline(transaction=False)
        for jid in ids[i:i + 1000]:
            pipe.xadd(stream, {"id": jid})
        pipe.execute()
    xadd_s = time.perf_counter() - t0
    if int(r.xlen(stream)) != n:
        raise BenchError("raw XADD: stream length differs from entries added")

    # One round trip per batch: acknowledge and delete the previous batch, read the next.
    seen = 0
    prev: list[bytes] = []
    rcpu0, cpu0, t0 = redis_cpu_s(r), time.process_time(), time.perf_counter()
    while True:
        pipe = r.pipeline(transaction=False)
        if prev:
            pipe.xack(stream, group, *prev)
            pipe.xdel(stream, *prev)
        pipe.xreadgroup(group, consumer, {stream: ">"}, count=count)
        reply: Any = pipe.execute()[-1]
        entries = reply[0][1] if reply else []
        if not entries and not prev:
            break
        prev = [eid for eid, _fields in entries]
        seen += len(entries)
    drain_s = time.perf_counter() - t0
    cpu, rcpu = time.process_time() - cpu0, redis_cpu_s(r) - rcpu0
    if seen != n or int(r.xlen(stream)) != 0:
        raise BenchError(f"raw drain: read {seen} of {n}, {r.xlen(stream)} left")
    return {
        "raw_xadd_per_s": n / xadd_s,
        "raw_drain_per_s": n / drain_s,
        "raw_drain_cpu_us": cpu / n * 1e6,
        "raw_drain_redis_cpu_us": rcpu / n * 1e6,
    }


# --------------------------------------------------------------------------- producers


def enqueue_many(ctx: Ctx) -> Result:
    n = ctx.sizes.jobs
    name = _fresh(ctx, "many")
    jobs = _jobs(n)
    with Queue.from_url(ctx.url, name) as q:
        rcpu0, cpu0, t0 = redis_cpu_s(ctx.client), time.process_time(), time.perf_counter()
        results = q.enqueue_many(jobs)
        wall = time.perf_counter() - t0
        cpu, rcpu = time.process_time() - cpu0, redis_cpu_s(ctx.client) - rcpu0
        bad = [r for r in results if r.status != "queued"]
        if len(results) != n or bad or int(ctx.client.xlen(q.keys.stream)) != n:
            raise BenchError(f"enqueue_many: {len(results)} results, {len(bad)} not queued")
    return {
        "enqueue_many_per_s": n / wall,
        "enqueue_many_cpu_us": cpu / n * 1e6,
        "enqueue_many_redis_cpu_us": rcpu / n * 1e6,
    }


def enqueue_single(ctx: Ctx) -> Result:
    n = ctx.sizes.single
    name = _fresh(ctx, "single")
    with Queue.from_url(ctx.url, name) as q:
        q.enqueue("noop", {"n": -1})  # connect and load the script outside the timing
        t0 = time.perf_counter()
        for i in range(n):
            q.enqueue("noop", {"n": i})
        wall = time.perf_counter() - t0
        if int(ctx.client.xlen(q.keys.stream)) != n + 1:
            raise BenchError("enqueue: stream length differs from jobs enqueued")
    return {"enqueue_per_s": n / wall, "enqueue_us": wall / n * 1e6}


def enqueue_concurrent(ctx: Ctx) -> Result:
    """``producers`` coroutines of one process, each awaiting ``AsyncQueue.enqueue`` of one
    job at a time, ``jobs`` jobs in all: the calls that meet one in flight batch themselves."""
    import asyncio

    n, c = ctx.sizes.jobs, ctx.sizes.producers
    name = _fresh(ctx, "conc")

    async def run() -> tuple[float, float, int]:
        async with AsyncQueue.from_url(ctx.url, name) as q:
            await q.enqueue("noop", {"n": -1})  # connect and load the script first
            todo = iter(range(n))

            async def producer() -> int:
                done = 0
                for i in todo:
                    r = await q.enqueue("noop", {"n": i})
                    done += r.status == "queued"
                return done

            cpu0, t0 = time.process_time(), time.perf_counter()
            counts = await asyncio.gather(*(producer() for _ in range(c)))
            return time.perf_counter() - t0, time.process_time() - cpu0, sum(counts)

    rcpu0 = redis_cpu_s(ctx.client)
    wall, cpu, queued = asyncio.run(run())
    rcpu = redis_cpu_s(ctx.client) - rcpu0
    if queued != n or int(ctx.client.xlen(Keys(name).stream)) != n + 1:
        raise BenchError(f"enqueue_concurrent: {queued} of {n} queued")
    return {
        "enqueue_conc_per_s": n / wall,
        "enqueue_conc_cpu_us": cpu / n * 1e6,
        "enqueue_conc_redis_cpu_us": rcpu / n * 1e6,
    }


# --------------------------------------------------------------------------- worker process


def worker_cmd(url: str, queue: str, mode: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "benchmarks.worker_proc", "--url", url, "--queue", queue,
            "--mode", mode, *extra]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


def _last_json(stdout: str) -> dict[str, Any]:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            out: dict[str, Any] = json.loads(line)
            return out
    raise BenchError(f"worker printed no summary; stdout: {stdout[-500:]!r}")


def drain_key(concurrency: int, fetch_batch: int | None = None) -> str:
    return f"drain_c{concurrency}" + (f"_f{fetch_batch}" if fetch_batch else "")


def parse_sweep(item: str) -> tuple[int, int | None]:
    """ "250" -> (250, None); "100/50" -> (100, 50)."""
    c, _, f = item.partition("/")
    return int(c), (int(f) if f else None)


def drain_at(ctx: Ctx, concurrency: int, fetch_batch: int | None = None) -> Result:
    """Pre-enqueue N no-op jobs, then one worker process drains them."""
    n = ctx.sizes.jobs
    name = _fresh(ctx, f"drain{concurrency}")
    with Queue.from_url(ctx.url, name) as q:
        q.enqueue_many(_jobs(n))
        keys = q.keys
    rcpu0 = redis_cpu_s(ctx.client)
    cmd = worker_cmd(ctx.url, name, "drain", "--jobs", str(n), "--concurrency",
                     str(concurrency), "--timeout", str(ctx.sizes.worker_timeout_s))
    if fetch_batch:
        cmd += ["--fetch-batch", str(fetch_batch)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=_env(),
                              timeout=ctx.sizes.worker_timeout_s + 60, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"drain worker (concurrency {concurrency}) hung") from exc
    rcpu = redis_cpu_s(ctx.client) - rcpu0
    if proc.returncode != 0:
        raise BenchError(f"drain worker exited {proc.returncode}: {proc.stderr[-2000:]}"
                         f" {proc.stdout[-500:]}")
    out = _last_json(proc.stdout)
    _check_empty(ctx.client, keys, n)
    wall = float(out["wall_s"])
    k = drain_key(concurrency, fetch_batch)
    return {
        f"{k}_per_s": n / wall,
        f"{k}_cpu_us": float(out["cpu_s"]) / n * 1e6,
        f"{k}_redis_cpu_us": rcpu / n * 1e6,
    }


def drain(ctx: Ctx) -> Result:
    return drain_at(ctx, ctx.sizes.concurrency)


def drain_sweep(ctx: Ctx) -> Result:
    out: Result = {}
    for item in ctx.sizes.sweep:
        c, f = parse_sweep(item)
        if (c, f) != (ctx.sizes.concurrency, None):
            out.update(drain_at(ctx, c, f))
    return out


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile (p in 0..100) of a non-empty list."""
    s = sorted(values)
    rank = max(1, min(len(s), math.ceil(p * len(s) / 100)))
    return s[rank - 1]


def _serve(ctx: Ctx, cmd: list[str]) -> subprocess.Popen[str]:
    """Start a serving worker process and wait for its ready line."""
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=REPO, env=_env())
    assert proc.stdout is not None
    ready = proc.stdout.readline()
    if '"ready"' not in ready:
        proc.kill()
        _out, err = proc.communicate()
        raise BenchError(f"worker process did not start: {ready!r} {err[-2000:]}")
    return proc


def _finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    """Close the process's stdin (it stops and prints its summary); the summary."""
    try:
        rest, err = proc.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        rest, err = proc.communicate()
    if proc.returncode != 0:
        raise BenchError(f"worker process exited {proc.returncode}: {err[-2000:]}")
    return _last_json(rest)


def raw_latency(ctx: Ctx) -> Result:
    """Ceiling of the idle latency: XADD -> a plain consumer blocked in XREADGROUP."""
    sz = ctx.sizes
    stream = f"raw:{{{_fresh(ctx, 'rawlat')}}}:stream"
    proc = _serve(ctx, worker_cmd(ctx.url, stream, "raw"))
    try:
        r = ctx.client
        for _ in range(sz.latency_warmup):
            r.xadd(stream, {"t": repr(time.time())})
        time.sleep(0.05)
        for _ in range(sz.latency_jobs):
            time.sleep(sz.latency_pause_s)
            r.xadd(stream, {"t": repr(time.time())})
        time.sleep(0.05)
        round_trips = _raw_round_trips(ctx, stream)
        rtts = []
        for _ in range(200):
            t = time.perf_counter()
            r.ping()
            rtts.append(time.perf_counter() - t)
    finally:
        summary = _finish(proc)
    lat = [float(x) for x in summary["latencies_ms"]][sz.latency_warmup:]
    if len(lat) != sz.latency_jobs:
        raise BenchError(f"raw consumer saw {len(lat)} of {sz.latency_jobs} entries")
    return {
        "raw_latency_p50_ms": percentile(lat, 50),
        "raw_latency_p99_ms": percentile(lat, 99),
        "ping_us": statistics.median(rtts) * 1e6,
        "raw_rtt_p50_ms": percentile(round_trips, 50),
        "raw_rtt_p99_ms": percentile(round_trips, 99),
    }


def _raw_round_trips(ctx: Ctx, stream: str) -> list[float]:
    """Ceiling of enqueue_and_wait, with the same four wake-ups and thread hand-over: a script
    adds an entry, the blocked plain consumer wakes and answers with a script that PUBLISHes,
    a subscriber thread wakes the caller. Milliseconds from the call to the caller's wake."""
    sz = ctx.sizes
    client = redis.Redis.from_url(ctx.url, protocol=2)
    add = client.register_script("return redis.call('XADD', KEYS[1], '*', 'r', ARGV[1])")
    channel = f"{stream}:answers"
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(channel)
    answered = threading.Event()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            if pubsub.get_message(timeout=0.2):
                answered.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    out: list[float] = []
    try:
        for i in range(sz.latency_warmup + sz.latency_jobs):
            time.sleep(sz.latency_pause_s)
            answered.clear()
            t = time.perf_counter()
            add(keys=[stream], args=[channel])
            if not answered.wait(5.0):
                raise BenchError("raw round trip: no answer within 5 s")
            if i >= sz.latency_warmup:
                out.append((time.perf_counter() - t) * 1000)
    finally:
        stop.set()
        reader.join(timeout=2)
        pubsub.close()
        client.close()
    return out


def latency(ctx: Ctx) -> Result:
    """Idle enqueue→start latency: one job at a time into a waiting worker process."""
    sz = ctx.sizes
    name = _fresh(ctx, "latency")
    proc = _serve(ctx, worker_cmd(ctx.url, name, "serve", "--concurrency", str(sz.concurrency)))
    try:
        with Queue.from_url(ctx.url, name) as q:
            # warm-up: connections, script cache, the worker's first BLOCK
            warm = [q.enqueue("stamp").job_id for _ in range(sz.latency_warmup)]
            _wait_done(q, warm, 30.0)
            sent: list[tuple[str, float]] = []
            for _ in range(sz.latency_jobs):
                time.sleep(sz.latency_pause_s)
                t = time.time()
                r = q.enqueue("stamp")
                sent.append((r.job_id, t))
            infos = _wait_done(q, [j for j, _ in sent], 30.0)
            lat_ms = [(float(info.result) - t) * 1000 for info, (_j, t) in
                      zip(infos, sent, strict=True)]
    finally:
        summary = _finish(proc)
    if summary["completed"] != sz.latency_jobs + sz.latency_warmup:
        raise BenchError(f"latency worker completed {summary['completed']} jobs")
    return {
        "latency_p50_ms": percentile(lat_ms, 50),
        "latency_p99_ms": percentile(lat_ms, 99),
        "latency_max_ms": max(lat_ms),
    }


def round_trip(ctx: Ctx) -> Result:
    """Idle enqueue→result: ``Queue.enqueue_and_wait`` of a no-op job, one call at a time
    (``latency_pause_s`` apart), into a waiting worker process; the call's wall time."""
    sz = ctx.sizes
    name = _fresh(ctx, "rtt")
    proc = _serve(ctx, worker_cmd(ctx.url, name, "serve", "--concurrency", str(sz.concurrency)))
    try:
        with Queue.from_url(ctx.url, name) as q:
            for _ in range(sz.latency_warmup):  # connections, scripts, the shared subscriber
                q.enqueue_and_wait("noop", timeout=30.0)
            rtt_ms = []
            for _ in range(sz.round_trips):
                time.sleep(sz.latency_pause_s)
                t = time.perf_counter()
                q.enqueue_and_wait("noop", timeout=30.0)
                rtt_ms.append((time.perf_counter() - t) * 1000)
    finally:
        summary = _finish(proc)
    if summary["completed"] != sz.round_trips + sz.latency_warmup:
        raise BenchError(f"round-trip worker completed {summary['completed']} jobs")
    return {
        "rtt_p50_ms": percentile(rtt_ms, 50),
        "rtt_p99_ms": percentile(rtt_ms, 99),
    }


def _wait_done(q: Queue, ids: list[str], timeout_s: float) -> list[Any]:
    """Wait until every job finished; their records in ``ids`` order (all must be completed)."""
    end = time.monotonic() + timeout_s
    infos: dict[str, Any] = {}
    todo = list(ids)
    while todo:
        for jid in todo:
            info = q.get(jid)
            if info is None or not info.finished:
                break
            infos[jid] = info
        todo = [j for j in todo if j not in infos]
        if todo:
            if time.monotonic() > end:
                raise BenchError(f"{len(todo)} jobs not finished after {timeout_s:g}s")
            time.sleep(0.01)
    bad = [i for i in infos.values() if i.state != "completed"]
    if bad:
        raise BenchError(f"{len(bad)} of {len(ids)} jobs did not complete")
    return [infos[j] for j in ids]


def memory(ctx: Ctx) -> Result:
    """Redis memory per job (benchmarks/memory.py, which builds on this module)."""
    from .memory import memory as run

    return run(ctx)


WORKLOADS: dict[str, Callable[[Ctx], Result]] = {
    "ceiling": ceiling,
    "enqueue_many": enqueue_many,
    "enqueue": enqueue_single,
    "enqueue_concurrent": enqueue_concurrent,
    "drain": drain,
    "latency": latency,
    "round_trip": round_trip,
    "raw_latency": raw_latency,
    "sweep": drain_sweep,
    "memory": memory,
}
"""Run order within one repetition."""
