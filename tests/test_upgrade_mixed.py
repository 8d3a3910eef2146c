"""Rolling upgrade with old and new workers side by side on one queue (docs/key-layout.md,
"Layout 1 and upgrading", step 1): old producers keep enqueueing layout-1 records, and every
record new code hands back to the ready stream or the delayed set (promotion, a paused or
rate-limited start, a graceful stop's release, a retry, a RateLimited hand-back, a lapsed
lease, a requeue, a re-drive) may next be met by an old worker, whose scripts
(tests/fixtures/v1) only know layout 1: new code keeps such a record in layout 1, so the old
worker runs it and dead-letters nothing. The other direction (new workers running what old
workers started or handed back) is covered too."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import redis
from helpers import eventually, finish, running, start_entries, wait_until
from v1 import OldLease, OldWorker, v1_enqueue

from streamq import Job, Keys, Queue, QueueConfig, RateLimit, Registry, Retry
from streamq._core.keys import GROUP
from streamq._core.scripts import SCRIPTS
from streamq._worker import start_call
from streamq.admin import Admin

CFG = QueueConfig()


def new_promote(r: redis.Redis, k: Keys) -> int:
    """Today's promoter (streamq/_worker/promote.py's call) over the due jobs."""
    now_s, now_us = r.time()
    ids: Any = r.zrangebyscore(k.delayed, "-inf", now_s * 1000 + now_us // 1000)
    names = [i.decode() for i in ids]
    if not names:
        return 0
    keys = [k.delayed, k.stream, k.dead, k.stats, k.events, *(k.job(j) for j in names),
            *k.group_keys, k.levels, *k.level_streams]
    moved, _now, _next = SCRIPTS["promote"](
        r, keys, [CFG.events_arg, CFG.dead_ttl_s, CFG.dead_maxlen, CFG.group_arg, *names])
    return int(moved)


def new_release(r: redis.Redis, k: Keys, consumer: str,
                items: list[tuple[str, str, str]]) -> list[int]:
    """Today's release.lua (a stopping worker): (job id, entry, token or '') per job."""
    keys = [k.stream, k.stats, k.events, *(k.job(j) for j, _e, _t in items)]
    args: list[Any] = [GROUP, CFG.events_arg, consumer, ""]
    for j, e, t in items:
        args += [j, e, t]
    return [int(v) for v in SCRIPTS["release"](r, keys, args)]


def layout_1(r: redis.Redis, key: str) -> bool:
    """The record is in layout 1 only: what an old worker's and old producer's code reads."""
    h: Any = r.hgetall(key)
    return b"state" in h and b"s" not in h and b"e" not in h


def run_add(lease: OldLease) -> str:
    return json.dumps(int(lease.payload["n"]) + 1)


def drain_old(old: OldWorker, ids: list[str], r: redis.Redis, k: Keys) -> None:
    """The old worker alone runs until every job in ``ids`` is completed."""
    def done() -> bool:
        old.step(run_add, reclaim_idle_ms=0)
        return all(r.hget(k.job(j), "state") == b"completed" for j in ids) or bool(old.dead)
    wait_until(done, timeout_s=20, what="the old worker completing every job")


