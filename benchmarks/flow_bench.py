"""Workflows' first numbers: ``python -m benchmarks.flow_bench [--fan 10000] [--chain 200]``.

Against a fresh private redis-server, one in-process worker (concurrency 100), no-op handlers:

1. a plain drain of ``fan`` pre-enqueued jobs (the reference rate);
2. a ``fan`` -> 1 fan-in: the same jobs with one job waiting for all of them (``depends_on``),
   timed until the waiting job completed: its rate as a share of the plain drain's;
3. a chain of ``chain`` steps in one queue (each step waits for the previous one): steps/s,
   i.e. the same-slot hand-off plus one fetch and one settle per step;
4. a batch of ``fan`` jobs with on_success, on_complete and on_death (docs/workflows.md#batches),
   added 1,000 at a time and closed before the worker starts, timed until on_complete
   completed: its rate as a share of the plain drain's (each job's end resolves three
   callbacks), plus the producer's time to add the jobs and the workflow keys left after.

``--handoff N [--handoff-cross M]`` runs only the hand-off measure: a chain of N steps in one
queue (same slot: the parent is released inline by the child's finish.lua) and a chain of M
steps (30) alternating
between two queues (cross slot: each hand-off goes through the child's outbox and the relay),
one idle worker serving both; each step's handler notes when it starts and returns, and a
hand-off is the time from a step's return to the next step's start (settle, release, fetch,
start). Prints p50/p95/max per kind, and how many steps the worker was handed started
(by the finish.lua or resolve.lua that released them: docs/workflows.md#hand-off).
``--breakdown`` also times the worker's script calls between a step's return and the next
step's start (each script's first call there: when it was sent, its round trip, and from its
reply to the next start).

``--live-pairs K`` runs only a plain drain and a ``fan`` -> 1 chord
(``chord(group(fan no-ops), sink)``) with the worker already running, each timed from the
producer's first enqueue call to the last job's end (issue #29), K interleaved pairs: each
pair's ratio, the ``enqueue_flow`` call's own time and the median. ``--profile`` instead
profiles one chord's ``enqueue_flow`` (cProfile, top functions) with and without a live worker,
and prints the server's INFO commandstats for each.

``--batch-pairs K`` runs only the plain drain and the batch, K interleaved pairs, and prints
each pair's ratio and the median (on a busy machine one pair says little).

Prints Markdown. A rough first measure (one process for worker and clock); the issue's full
benchmarks (idle hand-off p50, peers side by side) come later.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import time
from typing import Any

import attrs

from streamq import JobSpec, Queue, Registry, Worker, WorkerConfig, chain
from streamq._core.server import RedisServer


def _registry() -> Registry:
    reg = Registry()

    @reg.handler("noop")
    async def noop(job: Any) -> int:
        return 1

    @reg.handler("sink")
    async def sink(job: Any) -> int:
        return len(job.dependency_results())

    return reg


async def _until(q: Queue, job_id: str, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        info = await asyncio.to_thread(q.get, job_id)
        if info is not None and info.finished:
            return
        await asyncio.sleep(0.005)
    raise TimeoutError(job_id)


async def _run(url: str, name: str, setup: Any, last: str) -> float:
    cfg = attrs.evolve(WorkerConfig(), concurrency=100, promote_interval_s=0.05)
    with Queue.from_url(url, name) as q:
        setup(q)
        t0 = time.perf_counter()
        async with Worker(url, [name], _registry(), cfg):
            await _until(q, last, 600)
            return time.perf_counter() - t0


def _batch_setup(n: int, added: list[float]) -> Any:
    def batch(q: Queue) -> None:
        t = time.perf_counter()
        b = q.batch(on_success=JobSpec("noop"), on_complete=JobSpec("sink"),
                    on_death=JobSpec("noop"), batch_id="b")
        for i in range(0, n, 1000):
            b.add([JobSpec("noop", job_id=f"j{k}") for k in range(i, min(n, i + 1000))])
        b.close()
        added.append(time.perf_counter() - t)
    return batch


def _left(url: str, name: str) -> tuple[list[str], int]:
    with Queue.from_url(url, name) as q:
        cbs = [q.get(f"b.{k}") for k in ("on_success", "on_complete", "on_death")]
        left = sum(1 for k in q.client.scan_iter(match=f"streamq:{{{name}}}:*", count=1000)
                   if any(p in k for p in (b":deps:", b":dres:", b":par:")))
    return [c.state if c else "" for c in cbs], left


def _pairs(n: int, pairs: int) -> int:
    jobs = [{"type": "noop", "job_id": f"j{i}"} for i in range(n)]
    ratios: list[float] = []
    added: list[float] = []
    print(f"# A {n:,}-job batch (3 callbacks) vs a plain drain, {pairs} interleaved pairs\n")
    with RedisServer() as srv:
        for k in range(pairs):
            plain = asyncio.run(_run(srv.url, f"plain{k}", lambda q: q.enqueue_many(jobs),
                                     f"j{n - 1}"))
            bat = asyncio.run(_run(srv.url, f"batch{k}", _batch_setup(n, added),
                                   "b.on_complete"))
            states, left = _left(srv.url, f"batch{k}")
            ratios.append(plain / bat)
            print(f"- pair {k + 1}: plain {n / plain:,.0f} jobs/s, batch {n / bat:,.0f} jobs/s"
                  f" ({plain / bat:.0%}); adding + closing {added[-1]:.2f} s;"
                  f" callbacks {states}; workflow keys left {left}")
    ratios.sort()
    print(f"\nmedian: the batch drains at {ratios[len(ratios) // 2]:.0%} of the plain rate")
    return 0


_MARKS: dict[str, tuple[float, float]] = {}
_LAST: dict[str, asyncio.Event] = {}


def _handoff_registry() -> Registry:
    reg = Registry()

    @reg.handler("step")
    async def step(job: Any) -> int:
        t = time.perf_counter()
        _MARKS[job.id] = (t, time.perf_counter())
        if job.id in _LAST:
            _LAST[job.id].set()
        return 1

    return reg


_CALLS: list[tuple[str, float, float]] = []
"""With --breakdown: (script, sent, answered) of every script call the worker made."""


def _time_scripts() -> None:
    """Time every script call in this process (the worker's): --breakdown."""
    from streamq._core.scripts import SCRIPTS, Script

    def timed(name: str, run: Any) -> Any:
        async def run_async(*a: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return await run(*a, **kw)
            finally:
                _CALLS.append((name, t, time.perf_counter()))
        return run_async

    for name, script in SCRIPTS.items():
        if isinstance(script, Script):
            script.run_async = timed(name, script.run_async)  # type: ignore[method-assign]


def _breakdown(ids: list[str]) -> dict[str, list[float]]:
    """Per hand-off (a step's return to the next step's start): the script calls made in
    between, as (sent - return, answered - sent, start - answered) of the first call of
    each script after the return."""
    out: dict[str, list[float]] = {}
    for a, b in itertools.pairwise(ids):
        if a not in _MARKS or b not in _MARKS:
            continue
        end, start = _MARKS[a][1], _MARKS[b][0]
        seen: set[str] = set()
        for name, t0, t1 in sorted(_CALLS, key=lambda c: c[1]):
            if end <= t0 <= start and name not in seen and name != "ticket":
                seen.add(name)
                out.setdefault(f"return -> {name}.lua sent", []).append((t0 - end) * 1000)
                out.setdefault(f"{name}.lua round trip", []).append((t1 - t0) * 1000)
                if t1 <= start:
                    out.setdefault(f"{name}.lua reply -> next start", []).append(
                        (start - t1) * 1000)
    return out


async def _chain_run(url: str, queues: list[str], steps: int, fid: str,
                     stats: dict[str, int]) -> list[float]:
    """One chain of ``steps`` no-op steps, step i in queues[i % len(queues)], run by one worker
    serving every queue; returns each hand-off (ms, one step's return to the next's start).
    ``stats`` gets the worker's count of jobs handed over (started for it by a script)."""
    cfg = attrs.evolve(WorkerConfig(), concurrency=10)
    flow = chain(*(JobSpec("step", queue=queues[i % len(queues)]) for i in range(steps)))
    async with Worker(url, queues, _handoff_registry(), cfg) as w:
        await asyncio.sleep(0.5)  # the worker idle in its blocking read
        done = _LAST[f"{fid}.{steps - 1}"] = asyncio.Event()
        _CALLS.clear()
        with Queue.from_url(url, queues[0]) as q:
            q.enqueue_flow(flow, flow_id=fid)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 60 + steps * 2.0)
        stats["handed"] = w.stats.handed_over
        stats["started"] = w.stats.started
    ids = [f"{fid}.{i}" for i in range(steps)]
    return [(_MARKS[b][0] - _MARKS[a][1]) * 1000 for a, b in itertools.pairwise(ids)
            if a in _MARKS and b in _MARKS]


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def _handoff(steps: int, cross: int, breakdown: bool = False) -> int:
    print(f"# Hand-off: a step's return to the next step's start ({steps}-step chain in one"
          f" queue, {cross}-step chain across two)\n")
    if breakdown:
        _time_scripts()
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[0]}\n")
    with RedisServer() as srv:
        for kind, queues, k in (("same slot", ["ha"], steps),
                                ("cross slot", ["hb", "hc"], cross)):
            t0 = time.perf_counter()
            stats: dict[str, int] = {}
            fid = f"h{len(queues)}"
            hs = asyncio.run(_chain_run(srv.url, queues, k, fid, stats))
            took = time.perf_counter() - t0
            if len(hs) < k - 1:
                print(f"- {kind}: only {len(hs) + 1} of {k} steps ran")
                continue
            print(f"- {kind}: p50 {_pct(hs, 0.5):.2f} ms, p95 {_pct(hs, 0.95):.2f} ms,"
                  f" max {max(hs):.2f} ms over {len(hs)} hand-offs ({took:.1f} s in all);"
                  f" {stats.get('handed', 0)} of {stats.get('started', 0)} steps handed over"
                  f" started")
            if breakdown:
                for what, xs in _breakdown([f"{fid}.{i}" for i in range(k)]).items():
                    print(f"  - {what}: p50 {_pct(xs, 0.5):.2f} ms ({len(xs)} hand-offs)")
    return 0


