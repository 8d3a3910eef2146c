"""What ``streamq demo --web`` puts in its queue before the first page loads, so the dashboard
opens on a queue with something to show: a week of simulated history in the charts' time
series (incidents in it), jobs that complete and jobs that fail, jobs scheduled for later,
and cron entries that fire while the demo runs.

The history is simulated (the charts say what workers would have written; nothing ran): it is
written only into a queue whose time series is empty, bucket by bucket with HSETNX, so a
restarted demo over the same server neither doubles it nor overwrites what workers wrote.
"""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

from schedulers import Cron

from .._core.keys import Keys
from .._core.timeseries import KEEP_MINUTES, bucket_json
from .._producer.queue import AsyncQueue
from ..admin import AsyncAdmin
from .demo_web import KINDS, QUEUE

HISTORY_HOURS = 7 * 24
"""Hour buckets written (the 7-day chart is full; the 30-day one shows a week)."""
CRON = (
    Cron("webhook.heartbeat", every=20, job_type="webhook.post", queue=QUEUE,
         payload={"url": "https://example.com/ping"}),
    Cron("invoices.hourly", "0 * * * *", job_type="invoice.create", queue=QUEUE,
         payload={"batch": "hourly"}),
)
"""The demo's cron entries, fired by a scheduler inside ``streamq demo --web``."""
JOBS = 160
FAILING = 6
SCHEDULED = 10

MINUTE_MS = 60_000


def _minute(m: int, now_minute: int) -> tuple[int, int, dict[int, int], dict[int, int], int]:
    """Completed, failed, wait and run histograms (bucket index -> count) and the oldest
    ready age (ms) of epoch minute ``m``: a daily cycle, noise, and every 12 hours a 12-minute
    incident (slow and failing jobs, a backlog), the latest one about 1.5 hours ago."""
    rnd = random.Random(m)
    day = 2 * math.pi * ((m % 1440) / 1440)
    rate = 70 + 45 * math.sin(day - 2.0) + rnd.uniform(-12, 12)
    incident = (now_minute - m) % 720 in range(90, 102)
    completed = max(0, int(rate * (0.55 if incident else 1.0)))
    failed = int(completed * (0.22 if incident else rnd.uniform(0, 0.03)) + rnd.random())
    n = completed + failed
    # histogram indices: 3 = up to 10 ms, 5 = 50 ms, 6 = 100 ms, 7 = 200 ms, 8 = 500 ms,
    # 9 = 1 s, 10 = 2 s, 11 = 5 s; the tail shares vary, so the p95 lines move
    tail = rnd.uniform(0.0, 0.1)
    wait_mix = ((9, 0.3), (10, 0.4), (11, 0.3)) if incident else (
        (3, 0.45 - tail), (4, 0.35), (5, 0.2), (6, tail))
    run_mix = ((8, 0.5), (9, 0.35), (10, 0.15)) if incident else (
        (6, 0.15), (7, 0.6 - tail), (8, 0.25), (9, tail))

    def spread(mix: tuple[tuple[int, float], ...]) -> dict[int, int]:
        out = {idx: int(n * share) for idx, share in mix}
        out[mix[0][0]] += n - sum(out.values())
        return {k: v for k, v in out.items() if v}

    oldest = int(rnd.uniform(20_000, 45_000)) if incident else int(rnd.uniform(0, 400))
    return completed, failed, spread(wait_mix), spread(run_mix), oldest


def history(now_ms: int) -> tuple[dict[int, str], dict[int, str]]:
    """Minute buckets (the last 6 hours) and hour buckets (the last week, each the sum of
    its minutes) up to the minute before ``now_ms``, as fields and values of the series."""
    now_minute = now_ms // MINUTE_MS
    first = (now_minute // 60 - HISTORY_HOURS + 1) * 60
    minutes: dict[int, str] = {}
    hours: dict[int, list[Any]] = {}
    for m in range(first, now_minute):
        c, f, w, r, o = _minute(m, now_minute)
        if m >= now_minute - KEEP_MINUTES + 1:
            minutes[m] = bucket_json(c, f, w, r, o)
        acc = hours.setdefault(m // 60, [0, 0, {}, {}, 0])
        acc[0] += c
        acc[1] += f
        for into, add in ((acc[2], w), (acc[3], r)):
            for k, v in add.items():
                into[k] = into.get(k, 0) + v
        acc[4] = max(acc[4], o)
    return minutes, {h: bucket_json(*acc) for h, acc in hours.items()}


async def seed(queue: AsyncQueue) -> bool:
    """Fill the demo queue when its time series is empty (a new demo): the history, jobs
    for the workers (some of them fail) and jobs scheduled for later. False: it was not."""
    keys = Keys(queue.name, queue.config.key_prefix)
    client: Any = queue.client
    if await client.exists(keys.series_minutes, keys.series_hours):
        return False
    sec, usec = await client.time()
    minutes, hours = history(int(sec) * 1000 + int(usec) // 1000)
    pipe = client.pipeline(transaction=False)
    for key, fields in ((keys.series_minutes, minutes), (keys.series_hours, hours)):
        for field, value in fields.items():
            pipe.hsetnx(key, str(field), value)
    await pipe.execute()
    jobs: list[dict[str, Any]] = [{"type": KINDS[i % len(KINDS)], "payload": {"n": i}}
                                  for i in range(JOBS)]
    jobs += [{"type": KINDS[i % len(KINDS)],
              "payload": {"n": i, "fail": "card declined" if i % 2 else "mailbox full"}}
             for i in range(FAILING)]
    jobs += [{"type": KINDS[i % len(KINDS)], "payload": {"n": i}, "delay": 300 + 540 * i}
             for i in range(SCHEDULED)]  # from 5 minutes to 1.5 hours from now
    await queue.enqueue_many(jobs)
    return True


async def settled(admin: AsyncAdmin, timeout_s: float = 60.0) -> bool:
    """Wait until the seeded jobs that are due have run (completed or dead-lettered), so the
    first page shows their outcomes; False after ``timeout_s`` (the demo opens anyway)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        c = (await admin.stats(QUEUE)).counters
        # each count on its own: the demo's cron entries complete jobs too, so a sum could
        # be reached while a seeded failing job still runs
        if c.get("completed", 0) >= JOBS and c.get("failed", 0) >= FAILING:
            return True
        await asyncio.sleep(0.2)
    return False
