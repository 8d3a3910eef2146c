"""The per-queue time series behind the dashboard's charts: written by workers' recorders with
timeseries.lua, bounded, read back by the admin API."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis
import redis.asyncio as aredis

from streamq import Keys, Queue
from streamq._core.keys import GROUP
from streamq._core.timeseries import BOUNDS_MS, KEEP_HOURS, KEEP_MINUTES, SeriesRecorder, percentile
from streamq.admin import Admin


async def test_recorder_adds_outcomes_to_bounded_buckets(url: str, qname: str,
                                                         r: redis.Redis) -> None:
    k = Keys(qname)
    q = Queue.from_url(url, qname)
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="waiting")  # an undelivered entry: its age is the oldest ready
    rec = SeriesRecorder([qname])
    for i in range(100):
        rec.observe(qname, completed=i % 10 != 0, wait_ms=3 if i < 50 else 40, run_ms=i * 10)
    client = aredis.Redis.from_url(url)
    try:
        await rec.flush(client, Keys)
        await rec.flush(client, Keys)  # nothing observed: the age is sampled, counts unchanged
    finally:
        await client.aclose()
    (minute, raw), = r.hgetall(k.series_minutes).items()
    b = json.loads(raw)
    assert (b["c"], b["f"]) == (90, 10) and b["o"] >= 0
    assert sum(b["w"].values()) == 100 and sum(b["r"].values()) == 100
    assert r.hlen(k.series_hours) == 1
    (p,) = Admin.from_url(url).series(qname)
    assert p.t_ms == int(minute) * 60_000 and (p.completed, p.failed) == (90, 10)
    assert p.wait_p50_ms == 5 and p.wait_p95_ms == 50
    assert p.run_p50_ms == 500 and p.run_p95_ms == 1000
    assert Admin.from_url(url).series(qname, hours=True)[0].completed == 90


async def test_old_buckets_are_dropped_and_memory_is_bounded(url: str, qname: str,
                                                             r: redis.Redis) -> None:
    k = Keys(qname)
    now_min = int(r.time()[0]) // 60
    full = json.dumps({"c": 123456, "f": 789, "o": 12345,
                       "w": {str(i): 1000 + i for i in range(len(BOUNDS_MS) + 1)},
                       "r": {str(i): 2000 + i for i in range(len(BOUNDS_MS) + 1)}})
    r.hset(k.series_minutes, mapping={str(now_min - i): full for i in range(1, KEEP_MINUTES + 50)})
    r.hset(k.series_hours, mapping={str(now_min // 60 - i): full for i in range(1, KEEP_HOURS)})
    rec = SeriesRecorder()
    rec.observe(qname, completed=True, wait_ms=1, run_ms=1)
    client = aredis.Redis.from_url(url)
    try:
        await rec.flush(client, Keys)
    finally:
        await client.aclose()
    assert r.hlen(k.series_minutes) <= KEEP_MINUTES
    fields = [int(f) for f in r.hkeys(k.series_minutes)]
    assert min(fields) > now_min - KEEP_MINUTES - 1
    memory: Any = [r.memory_usage(k.series_minutes), r.memory_usage(k.series_hours)]
    assert sum(memory) < 700_000, memory  # every bucket full: the worst case per queue
    print(f"time series, every bucket full: {sum(memory) / 1024:.0f} KiB per queue")


async def test_a_failed_flush_keeps_its_counts(url: str, qname: str) -> None:
    rec = SeriesRecorder()
    rec.observe(qname, completed=True, wait_ms=1, run_ms=1)
    dead = aredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.2)
    with pytest.raises(redis.ConnectionError):
        await rec.flush(dead, Keys)
    client = aredis.Redis.from_url(url)
    try:
        await rec.flush(client, Keys)
    finally:
        await client.aclose()
    assert Admin.from_url(url).series(qname)[0].completed == 1


def test_percentiles_and_damaged_buckets(url: str, qname: str, r: redis.Redis) -> None:
    assert percentile({}, 0.5) is None
    assert percentile({"0": 1, "18": 1}, 0.95) == BOUNDS_MS[-1] * 2
    assert percentile({"x": 3, "2": "bad", "3": 1}, 0.5) == 10
    k = Keys(qname)
    r.hset(k.series_minutes, mapping={"abc": "{}", "5": "not json", "6": "[1]",
                                      "7": json.dumps({"c": 2, "w": "x"})})
    (p,) = Admin.from_url(url).series(qname)
    assert p.t_ms == 7 * 60_000 and p.completed == 2 and p.wait_p50_ms is None


def test_observe_many_counts_as_observe_does_per_job() -> None:
    """A worker's batch of attempts is observed in one call (observe_many): the same counts,
    by queue and histogram bucket, as one observe per attempt."""
    rows = [("a" if i % 3 else "b", i % 4 != 0, i * 7 if i % 5 else None,
             i / 3 if i % 6 else -1.0) for i in range(60)]
    one, many = SeriesRecorder(["a"]), SeriesRecorder(["a"])
    for row in rows:
        one.observe(*row)
    many.observe_many(rows)
    def counts(rec: SeriesRecorder) -> dict[str, list[Any]]:
        return {queue: acc.args() for queue, _keys, _args, acc in rec.take(Keys)}

    got = counts(one)
    assert counts(many) == got
    assert got["b"][:2] == [sum(1 for q, ok, *_ in rows if q == "b" and ok),
                                    sum(1 for q, ok, *_ in rows if q == "b" and not ok)]


def test_observe_many_counts_as_observe_one_by_one() -> None:
    """A batch's observations (``observe_many``: counted in lists, a bucket looked up only
    when a value leaves the last one's range) land in the same buckets as ``observe`` for
    each: bounds exactly, values between, below the first bound, over the last, None, NaN,
    negative, and several queues interleaved."""
    import random

    rnd = random.Random(32)
    edges = [v for b in BOUNDS_MS for v in (b - 0.5, b, b + 0.001, b + 1)]
    values: list[float | None] = [None, float("nan"), -1, 0, 0.0, 0.01, 1e9, *edges]
    seen: list[tuple[str, bool, float | None, float | None]] = []
    for i in range(3000):
        w = rnd.choice(values) if i % 3 else rnd.choice([5, 5, 6, 40, 41])
        r_ms = rnd.choice(values) if i % 2 else rnd.random() * 3
        seen.append((rnd.choice(["a", "a", "a", "b"]), rnd.random() < 0.8, w, r_ms))
    one, many = SeriesRecorder(["a"]), SeriesRecorder(["a"])
    for item in seen:
        one.observe(*item)
    for i in range(0, len(seen), 75):
        many.observe_many(seen[i:i + 75])
    assert set(one._acc) == set(many._acc) == {"a", "b"}
    for queue in ("a", "b"):
        got, want = many._acc[queue], one._acc[queue]
        assert (got.completed, got.failed) == (want.completed, want.failed)
        assert got.wait == want.wait and got.run == want.run
