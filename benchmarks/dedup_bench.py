"""Dedup's cost per enqueue against a plain enqueue (docs/dedup.md#cost).

    python -m benchmarks.dedup_bench [--jobs 20000] [--url redis://...]

For a plain enqueue and each mode, ``jobs`` jobs are enqueued with ``enqueue_many`` (script
calls of 1,000 jobs: the per-job work in Redis dominates) and one at a time with ``enqueue``
(a round trip each): Redis server CPU per job (INFO cpu, so run it on a quiet server) and
wall time. Each mode is measured twice: every job with a key of its own (the job is created
and takes its key) and every job with the same key (all but the first are folded into it).
``record_bytes``/``key_bytes``: MEMORY USAGE of one job's record and of its dedup key.
Without ``--url`` a private redis-server is started on a free port. Figures from a shared
machine are noisy: compare the rows of one run, not runs.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

import redis

from streamq import Dedup, Queue
from streamq._core.server import RedisServer

MODES: dict[str, dict[str, Any]] = {
    "throttle": {"ttl_s": 600},
    "debounce": {"delay_ms": 60_000, "max_wait_ms": 120_000},
    "keep_last": {},
    "until_start": {},
    "until_finish": {},
}


def _cpu(client: redis.Redis) -> float:
    info: Any = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _run(url: str, client: redis.Redis, n: int, mode: str | None, same_key: bool,
         single: bool) -> dict[str, float]:
    name = f"bench-dedup-{uuid.uuid4().hex[:8]}"
    with Queue.from_url(url, name) as q:
        q.enqueue("noop")  # connect and load the script outside the timing

        def dedup(i: int) -> dict[str, Any]:
            if mode == "delayed":  # a plain delayed job: what a debounce job is, without key
                return {"delay": 60}
            if mode is None:
                return {}
            return {"dedup": Dedup(key="same" if same_key else f"k{i:06d}",
                                   mode=mode, **MODES[mode])}  # type: ignore[arg-type]

        c0, t0 = _cpu(client), time.perf_counter()
        if single:
            for i in range(n):
                q.enqueue("noop", {"n": i}, **dedup(i))
        else:
            for at in range(0, n, 1000):
                q.enqueue_many([{"type": "noop", "payload": {"n": i}, **dedup(i)}
                                for i in range(at, min(n, at + 1000))])
        wall, cpu = time.perf_counter() - t0, _cpu(client) - c0
        out = {"redis_cpu_us": cpu / n * 1e6, "wall_us": wall / n * 1e6}
        if not single and not same_key:  # the bytes of one job's record and of its key
            last = q.enqueue("noop", {"n": n}, **dedup(n))
            out["record_bytes"] = float(client.memory_usage(q.keys.job(last.job_id), samples=0)
                                        or 0)
            if mode not in (None, "delayed"):
                out["key_bytes"] = float(client.memory_usage(
                    q.keys.dedup(f"k{n:06d}"), samples=0) or 0)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--url", default=None)
    args = p.parse_args()
    server = None if args.url else RedisServer().start()
    url = args.url or server.url  # type: ignore[union-attr]
    client = redis.Redis.from_url(url, protocol=2)
    rows: list[dict[str, Any]] = []
    try:
        for mode in (None, "delayed", *MODES):
            for same in ((False,) if mode in (None, "delayed") else (False, True)):
                row: dict[str, Any] = {"mode": mode or "plain",
                                       "keys": "one" if same else "each its own"}
                bulk = _run(url, client, args.jobs, mode, same, single=False)
                one = _run(url, client, max(1, args.jobs // 4), mode, same, single=True)
                row.update({"bulk_redis_cpu_us": round(bulk["redis_cpu_us"], 2),
                            "bulk_wall_us": round(bulk["wall_us"], 2),
                            "single_redis_cpu_us": round(one["redis_cpu_us"], 2),
                            "single_wall_us": round(one["wall_us"], 1)})
                row.update({k: int(bulk[k]) for k in ("record_bytes", "key_bytes")
                            if k in bulk})
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        client.close()
        if server is not None:
            server.close()


if __name__ == "__main__":
    main()
