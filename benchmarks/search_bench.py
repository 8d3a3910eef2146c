"""Job search: what the indexes cost per job, and how long each kind of search takes
(docs/search.md#cost).

    python -m benchmarks.search_bench [--jobs 200000] [--dead 20000] [--reps 40] [--url ...]
    python -m benchmarks.search_bench --jobs 1000000 --dead 100000   # the issue's scale
    python -m benchmarks.search_bench --smoke                        # tiny, seconds
    python -m benchmarks.search_bench --script-cost 20000   # one-job calls: script us per call
    ... --out benchmarks/results/search_1m.json                        # the rows as JSON

Cost: ``jobs`` jobs are enqueued with ``enqueue_many`` (calls of 1,000), then ``jobs / 20``
one call each (``single_*``), into a queue without
search and into one with ``SearchConfig(fields={"order.paid": ["customer_id"]})``: 20 job
types (one rare: 1 in 1,000), a group on 1 job in 10 (1,000 groups), customer ids out of
10,000. Per job: Redis server CPU (INFO cpu) and memory (``used_memory`` after minus before,
so it includes the job record; the difference of the two queues is the index). Then ``dead``
more jobs of the search queue fail once and are dead-lettered by a real worker, and
``jobs / 1000`` scheduled ones (delayed an hour) join it. The dead letters' error texts are
four common ones (1 in 4 each) and a rare one (1 in 1,000); the error-word index
(docs/search.md#error-text) is then rebuilt from scratch to measure its Redis CPU and memory
per dead letter.

Latency: each kind of search runs ``reps`` times (``Admin.find(limit=50)``, varied values)
over every queue (the registry), p50 and p95 in ms, with the candidates it checked. Without
``--url`` a private redis-server is started. Figures from a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import redis

from streamq import Fail, Job, Queue, QueueConfig, Registry, SearchConfig, Worker, WorkerConfig
from streamq._core.server import RedisServer
from streamq.admin import Admin

TYPES = [f"order.step{i}" for i in range(18)] + ["order.paid", "order.rare"]
SEARCH = QueueConfig(search=SearchConfig(fields={"order.paid": ["customer_id"]}))


def _cpu(client: redis.Redis) -> float:
    info: Any = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _mem(client: redis.Redis) -> int:
    info: Any = client.info("memory")
    return int(info["used_memory"])


def _spec(i: int, rnd: random.Random) -> dict[str, Any]:
    t = "order.rare" if i % 1000 == 7 else TYPES[i % 19]
    spec: dict[str, Any] = {"type": t, "payload": {"customer_id": f"c{rnd.randrange(10_000)}",
                                                   "amount": i % 997}}
    if i % 10 == 3:
        spec["group"] = f"tenant-{rnd.randrange(1000)}"
    return spec


def load(url: str, client: redis.Redis, name: str, cfg: QueueConfig, n: int) -> dict[str, float]:
    rnd = random.Random(7)
    with Queue.from_url(url, name, config=cfg) as q:
        q.enqueue("warmup")
        m0, c0, t0 = _mem(client), _cpu(client), time.perf_counter()
        for at in range(0, n, 1000):
            q.enqueue_many([_spec(i, rnd) for i in range(at, min(n, at + 1000))])
        wall, cpu, mem = time.perf_counter() - t0, _cpu(client) - c0, _mem(client) - m0
        ones = max(1, n // 20)  # one job per call: the script's fixed cost per call too
        c1, t1 = _cpu(client), time.perf_counter()
        for i in range(ones):
            spec = _spec(i, rnd)
            q.enqueue(spec.pop("type"), spec.pop("payload"), **spec)
        wall1, cpu1 = time.perf_counter() - t1, _cpu(client) - c1
    return {"redis_cpu_us_per_job": cpu / n * 1e6, "wall_us_per_job": wall / n * 1e6,
            "bytes_per_job": mem / n, "single_redis_cpu_us": cpu1 / ones * 1e6,
            "single_wall_us": wall1 / ones * 1e6}


def script_cost(url: str, client: redis.Redis, n: int) -> dict[str, float]:
    """``n`` one-job enqueue calls into the search queue (after 2,000 to warm up its
    indexes): the enqueue script's own Redis time per call (INFO commandstats, EVALSHA's
    usec_per_call), steadier than INFO cpu, which counts the whole server."""
    rnd = random.Random(7)
    with Queue.from_url(url, "bench-script", config=SEARCH) as q:
        for i in range(2000 + n):
            if i == 2000:
                client.config_resetstat()
            spec = _spec(i, rnd)
            q.enqueue(spec.pop("type"), spec.pop("payload"), **spec)
    st: Any = client.info("commandstats")
    return {"calls": st["cmdstat_evalsha"]["calls"],
            "script_us_per_call": st["cmdstat_evalsha"]["usec_per_call"]}


async def dead_letters(url: str, name: str, n: int) -> float:
    reg = Registry()
    errors = ["card declined by issuer", "gateway timed out", "insufficient funds",
              "address not verified"]

    @reg.handler("charge")
    async def charge(job: Job) -> None:
        n = job.payload["n"]
        raise Fail("card reported stolen" if n % 1000 == 7 else errors[n % 4])

    with Queue.from_url(url, name, config=SEARCH) as q:
        for at in range(0, n, 1000):
            q.enqueue_many([{"type": "charge", "payload": {"n": i, "customer_id": f"c{i}"},
                             "max_attempts": 1} for i in range(at, min(n, at + 1000))])
    t0 = time.perf_counter()
    admin = Admin.from_url(url)
    async with Worker(url, [name], reg, WorkerConfig(concurrency=200, block_ms=100),
                      SEARCH):
        def done() -> None:
            while admin.stats(name).dead < n:
                time.sleep(0.2)

        await asyncio.to_thread(done)
    admin.close()
    return time.perf_counter() - t0


def error_index(client: redis.Redis, name: str) -> dict[str, Any]:
    """Rebuild the error-word index of queue ``name`` from its dead-letter stream (ixdead.lua,
    1,000 a call, as a worker does): Redis CPU and memory per dead letter indexed."""
    from streamq._core.keys import Keys
    from streamq._core.scripts import SCRIPTS
    from streamq._ops.search_words import sync_call

    k = Keys(name)
    client.delete(k.ix_ew, k.ix_ewl)
    m0, c0, t0 = _mem(client), _cpu(client), time.perf_counter()
    call, n, calls = sync_call(k), 0, 0
    while True:
        rep: Any = SCRIPTS[call.script](client, call.keys, call.args)
        n, calls = n + int(rep[0]), calls + 1
        if not int(rep[3]):
            break
    cpu, wall, mem = _cpu(client) - c0, time.perf_counter() - t0, _mem(client) - m0
    words = int(client.zcard(k.ix_ew))
    return {"dead_letters_indexed": n, "calls": calls, "index_entries": words,
            "redis_cpu_us_per_dead_letter": round(cpu / max(1, n) * 1e6, 1),
            "ms_per_call": round(wall / calls * 1000, 1),
            "bytes_per_dead_letter": round(mem / max(1, n), 1)}


def latency(admin: Admin, reps: int, ids: list[str], since: int) -> list[dict[str, Any]]:
    rnd = random.Random(11)
    kinds: dict[str, Callable[[int], dict[str, Any]]] = {
        "id (exact)": lambda i: {"id": ids[i % len(ids)]},
        "id prefix (4 chars)": lambda i: {"id_prefix": ids[i % len(ids)][:4]},
        "type (common)": lambda i: {"type": TYPES[i % 18]},
        "type (rare, 1 in 1000)": lambda i: {"type": "order.rare"},
        "group": lambda i: {"group": f"tenant-{rnd.randrange(1000)}"},
        "field customer_id": lambda i: {"fields": {"customer_id": f"c{rnd.randrange(10_000)}"}},
        "time range (the newest 1%)": lambda i: {"since_ms": since},
        "state=failed (dead stream)": lambda i: {"state": "failed"},
        "error text": lambda i: {"error": "timed out"},
        "error text, rare (1 in 1000)": lambda i: {"error": "reported stolen"},
        "error text, a word's start": lambda i: {"error": "declin"},
        "error text, absent": lambda i: {"error": "no such text anywhere"},
        "error type": lambda i: {"error_type": "Fail"},
        "error text + type": lambda i: {"error": "stolen", "error_type": "Fail"},
        "state=queued": lambda i: {"state": "queued"},
        "state=scheduled (the delayed set)": lambda i: {"state": "scheduled"},
        "type + state (post-filter)": lambda i: {"type": TYPES[i % 18], "state": "queued"},
        "type + state=failed (post-filter)": lambda i: {"type": "charge", "state": "failed"},
    }
    rows = []
    for label, make in kinds.items():
        times, scanned, bound = [], [], 0
        for i in range(reps):
            t0 = time.perf_counter()
            page = admin.find(limit=50, **make(i))
            times.append((time.perf_counter() - t0) * 1000)
            scanned.append(page.scanned)
            bound += page.bound_hit
        times.sort()
        row = {"search": label, "p50_ms": round(statistics.median(times), 2),
               "p95_ms": round(times[min(len(times) - 1, int(len(times) * 0.95))], 2),
               "checked_median": int(statistics.median(scanned)), "bound_hit": f"{bound}/{reps}",
               "source": page.source}
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=200_000)
    p.add_argument("--dead", type=int, default=None, help="default: jobs / 10")
    p.add_argument("--reps", type=int, default=40)
    p.add_argument("--url", default=None)
    p.add_argument("--smoke", action="store_true", help="2,000 jobs, 200 dead, 3 reps")
    p.add_argument("--out", default=None, help="write every figure to this JSON file")
    p.add_argument("--script-cost", type=int, default=0, metavar="N",
                   help="only this: N one-job enqueue calls with search, the script's Redis"
                        " time per call (commandstats)")
    args = p.parse_args()
    logging.getLogger("streamq").setLevel(logging.CRITICAL)  # (the dead letters' warnings)
    if args.smoke:
        args.jobs, args.dead, args.reps = 2000, 200, 3
    dead = args.jobs // 10 if args.dead is None else args.dead
    server = None if args.url else RedisServer().start()
    url = args.url or server.url  # type: ignore[union-attr]
    client = redis.Redis.from_url(url, protocol=2)
    try:
        if args.script_cost:
            print(json.dumps(script_cost(url, client, args.script_cost)), flush=True)
            return
        plain = load(url, client, "bench-plain", QueueConfig(), args.jobs)
        searched = load(url, client, "bench-search", SEARCH, args.jobs)
        cost = {"jobs": args.jobs, "plain": {k: round(v, 2) for k, v in plain.items()},
                "search": {k: round(v, 2) for k, v in searched.items()},
                "index_bytes_per_job": round(searched["bytes_per_job"]
                                             - plain["bytes_per_job"], 1),
                "index_cpu_us_per_job": round(searched["redis_cpu_us_per_job"]
                                              - plain["redis_cpu_us_per_job"], 2),
                "index_cpu_us_single": round(searched["single_redis_cpu_us"]
                                             - plain["single_redis_cpu_us"], 2)}
        print(json.dumps(cost), flush=True)
        took = asyncio.run(dead_letters(url, "bench-pay", dead))
        print(json.dumps({"dead_letters": dead, "seconds": round(took, 1)}), flush=True)
        ew = error_index(client, "bench-pay")
        print(json.dumps({"error_index": ew}), flush=True)
        with Queue.from_url(url, "bench-search", config=SEARCH) as q:  # 1 in 1,000 scheduled
            for at in range(0, args.jobs // 1000, 1000):
                q.enqueue_many([{"type": "order.later", "delay": 3600 + i}
                                for i in range(at, min(args.jobs // 1000, at + 1000))])
        admin = Admin.from_url(url)
        ids = [h.job_id for h in admin.find(queue="bench-search", limit=200).items]
        newest = admin.find(queue="bench-search", limit=1000, max_scan=args.jobs)
        since = newest.items[min(len(newest.items), max(1, args.jobs // 100)) - 1].at_ms
        rows = latency(admin, args.reps, ids, since)
        admin.close()
        if args.out:
            with open("/proc/loadavg") as la:
                loadavg = la.read().split()[:3]
            with open(args.out, "w") as f:
                json.dump({"args": vars(args), "cost": cost, "dead_letters_s": round(took, 1),
                           "error_index": ew, "latency": rows, "loadavg_end": loadavg}, f,
                          indent=1)
    finally:
        client.close()
        if server is not None:
            server.close()


if __name__ == "__main__":
    main()