def test_what_new_scripts_hand_back_an_old_worker_runs(q: Queue, r: redis.Redis, url: str
                                                       ) -> None:
    k = q.keys
    ready = ["paused", "limited", "released", "unstarted", "retried", "later", "lapsed",
             "requeued", "redriven"]
    payload = {j: i for i, j in enumerate([*ready, "promoted", "cancelled"])}
    v1_enqueue(r, k, [(j, "add", {"n": payload[j]}, 0) for j in ready])
    v1_enqueue(r, k, [("promoted", "add", {"n": payload["promoted"]}, 1),
                      ("cancelled", "add", {"n": payload["cancelled"]}, 60_000)])
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    got: Any = r.xreadgroup(GROUP, "new-1", {k.stream: ">"})
    entry = {f[b"id"].decode(): e.decode() for e, f in got[0][1]}

    # a new promoter moves a layout-1 job that is due
    wait_until(lambda: new_promote(r, k) == 1, what="the promotion")
    # a start while the queue is paused hands the job back, no attempt counted
    r.set(k.paused, 1)
    assert start_entries(r, k, "new-1", [(entry["paused"], "paused")])[0] == b"paused"
    r.delete(k.paused)
    # a start over the queue's rate hands the job back ('released' took the one start)
    rated = QueueConfig(rate_limit=RateLimit(1, period_s=3600))
    keys, args = start_call(k, "new-1", rated, [(entry["released"], "released", "t-rel"),
                                                (entry["limited"], "limited", "t-lim")],
                            [], rate=True)
    reply = SCRIPTS["start"](r, keys, args)
    assert (reply[0], reply[7]) == (b"run", b"limited")
    # a graceful stop releases a started job and an entry it never started
    assert new_release(r, k, "new-1", [("released", entry["released"], "t-rel"),
                                       ("unstarted", entry["unstarted"], "")]) == [1, 1]
    # attempts that end in a retry, in a RateLimited hand-back, in a dead letter; one left to
    # lapse; one requeued by an operator
    for j in ["retried", "later", "lapsed", "requeued", "redriven"]:
        assert start_entries(r, k, "new-1", [(entry[j], j)], token=f"t-{j}")[0] == b"run"
    # the lease about to lapse is renewed and reports progress first
    assert SCRIPTS["renew"](r, [k.stream, k.job("lapsed")],
                            [GROUP, "new-1", entry["lapsed"], "t-lapsed"]) == [1]
    assert SCRIPTS["progress"](r, [k.events, k.job("lapsed")],
                               [CFG.events_arg, 10, 1, "lapsed", "t-lapsed", '{"p": 1}', ""]) == [1]
    assert finish(r, q, "retried", entry["retried"], "t-retried", "retry", 0) == [b"retrying"]
    assert finish(r, q, "later", entry["later"], "t-later", "later", 0) == [b"retrying"]
    assert finish(r, q, "redriven", entry["redriven"], "t-redriven", "dead",
                  "boom") == [b"failed"]
    admin = Admin.from_url(url)
    try:
        assert admin.requeue(q.name, "requeued") == "requeued"
        [dead] = admin.dead(q.name).items
        assert admin.redrive(q.name, [dead]) == {"redriven": 1}
        assert admin.cancel(q.name, "cancelled").cancelled
    finally:
        admin.close()

    # the old worker runs every one of them (the lapsed lease by a takeover), each once
    old = OldWorker(r, k, "old-1")
    drain_old(old, [j for j in payload if j != "cancelled"], r, k)
    assert old.dead == [] and r.xlen(k.dead) == 0
    assert sorted(old.completed()) == sorted(j for j in payload if j != "cancelled")
    for j, n in payload.items():
        if j != "cancelled":
            assert r.hget(k.job(j), "result") == str(n + 1).encode()
            assert q.result(j, timeout=1) == n + 1  # and today's readers read it
    assert r.xlen(k.stream) == 0 and r.zcard(k.delayed) == 0
    # what an old producer's result() and an old worker read: every record still layout 1
    for j in payload:
        assert layout_1(r, k.job(j)), (j, r.hgetall(k.job(j)))
    assert r.hget(k.job("cancelled"), "state") == b"cancelled"


async def test_old_and_new_workers_side_by_side(url: str, q: Queue, r: redis.Redis) -> None:
    """Step 1 of the rolling upgrade, both ways: an old producer enqueues throughout; a new
    worker runs, retries and promotes jobs and is stopped with jobs in flight, and an old
    worker runs what it handed back; then the old worker is stopped with jobs in flight (and
    dies holding others) while a new worker and the old one share the queue. Nothing is
    dead-lettered and every job completes exactly once."""
    k = q.keys
    ok: dict[str, int] = {}
    held: set[str] = set()  # held by the first new worker when it stopped
    new_tries: set[str] = set()  # retried by the first new worker
    gate = asyncio.Event()
    reg = Registry()

    @reg.handler("add")
    async def add(job: Job) -> int:
        n = int(job.payload["n"])
        if n % 5 == 0 and job.attempt == 1:
            if not gate.is_set():
                new_tries.add(job.id)
            raise Retry("flaky", delay_s=0.2)
        if n % 3 == 1 and not gate.is_set():
            held.add(job.id)
            await gate.wait()  # held until the new worker stops (it never is)
        ok[job.id] = ok.get(job.id, 0) + 1
        return n + 1

    def old_run(lease: OldLease) -> str | None:
        n = int(lease.payload["n"])
        if n % 5 == 0 and lease.attempt == 1:
            return None
        ok[lease.job_id] = ok.get(lease.job_id, 0) + 1
        return json.dumps(n + 1)

    ids = [f"j{i}" for i in range(60)]
    v1_enqueue(r, k, [(j, "add", {"n": i}, 0 if i % 4 else 30) for i, j in enumerate(ids[:30])])
    # a new worker promotes, retries and completes some, and holds others when it stops
    async with running(url, q.name, reg, concurrency=4, grace_period_s=0.05):
        await eventually(lambda: r.zcard(k.delayed) == 0 and len(ok) >= 5
                         and len(r.xpending_range(k.stream, GROUP, "-", "+", 100)) >= 4,
                         what="the new worker holding four jobs")
    assert len(held) >= 4 and new_tries
    retried_left = new_tries - set(ok)  # retried by the new worker, not run by it since
    # the old worker alone runs everything the new one left: handed back at its stop,
    # promoted (scheduled, or retrying after its attempt failed) and not yet run
    old = OldWorker(r, k, "old-1")
    first = ids[:30]

    def alone() -> bool:
        old.step(old_run, 10)
        return all(r.hget(k.job(j), "state") == b"completed" for j in first) or bool(old.dead)
    await eventually(lambda: asyncio.to_thread(alone), timeout_s=20,
                     what="the old worker completing the first jobs")
    assert old.dead == []
    assert held | retried_left <= set(old.completed())
    v1_enqueue(r, k, [(j, "add", {"n": i + 30}, 0) for i, j in enumerate(ids[30:])])
    # the old worker stops with jobs in flight, and another of its kind dies holding some
    leaving = await asyncio.to_thread(old.fetch, 3)
    assert await asyncio.to_thread(old.release, leaving) == [1] * len(leaving)
    dying = await asyncio.to_thread(OldWorker(r, k, "old-2").fetch, 2)
    assert len(dying) == 2
    gate.set()
    async with running(url, q.name, reg, visibility_timeout_s=0.5, reclaim_interval_s=0.1):
        def turn() -> bool:
            old.step(old_run, 2)
            return all(r.hget(k.job(j), "state") == b"completed" for j in ids) \
                or bool(old.dead)
        await eventually(lambda: asyncio.to_thread(turn), timeout_s=30,
                         what="every job completed by one worker or the other")
    assert old.dead == [] and r.xlen(k.dead) == 0
    assert ok == dict.fromkeys(ids, 1)  # each ran to completion once
    assert old.completed()  # the old worker did its share
    assert {lease.job_id for lease in dying} <= set(ok)
    for i, j in enumerate(ids):
        assert q.result(j, timeout=1) == i + 1
    assert r.xlen(k.stream) == 0 and r.zcard(k.delayed) == 0


