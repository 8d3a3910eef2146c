"""The scheduler daemon: on-time promotion, cron exactly once per tick, catch-up, sweeps."""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import eventually, field, record, start_entries, wait_until

from schedulers import Cron, Scheduler, SchedulerConfig
from streamq import InvalidArgument, Queue
from streamq._core.keys import GROUP

TESTS = Path(__file__).parent


def fast_sched(**kw: Any) -> SchedulerConfig:
    return SchedulerConfig(**{"poll_interval_s": 30.0, "sweep_interval_s": 0.1, **kw})


def stream_ids(r: redis.Redis, stream: str) -> list[str]:
    entries: Any = r.xrange(stream)
    return [e[1][b"id"].decode() for e in entries]


async def test_sleeping_scheduler_is_woken_by_a_sooner_job(url: str, qname: str,
                                                           r: redis.Redis) -> None:
    q = Queue.from_url(url, qname)
    async with Scheduler(url, [qname], config=fast_sched(poll_interval_s=60)):
        await asyncio.sleep(0.1)  # let it settle into its long idle sleep
        q.enqueue("t", job_id="soon", delay=0.2)
        await eventually(lambda: r.xlen(q.keys.stream) == 1, timeout_s=10,
                         what="promotion well before the 60 s idle poll")
    info = q.get("soon")
    assert info is not None and info.state == "queued" and info.due_at and info.enqueued_at
    assert info.enqueued_at >= info.due_at


