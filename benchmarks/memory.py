"""The ``memory`` workload: Redis memory per job, from ``INFO memory`` used_memory deltas.

For each payload size (the issue's small integer payload ``{"n": i}``, about 200 bytes and
about 2 KB of JSON), on a server flushed with ``FLUSHALL SYNC`` whose lazy freeing is done
(``lazyfree_pending_objects`` 0, before every reading: Valkey 8+ frees in the background, and
a reading taken meanwhile reported about half the bytes per job there): enqueue N jobs with
``enqueue_many`` (queued: the record, its stream entry, the events and stats they cost), then
let one worker process run them all with a no-op handler that returns None (finished: every
record kept for its result TTL, 24 h by default). Both figures are the used_memory growth over
the empty server divided by N. A per-structure breakdown of the queued small-payload jobs
comes from ``MEMORY USAGE`` (sampled records, the stream, the events stream, the stats hash);
the rest of the delta is the keyspace's own tables (hash buckets, expiry entries).

The queue is named ``bench`` (5 characters): a record's key is ``streamq:{bench}:job:<id>``,
and a queue name of 8 or more characters moves default-id keys into the next allocation size
class (16 bytes more per job); docs/performance.md#memory-per-job says where every byte goes.
"""

from __future__ import annotations

import subprocess
from typing import Any

import redis

from streamq import Queue
from streamq._core.keys import Keys

from .workloads import (
    REPO,
    BenchError,
    Ctx,
    Result,
    _check_empty,
    _env,
    _last_json,
    flush,
    settle,
    worker_cmd,
)

QUEUE = "bench"
PAYLOADS: dict[str, int] = {"small": 0, "200b": 200, "2kb": 2048}
"""Payload kinds: small is ``{"n": i}`` (7-11 bytes of JSON); others are padded to the size."""


def used_memory(client: redis.Redis) -> int:
    """``used_memory`` once the server's lazy freeing is done (Valkey 8+ frees deleted and
    flushed values in the background: read before, the figure still holds what is going)."""
    settle(client)
    return int(client.info("memory")["used_memory"])


def payload(kind: str, i: int) -> dict[str, Any]:
    size = PAYLOADS[kind]
    if not size:
        return {"n": i}
    base = len(f'{{"n":{i},"s":""}}')
    return {"n": i, "s": "x" * max(0, size - base)}


def _sample_usage(client: redis.Redis, keys: Keys, ids: list[str]) -> float:
    got = [client.memory_usage(keys.job(j), samples=0) or 0 for j in ids]
    return sum(got) / max(1, len(got))


def measure(ctx: Ctx, kind: str, n: int) -> Result:
    client = ctx.client
    flush(client)
    base = used_memory(client)
    with Queue.from_url(ctx.url, QUEUE) as q:
        ids: list[str] = []
        for at in range(0, n, 1000):
            res = q.enqueue_many([{"type": "noop", "payload": payload(kind, i)}
                                  for i in range(at, min(n, at + 1000))])
            ids += [r.job_id for r in res]
        keys = q.keys
    queued = used_memory(client) - base
    out: Result = {f"mem_{kind}_queued_b": queued / n}
    if kind == "small":
        sample = ids[:: max(1, n // 200)]
        enc = {client.object("encoding", keys.job(j)) for j in sample}
        if enc != {b"listpack"}:
            raise BenchError(f"queued records are {enc}, not listpack")
        out["mem_small_record_b"] = _sample_usage(client, keys, sample)
        out["mem_small_stream_b"] = (client.memory_usage(keys.stream, samples=0) or 0) / n
        out["mem_small_events_b"] = (client.memory_usage(keys.events, samples=0) or 0) / n
        out["mem_small_stats_b"] = (client.memory_usage(keys.stats, samples=0) or 0) / n
    cmd = worker_cmd(ctx.url, QUEUE, "drain", "--jobs", str(n), "--concurrency", "100",
                     "--timeout", str(ctx.sizes.worker_timeout_s))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=_env(),
                              timeout=ctx.sizes.worker_timeout_s + 60, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BenchError("memory: drain worker hung") from exc
    if proc.returncode != 0:
        raise BenchError(f"memory: drain worker exited {proc.returncode}: {proc.stderr[-2000:]}")
    _last_json(proc.stdout)
    _check_empty(client, keys, n)
    finished = used_memory(client) - base
    out[f"mem_{kind}_finished_b"] = finished / n
    if kind == "small":
        sample = ids[:: max(1, n // 200)]
        enc = {client.object("encoding", keys.job(j)) for j in sample}
        if enc != {b"listpack"}:
            raise BenchError(f"finished records are {enc}, not listpack")
        out["mem_small_finished_record_b"] = _sample_usage(client, keys, sample)
    flush(client)
    return out


def memory(ctx: Ctx) -> Result:
    out: Result = {}
    for kind in PAYLOADS:
        n = ctx.sizes.memory_jobs if kind == "small" else ctx.sizes.memory_big_jobs
        ctx.log(f"memory: {n:,} jobs, {kind} payload")
        out.update(measure(ctx, kind, n))
    return out