def test_every_script_that_reads_records_writes_layout_1_back() -> None:
    """A script that reads job records through _lib.lua's rec, rec_t, start_entry or accept
    may turn a layout-1 record into layout 2 for its call (rec_t): it must call v1_restore
    before it returns, or an old worker would meet the record in layout 2."""
    lua = Path(__file__).parent.parent / "streamq" / "lua"
    reads = re.compile(r"\b(rec|rec_t|start_entry|accept)\(")
    restore = ("v1_restore()", "if V1_KEPT then lib_cold().v1_restore() end")
    checked = []
    for path in sorted(lua.glob("*.lua")):
        if path.name.startswith("_"):
            continue
        code = [ln for ln in path.read_text().splitlines() if not ln.lstrip().startswith("--")]
        if not any(reads.search(ln) for ln in code):
            continue
        checked.append(path.stem)
        first_read = next(i for i, ln in enumerate(code) if reads.search(ln))
        for i, ln in enumerate(code):
            # every return at the script's level (not inside a function it defines) after
            # its first read of a record
            if i > first_read and re.match(r"^\s*return\b", ln) and not _in_function(code, i):
                assert code[i - 1].strip().startswith(restore), (path.name, i, ln)
    assert {"start", "claim", "finish", "promote", "release", "requeue"} <= set(checked)


def _in_function(code: list[str], at: int) -> bool:
    """Whether line ``at`` lies inside a function defined in the script (indentation: the
    scripts define functions at column 0 and close them with 'end' at column 0)."""
    depth = False
    for ln in code[:at]:
        if re.match(r"^(local\s+)?function\b", ln):
            depth = True
        elif ln == "end":
            depth = False
    return depth


async def test_a_new_record_an_old_worker_buried_can_be_redriven(
        url: str, q: Queue, r: redis.Redis) -> None:
    """Out of order (a new producer during step 1): an old worker dead-letters a layout-2
    record as corrupted, writing layout-1 fields beside it. Once new workers run, an operator
    re-drives it like any dead letter and it runs: nothing is lost."""
    k = q.keys
    job = q.enqueue("add", {"n": 41}, job_id="new-one")
    old = OldWorker(r, k, "old-1")
    assert old.fetch(1) == [] and old.dead == [("new-one", "job record corrupted")]
    h: Any = r.hgetall(k.job("new-one"))
    assert h[b"s"] == b"q" and h[b"state"] == b"failed"  # both layouts' fields
    admin = Admin.from_url(url)
    try:
        [dead] = admin.dead(q.name).items
        assert dead.job_id == "new-one" and dead.reason == "job record corrupted"
        assert admin.redrive(q.name, [dead]) == {"redriven": 1}
    finally:
        admin.close()
    h = r.hgetall(k.job("new-one"))
    assert h[b"s"] == b"q" and b"state" not in h and r.ttl(k.job("new-one")) == -1
    reg = Registry()

    @reg.handler("add")
    async def add(j: Job) -> int:
        return int(j.payload["n"]) + 1

    async with running(url, q.name, reg):
        assert await asyncio.to_thread(q.result, job.job_id, timeout=10) == 42