async def _live(url: str, name: str, start: Any, last: str, took: list[float]) -> float:
    """``start(q)`` with the worker already idle in its blocking read; the time from the call
    to ``last``'s end (``took`` gets the call's own time)."""
    cfg = attrs.evolve(WorkerConfig(), concurrency=100, promote_interval_s=0.05)
    with Queue.from_url(url, name) as q:
        async with Worker(url, [name], _registry(), cfg):
            await asyncio.sleep(0.3)
            t0 = time.perf_counter()
            await asyncio.to_thread(start, q)
            took.append(time.perf_counter() - t0)
            await _until(q, last, 600)
            return time.perf_counter() - t0


def _chord_of(n: int) -> Any:
    from streamq import chord, group
    return chord(group(JobSpec("noop") for _ in range(n)), JobSpec("sink"))


def _live_pairs(n: int, pairs: int) -> int:
    jobs = [{"type": "noop", "job_id": f"j{i}"} for i in range(n)]
    flow = _chord_of(n)
    ratios: list[float] = []
    print(f"# A {n:,} -> 1 chord with a live worker vs a plain drain, from the first enqueue,"
          f" {pairs} interleaved pairs\n")
    with open("/proc/loadavg") as f:
        print(f"load average before: {f.read().split()[0]}\n")
    with RedisServer() as srv:
        for k in range(pairs):
            took: list[float] = []
            plain = asyncio.run(_live(srv.url, f"lp{k}", lambda q: q.enqueue_many(jobs),
                                      f"j{n - 1}", took))
            fan = asyncio.run(_live(srv.url, f"lc{k}",
                                    lambda q: q.enqueue_flow(flow, flow_id="c"),
                                    f"c.{n}", took))
            ratios.append(plain / fan)
            print(f"- pair {k + 1}: plain {n / plain:,.0f} jobs/s, chord {n / fan:,.0f} jobs/s"
                  f" ({plain / fan:.0%}); enqueue_many {took[0]:.2f} s, enqueue_flow"
                  f" {took[1]:.2f} s")
    with open("/proc/loadavg") as f:
        print(f"\nload average after: {f.read().split()[0]}")
    ratios.sort()
    print(f"\nmedian: the chord runs at {ratios[len(ratios) // 2]:.0%} of the plain rate")
    return 0