def test_three_scheduler_processes_promote_and_fire_exactly_once(url: str, qname: str,
                                                                 r: redis.Redis) -> None:
    q = Queue.from_url(url, qname)
    n = 3000
    q.enqueue_many([{"type": "t", "job_id": f"d{i}", "delay": 0.5 + (i % 100) / 50}
                    for i in range(n)])
    env = {**os.environ, "STREAMQ_TEST_QUEUE": qname}
    procs = [subprocess.Popen([sys.executable, "-m", "streamq", "scheduler", "--url", url,
                               "--queue", qname, "--cron", "sched_jobs:schedule"],
                              cwd=TESTS, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for _ in range(3)]
    try:
        time.sleep(1.0)
        procs[0].send_signal(signal.SIGKILL)  # mid-run: the others carry on, nothing is lost
        wait_until(lambda: r.zcard(q.keys.delayed) == 0, timeout_s=20, what="all promoted")
        wait_until(lambda: sum(i.startswith("cron:tick:") for i in stream_ids(r, q.keys.stream))
                   >= 4, timeout_s=20, what="four cron ticks")
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(20)
    ids = stream_ids(r, q.keys.stream)
    delayed_ids = [i for i in ids if i.startswith("d")]
    assert len(delayed_ids) == n and len(set(delayed_ids)) == n
    ticks = [int(i.split(":")[2]) for i in ids if i.startswith("cron:tick:")]
    assert len(ticks) == len(set(ticks)), "a cron tick fired twice"
    assert ticks == sorted(ticks) and all(b - a == 1 for a, b in itertools.pairwise(ticks))
    # promoted exactly once: one stream entry per job (above), the one its record names
    entries: Any = r.xrange(q.keys.stream)
    for eid, f in entries:
        jid = f[b"id"].decode()
        if jid.startswith("d"):
            rec = record(r, q.keys.job(jid))
            assert rec[b"state"] == b"queued" and rec[b"entry"] == eid


async def test_cron_catch_up_once_fires_the_latest_missed_tick_only(url: str, qname: str,
                                                                    r: redis.Redis) -> None:
    yearly_once = Cron("yearly-once", "0 0 1 1 *", job_type="report", queue=qname)
    yearly_skip = Cron("yearly-skip", "0 0 1 1 *", job_type="report", queue=qname,
                       catch_up="skip")
    q = Queue.from_url(url, qname)
    long_ago = int(dt.datetime(2020, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
    r.hset(q.keys.cron, mapping={"yearly-once:last": long_ago, "yearly-skip:last": long_ago})
    latest = yearly_once.latest_at_or_before(int(time.time() * 1000))
    assert latest is not None
    async with Scheduler(url, [qname], [yearly_once, yearly_skip], fast_sched()):
        await eventually(lambda: r.hget(q.keys.cron, "yearly-skip:last") == str(latest).encode(),
                         what="the skip entry to record the missed tick")
        await eventually(lambda: q.get(yearly_once.job_id(latest)) is not None,
                         what="the once entry to fire")
    assert stream_ids(r, q.keys.stream) == [yearly_once.job_id(latest)]  # one job, not six
    info: Any = json.loads(r.hget(q.keys.cron, "yearly-once") or b"{}")
    assert info["last_tick_ms"] == latest and info["next_tick_ms"] > latest
    assert info["last_job"] == yearly_once.job_id(latest)


async def test_cron_entries_are_visible_before_their_first_tick(url: str, qname: str,
                                                                r: redis.Redis) -> None:
    entry = Cron("nightly", "30 2 * * *", job_type="cleanup", queue=qname, tz="Europe/Berlin")
    q = Queue.from_url(url, qname)
    async with Scheduler(url, [], [entry], fast_sched()):
        await eventually(lambda: r.hget(q.keys.cron, "nightly"), what="cron info")
    info: Any = json.loads(r.hget(q.keys.cron, "nightly") or b"{}")
    assert info["expr"] == "30 2 * * *" and info["tz"] == "Europe/Berlin"
    assert info["next_tick_ms"] > time.time() * 1000
    assert r.xlen(q.keys.stream) == 0  # a new entry does not fire a past tick


async def test_two_schedulers_in_one_process_fire_each_tick_once(url: str, qname: str,
                                                                 r: redis.Redis) -> None:
    entry = Cron("every-second", every=1, job_type="tick", queue=qname)
    q = Queue.from_url(url, qname)
    async with Scheduler(url, [qname], [entry], fast_sched()), \
            Scheduler(url, [qname], [entry], fast_sched()):
        await eventually(lambda: r.xlen(q.keys.stream) >= 3, timeout_s=10, what="3 ticks")
    ids = stream_ids(r, q.keys.stream)
    assert len(ids) == len(set(ids))
    assert r.hget(q.keys.stats, "duplicates") in (None, b"0")  # the tick guard stopped them


async def test_sweep_hands_back_lapsed_entries_when_no_worker_is_alive(
    url: str, qname: str, r: redis.Redis
) -> None:
    q = Queue.from_url(url, qname)
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="started")
    q.enqueue("t", job_id="delivered")
    q.enqueue("t", job_id="last-try", max_attempts=1)
    r.xreadgroup(GROUP, "dead-worker", {k.stream: ">"}, count=10)
    for jid in ("started", "last-try"):
        entry: Any = field(r, k.job(jid), "entry")
        start_entries(r, k, "dead-worker", [(entry.decode(), jid)])
    r.zadd(k.workers, {"dead-worker": 1})  # its last heartbeat was long ago
    sched = Scheduler(url, [qname], config=fast_sched(visibility_timeout_s=0.05))
    async with sched:
        await eventually(lambda: q.get("last-try").state == "failed",  # type: ignore[union-attr]
                         what="sweep")
        await eventually(lambda: sched.requeued == 2, what="two entries handed back")
    started, delivered, last = q.get("started"), q.get("delivered"), q.get("last-try")
    assert started and delivered and last
    assert (started.state, started.attempts) == ("queued", 1)
    assert (delivered.state, delivered.attempts) == ("queued", 0)
    assert last.reason == "attempts exhausted (lease lapsed)"
    assert r.xpending(k.stream, GROUP)["pending"] == 0
    assert sorted(stream_ids(r, k.stream)) == ["delivered", "started"]


async def test_sweep_leaves_queues_with_live_workers_alone(url: str, qname: str,
                                                           r: redis.Redis) -> None:
    q = Queue.from_url(url, qname)
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="held")
    r.xreadgroup(GROUP, "busy-worker", {k.stream: ">"}, count=10)
    t: Any = r.time()
    r.zadd(k.workers, {"busy-worker": t[0] * 1000 + t[1] // 1000})
    async with Scheduler(url, [qname], config=fast_sched(visibility_timeout_s=0.01)) as s:
        await asyncio.sleep(0.05)
        assert await s.sweep(qname) == 0
    assert r.xpending(k.stream, GROUP)["pending"] == 1


def test_cron_entry_validation() -> None:
    bad: list[dict[str, Any]] = [{"name": "bad name", "every": 5, "job_type": "t"},
                   {"name": "x", "job_type": "t"},
                   {"name": "x", "expr": "* * * * *", "every": 5, "job_type": "t"},
                   {"name": "x", "every": 0.5, "job_type": "t"},
                   {"name": "x", "every": 5, "job_type": ""},
                   {"name": "x", "expr": "61 * * * *", "job_type": "t"},
                   {"name": "x", "every": 5, "job_type": "t", "catch_up": "all"},
                   {"name": "x", "every": 5, "job_type": "t", "queue": "a b"}]
    for kwargs in bad:
        with pytest.raises(InvalidArgument):
            Cron(**kwargs)
    with pytest.raises(InvalidArgument, match="unique"):
        Scheduler("redis://x", [], [Cron("a", every=5, job_type="t"),
                                    Cron("a", every=9, job_type="t")])


def test_scheduler_command_rejects_bad_schedules(url: str) -> None:
    for args, message in [([], "at least one"),
                          (["--cron", "sched_jobs"], "module:attribute"),
                          (["--cron", "sched_jobs:QUEUE"], "schedulers.Cron")]:
        proc = subprocess.run([sys.executable, "-m", "streamq", "scheduler", "--url", url, *args],
                              cwd=TESTS, capture_output=True, text=True, timeout=30)
        assert proc.returncode != 0 and message in proc.stderr + proc.stdout


def test_a_bad_cron_entry_fails_when_built_not_at_its_first_tick() -> None:
    bad: list[dict[str, Any]] = [{"max_attempts": 0}, {"job_id": "fixed"}, {"bogus": 1}]
    for options in bad:
        with pytest.raises(InvalidArgument, match="cron entry"):
            Cron("tick", every=1, job_type="t", job_options=options)
    with pytest.raises(InvalidArgument):
        Cron("x" * 195, every=1, job_type="t")  # its per-tick job id would be too long
    with pytest.raises(InvalidArgument):
        Cron("tick", every=1, job_type="bad type!")


async def test_scheduler_loops_survive_a_server_error(url: str, qname: str,
                                                      r: redis.Redis) -> None:
    """OOM (or READONLY in a failover) fails scripts for a while; cron resumes after."""
    entry = Cron("every-second", every=1, job_type="tick", queue=qname)
    q = Queue.from_url(url, qname)
    async with Scheduler(url, [qname], [entry], fast_sched()):
        await eventually(lambda: r.xlen(q.keys.stream) >= 1, what="a first tick")
        r.config_set("maxmemory", 1)
        r.config_set("maxmemory-policy", "noeviction")
        try:
            await asyncio.sleep(1.5)
        finally:
            r.config_set("maxmemory", 0)
        before = r.xlen(q.keys.stream)
        await eventually(lambda: r.xlen(q.keys.stream) > before, what="ticks after the error")


async def test_scheduler_keeps_promoting_after_redis_restarts(aof_server: Any, qname: str
                                                              ) -> None:
    """A failed resubscribe must not end promotion (found by the chaos run)."""
    url = aof_server.url
    async with Scheduler(url, [qname], config=fast_sched(poll_interval_s=60)):
        await asyncio.sleep(0.2)
        aof_server.kill()
        await asyncio.sleep(2.0)  # down longer than one resubscribe attempt
        aof_server.start()
        q = Queue.from_url(url, qname)
        q.enqueue("t", job_id="after", delay=0.2)
        await eventually(lambda: q.get("after").state == "queued",  # type: ignore[union-attr]
                         timeout_s=15, what="promotion after the restart")


async def test_scheduler_promotes_by_polling_when_the_client_has_no_pubsub(
        url: str, qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A client whose ``pubsub()`` raises (redis-py before 8 has no async cluster pub/sub) must
    not stop promotion: the wake-up channel is optional, the scheduler polls instead."""
    import redis.asyncio as aredis

    def no_pubsub(self: Any, **kw: Any) -> Any:
        raise AttributeError("'RedisCluster' object has no attribute 'pubsub'")

    monkeypatch.setattr(aredis.Redis, "pubsub", no_pubsub)
    async with Scheduler(url, [qname], config=fast_sched(poll_interval_s=60)):
        q = Queue.from_url(url, qname)
        q.enqueue("t", job_id="polled", delay=0.2)
        await eventually(lambda: q.get("polled").state == "queued",  # type: ignore[union-attr]
                         timeout_s=15, what="promotion without a wake-up channel")