def _profile(n: int) -> int:
    import cProfile
    import io
    import pstats

    flow = _chord_of(n)
    for live in (False, True):
        with RedisServer() as srv:
            prof = cProfile.Profile()
            took: list[float] = []
            stats: dict[str, Any] = {}

            def start(q: Queue, prof: Any = prof, stats: dict[str, Any] = stats) -> None:
                q.client.config_resetstat()
                prof.enable()
                try:
                    q.enqueue_flow(flow, flow_id="c")
                finally:
                    prof.disable()
                    stats.update(q.client.info("commandstats"))

            if live:
                asyncio.run(_live(srv.url, "pf", start, f"c.{n}", took))
            else:
                with Queue.from_url(srv.url, "pf") as q:
                    t0 = time.perf_counter()
                    start(q)
                    took.append(time.perf_counter() - t0)
            print(f"## enqueue_flow of a {n:,} -> 1 chord, {'live' if live else 'no'} worker:"
                  f" {took[0]:.2f} s\n")
            out = io.StringIO()
            pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(12)
            print("```\n" + out.getvalue().strip() + "\n```\n")
            print("commandstats during the call (calls, usec):\n")
            for cmd, v in sorted(stats.items(), key=lambda kv: -kv[1]["usec"])[:10]:
                print(f"- {cmd}: {v['calls']:,} calls, {v['usec'] / 1e6:.3f} s")
            print()
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fan", type=int, default=10_000)
    ap.add_argument("--chain", type=int, default=200)
    ap.add_argument("--batch-pairs", type=int, default=0)
    ap.add_argument("--handoff", type=int, default=0)
    ap.add_argument("--handoff-cross", type=int, default=30)
    ap.add_argument("--breakdown", action="store_true",
                    help="with --handoff: time the worker's script calls in between")
    ap.add_argument("--live-pairs", type=int, default=0)
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)
    n = a.fan
    if a.live_pairs:
        return _live_pairs(n, a.live_pairs)
    if a.profile:
        return _profile(n)
    if a.handoff:
        return _handoff(a.handoff, a.handoff_cross, a.breakdown)
    if a.batch_pairs:
        return _pairs(n, a.batch_pairs)
    added: list[float] = []
    with RedisServer() as srv:
        jobs = [{"type": "noop", "job_id": f"j{i}"} for i in range(n)]
        plain = asyncio.run(_run(srv.url, "plain", lambda q: q.enqueue_many(jobs),
                                 f"j{n - 1}"))

        def fan_in(q: Queue) -> None:
            q.enqueue_many(jobs)
            q.enqueue("sink", job_id="sink", depends_on=[j["job_id"] for j in jobs])

        fan = asyncio.run(_run(srv.url, "fan", fan_in, "sink"))
        steps = a.chain
        flow = chain(*(JobSpec("noop") for _ in range(steps)))
        ch = asyncio.run(_run(srv.url, "chain", lambda q: q.enqueue_flow(flow, flow_id="c"),
                              f"c.{steps - 1}"))
        bat = asyncio.run(_run(srv.url, "batch", _batch_setup(n, added), "b.on_complete"))
        states, left = _left(srv.url, "batch")
    print(f"# Workflows, first numbers ({n:,}-job fan-in, {steps}-step chain)\n")
    print(f"- plain drain of {n:,}: {n / plain:,.0f} jobs/s")
    print(f"- {n:,} -> 1 fan-in, until the waiting job completed: {n / fan:,.0f} jobs/s"
          f" ({plain / fan:.0%} of the plain drain's rate)")
    print(f"- chain of {steps} steps in one queue: {steps / ch:,.0f} steps/s"
          f" ({ch / steps * 1000:.1f} ms per step)")
    print(f"- batch of {n:,} with 3 callbacks, until on_complete completed: {n / bat:,.0f}"
          f" jobs/s ({plain / bat:.0%} of the plain drain's rate); adding the jobs (1,000 per"
          f" add) and closing: {added[0]:.2f} s; callbacks {states}; workflow keys left {left}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
