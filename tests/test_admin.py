"""Admin API and ops CLI against a real server: stats, pending, job, dead letters, re-drive,
requeue, pause, consumers, purge; --json shapes and the error paths a person meets."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import eventually, fast

from streamq import (
    ALL_EVENTS,
    Fail,
    InvalidArgument,
    Job,
    JobNotFound,
    Queue,
    QueueConfig,
    Registry,
    UnknownQueue,
    Worker,
)
from streamq._core.driver import drive
from streamq._core.keys import GROUP
from streamq._ops.browse import count_dead, timeline
from streamq.admin import Admin, AsyncAdmin, DeadFilter, ListFilter

TESTS = Path(__file__).parent


def cli(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMQ_URL"}
    return subprocess.run([sys.executable, "-m", "streamq", *args, "--url", url], cwd=TESTS,
                          env=env, capture_output=True, text=True, timeout=60, input=stdin)


def registry() -> Registry:
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> int:
        return 1

    @reg.handler("bad")
    async def bad(job: Job) -> None:
        raise Fail(f"bad {job.payload}")

    @reg.handler("timeout")
    async def timeout(job: Job) -> None:
        raise TimeoutError("slow upstream")

    return reg


EVERY = QueueConfig(event_kinds=ALL_EVENTS)


async def settled_queue(url: str, qname: str) -> Queue:
    """5 completed, 3 dead (Fail), 2 dead (TimeoutError), 1 scheduled, 1 queued (paused);
    every event kind written (the listings of recent jobs and the timelines read them)."""
    q = Queue.from_url(url, qname, EVERY)
    q.enqueue_many([{"type": "ok"} for _ in range(5)]
                   + [{"type": "bad", "job_id": f"b{i}", "payload": i} for i in range(3)]
                   + [{"type": "timeout", "job_id": f"t{i}", "max_attempts": 1}
                      for i in range(2)])
    q.enqueue("ok", job_id="later", delay=3600)
    async with Worker(url, [qname], registry(), fast(), EVERY) as w:
        await eventually(lambda: w.stats.completed + w.stats.failed == 10, what="settle")
    return q


async def test_admin_stats_dead_and_redrive(url: str, qname: str, r: redis.Redis) -> None:
    q = await settled_queue(url, qname)
    admin = Admin.from_url(url)
    assert admin.check_server() >= (6, 2)
    assert qname in admin.queues()
    s = admin.stats(qname)
    assert (s.ready, s.pending, s.scheduled, s.retrying, s.dead) == (0, 0, 1, 0, 5)
    assert s.counters["completed"] == 5 and s.counters["failed"] == 5
    assert s.consumers == 1 and s.workers_alive == 1 and not s.paused
    page = admin.dead(qname, DeadFilter(error_type="TimeoutError"))
    assert sorted(e.job_id for e in page.items) == ["t0", "t1"] and page.cursor is None
    assert len(admin.dead(qname, DeadFilter(type="bad")).items) == 3
    assert admin.dead(qname, DeadFilter(older_than_s=3600)).items == []
    first = admin.dead(qname, limit=2)
    assert len(first.items) == 2 and first.cursor is not None
    rest = admin.dead(qname, cursor=first.cursor)
    assert len(rest.items) == 3
    # two operators re-drive the same selection: each job once
    chosen = admin.dead(qname, DeadFilter(type="bad")).items
    assert admin.redrive(qname, chosen) == {"redriven": 3}
    assert admin.redrive(qname, chosen) == {"gone": 3}
    info = q.get("b1")
    assert info is not None and info.state == "queued" and info.attempts == 0
    assert r.ttl(q.keys.job("b1")) == -1  # the dead-letter retention TTL is gone
    s = admin.stats(qname)
    assert (s.ready, s.dead) == (3, 2) and s.oldest_ready_age_s is not None
    assert admin.redrive_matching(qname) == {"redriven": 2}
    assert admin.stats(qname).dead == 0


async def test_admin_pending_requeue_pause_purge(url: str, qname: str, r: redis.Redis) -> None:
    q = Queue.from_url(url, qname)
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue_many([{"type": "ok", "job_id": f"p{i}"} for i in range(3)])
    r.xreadgroup(GROUP, "stuck-worker", {k.stream: ">"}, count=2)
    admin = Admin.from_url(url)
    page = admin.pending(qname)
    assert [p.job_id for p in page.items] == ["p0", "p1"]
    assert page.items[0].consumer == "stuck-worker" and page.items[0].deliveries == 1
    assert admin.pending(qname, consumer="nobody").items == []
    assert admin.pending(qname, min_idle_s=3600).items == []
    assert admin.requeue(qname, "p0") == "requeued"
    assert [p.job_id for p in admin.pending(qname).items] == ["p1"]
    assert admin.requeue(qname, "p0") == "requeued"  # still queued: handed back again
    with pytest.raises(JobNotFound):
        admin.requeue(qname, "nope")
    admin.pause(qname)
    assert admin.stats(qname).paused
    admin.resume(qname)
    assert not admin.stats(qname).paused
    q.enqueue("ok", job_id="s1", delay=600)
    assert admin.purge(qname, "scheduled") == 1
    assert admin.purge(qname, "queued") == 3
    assert admin.stats(qname).ready == 0 and r.zcard(k.delayed) == 0
    for state in ("active", "completed", "bogus"):
        with pytest.raises(InvalidArgument):
            admin.purge(qname, state)
    with pytest.raises(UnknownQueue):
        admin.stats(qname + "-missing")


async def test_async_admin_matches(url: str, qname: str) -> None:
    await settled_queue(url, qname)
    admin = AsyncAdmin.from_url(url)
    try:
        s = await admin.stats(qname)
        assert s.dead == 5 and s.scheduled == 1
        page = await admin.dead(qname)
        assert len(page.items) == 5
        assert await admin.redrive(qname, page.items) == {"redriven": 5}
        info = await admin.job(qname, "t0")
        assert info.state == "queued" and info.errors[0]["type"] == "TimeoutError"
        assert [c.name for c in await admin.consumers(qname)]
    finally:
        await admin.close()


async def test_cli_json_shapes(url: str, qname: str) -> None:
    await settled_queue(url, qname)
    stats = json.loads(cli(url, "stats", qname, "--json").stdout)
    assert stats[0]["queue"] == qname and stats[0]["dead"] == 5
    assert set(stats[0]) >= {"ready", "pending", "scheduled", "retrying", "dead", "consumers",
                             "workers_alive", "paused", "oldest_ready_age_s", "counters"}
    dead = json.loads(cli(url, "dead", "list", qname, "--error", "TimeoutError", "--json").stdout)
    assert sorted(e["job_id"] for e in dead["items"]) == ["t0", "t1"]
    job = json.loads(cli(url, "job", qname, "t0", "--json").stdout)
    assert job["state"] == "failed" and job["error"]["type"] == "TimeoutError"
    pending = json.loads(cli(url, "pending", qname, "--json").stdout)
    assert pending == {"items": [], "cursor": None}
    consumers = json.loads(cli(url, "consumers", qname, "--json").stdout)
    assert consumers[0]["pending"] == 0
    enq = json.loads(cli(url, "enqueue", qname, "ok", '{"a": 1}', "--id", "c1", "--json").stdout)
    assert enq["status"] == "queued" and enq["job_id"] == "c1"
    assert json.loads(cli(url, "cancel", qname, "c1", "--json").stdout)["cancelled"] is True
    human = cli(url, "stats", qname).stdout
    assert "READY" in human and qname in human


async def test_cli_confirms_bulk_changes(url: str, qname: str) -> None:
    await settled_queue(url, qname)
    refused = cli(url, "dead", "redrive", qname)
    assert refused.returncode != 0 and "--yes" in refused.stderr
    done = cli(url, "dead", "redrive", qname, "--type", "bad", "--yes", "--json")
    assert json.loads(done.stdout) == {"redriven": 3}
    again = cli(url, "dead", "redrive", qname, "--type", "bad", "--yes", "--json")
    assert json.loads(again.stdout) == {}
    purged = cli(url, "dead", "purge", qname, "--yes", "--json")
    assert json.loads(purged.stdout) == {"purged": 2}


def test_cli_errors_are_one_line_with_a_nonzero_exit(url: str, qname: str) -> None:
    Queue.from_url(url, qname).enqueue("t")  # the queue exists: each error is about its case
    cases = [
        (("stats", "no-such-queue"), "does not exist"),
        (("enqueue", qname, "t", "{not json"), "not valid JSON"),
        (("job", qname, "bad id!"), "invalid job id"),
        (("purge", qname, "--state", "queued"), "--yes"),
    ]
    for args, message in cases:
        proc = cli(url, *args)
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr
    down = cli("redis://127.0.0.1:1/0", "stats", qname)
    assert down.returncode != 0 and "cannot reach Redis" in down.stderr
    assert "Traceback" not in down.stderr
    debug = cli("redis://127.0.0.1:1/0", "stats", qname, "--debug")
    assert "Traceback" in debug.stderr
    wrong = cli(url.replace("redis://", "redis://:wrongpass@"), "stats", qname)
    assert "authentication failed" in wrong.stderr and "wrongpass" not in wrong.stderr


def test_redrive_matching_pages_past_non_matching_entries(url: str, qname: str,
                                                          r: redis.Redis) -> None:
    q = Queue.from_url(url, qname)
    k = q.keys
    pipe = r.pipeline(transaction=False)
    for i in range(12_000):  # more than one dead() scan of other types
        pipe.xadd(k.dead, {"job": f"o{i}", "reason": "x", "etype": "E", "type": "other", "t": 0})
    pipe.execute()
    q.enqueue("email.send", job_id="wanted")
    r.hset(k.job("wanted"), "s", "f")  # failed
    r.xadd(k.dead, {"job": "wanted", "reason": "x", "etype": "E", "type": "email.send", "t": 0})
    assert Admin.from_url(url).redrive_matching(qname, DeadFilter(type="email.send")) == {
        "redriven": 1}


def test_redact_hides_passwords() -> None:
    from streamq.cli.common import redact

    assert redact("redis://user:s3cret@h:1/0") == "redis://user:***@h:1/0"
    assert "s3cret" not in redact("unix:///tmp/r.sock?db=0&password=s3cret")


# ------------------------------------------------------------------ listings, timeline, actions


async def test_listings_by_state_page_with_cursors(url: str, qname: str, r: redis.Redis) -> None:
    await settled_queue(url, qname)
    q = Queue.from_url(url, qname)
    admin = Admin.from_url(url)
    admin.pause(qname)
    q.enqueue_many([{"type": "ok" if i % 2 else "bad", "job_id": f"r{i}"} for i in range(7)])
    first = admin.ready(qname, limit=3)
    assert [j.job_id for j in first.items] == ["r0", "r1", "r2"] and first.cursor
    rest = admin.ready(qname, limit=10, cursor=first.cursor)
    assert [j.job_id for j in rest.items] == ["r3", "r4", "r5", "r6"] and rest.cursor is None
    assert rest.items[0].state == "queued" and rest.items[0].type == "ok"
    only_bad = admin.ready(qname, ListFilter(type="bad"))
    assert [j.job_id for j in only_bad.items] == ["r0", "r2", "r4", "r6"]
    # ten delayed jobs due at the same millisecond page through the ties
    when = dt.datetime(2100, 1, 1, tzinfo=dt.UTC)
    q.enqueue_many([{"type": "ok", "job_id": f"d{i}", "run_at": when} for i in range(10)])
    seen: list[str] = []
    cursor = None
    while True:
        page = admin.delayed(qname, "scheduled", limit=4, cursor=cursor)
        seen += [j.job_id for j in page.items]
        if page.cursor is None:
            break
        cursor = page.cursor
    assert seen == ["later", *sorted(f"d{i}" for i in range(10))]
    assert admin.delayed(qname, "retrying").items == []
    done = admin.recent(qname, "completed")
    assert len(done.items) == 5 and all(j.state == "completed" for j in done.items)
    assert len(admin.recent(qname, "completed", limit=2).items) == 2
    assert admin.recent(qname, "failed", ListFilter(type="timeout")).items[0].type == "timeout"
    for bad in ("nope", "1-2-3", "';--"):
        with pytest.raises(InvalidArgument):
            admin.ready(qname, cursor=bad)
        with pytest.raises(InvalidArgument):
            admin.delayed(qname, cursor=bad)
    with pytest.raises(InvalidArgument):
        admin.recent(qname, "enqueued")
    # paging past the end is an empty page, not an error
    assert admin.ready(qname, cursor="99999999999999-0").items == []


async def test_timeline_workers_cron_run_now_cancel_audit(url: str, qname: str,
                                                          r: redis.Redis) -> None:
    q = await settled_queue(url, qname)
    admin = Admin.from_url(url)
    info = admin.job(qname, "t0")
    assert info.created_at is not None
    tl = admin.timeline(qname, "t0", int(info.created_at.timestamp() * 1000))
    assert [e.ev for e in tl.events] == ["enqueued", "started", "failed"] and tl.complete
    assert admin.timeline(qname, "t0", 0).events  # from the start of the stream
    ws = admin.workers(qname)
    assert len(ws) == 1 and ws[0].concurrency == 16 and ws[0].pid is not None
    r.hset(q.keys.cron, mapping={
        "nightly": json.dumps({"name": "nightly", "expr": "0 3 * * *", "tz": "UTC",
                               "job_type": "ok", "next_tick_ms": 1, "last_tick_ms": 0,
                               "last_job": "cron:nightly:0"}),
        "nightly:last": "0", "broken": "{not json"})
    (cron,) = admin.cron(qname)
    assert (cron.name, cron.schedule, cron.next_tick_ms) == ("nightly", "0 3 * * * (UTC)", 1)
    assert admin.run_now(qname, "later", who="ops@test") == "due now"
    assert r.zscore(q.keys.delayed, "later") == 0
    assert admin.run_now(qname, "t1").startswith("not run: job is failed")
    q.enqueue("ok", job_id="c1", delay=600)
    assert admin.cancel(qname, "c1", who="ops@test").cancelled
    assert not admin.cancel(qname, "c1").cancelled
    with pytest.raises(JobNotFound):
        admin.run_now(qname, "missing")
    admin.audit(qname, "pause", who="ops@test")
    events: Any = r.xrange(q.keys.events)
    audits = [f for _, f in events if f[b"ev"] == b"admin"]
    details = [a[b"d"].decode() for a in audits]
    assert details[0] == "run-now by ops@test: due now"
    assert "cancel by ops@test: cancelled" in details and details[-1] == "pause by ops@test"
    tl = admin.timeline(qname, "c1", 0)
    assert [e.ev for e in tl.events] == ["enqueued", "cancelled", "admin", "admin"]
    # found at the record's own times even when the newest-events scan misses them
    t0 = admin.job(qname, "t0")
    assert t0.finished_at is not None and t0.created_at is not None
    times = [int(t.timestamp() * 1000) for t in (t0.created_at, t0.finished_at)]
    r.xadd(q.keys.events, {"job": "other", "ev": "enqueued", "d": ""})
    narrow = drive(admin.client, timeline(q.keys, "t0", times[0], times, scan=1))
    # exactly the events of those milliseconds (each read as [t, t + 1]), 'started' too when
    # it fell in one of them
    full = admin.timeline(qname, "t0", 0).events
    assert [e.ev for e in narrow.events] == [
        e.ev for e in full if any(0 <= e.at_ms - t <= 1 for t in times)]
    assert [e.ev for e in narrow.events][::len(narrow.events) - 1] == ["enqueued", "failed"]
    assert not narrow.complete
    dead = admin.find_dead(qname, "t0", times[1])
    assert dead is not None and dead.job_id == "t0" and dead.error_type == "TimeoutError"
    assert admin.find_dead(qname, "t0", times[1] + 3_600_000) is None
    assert admin.count_dead(qname, DeadFilter(error_type="TimeoutError")) == (2, True)
    assert drive(admin.client, count_dead(q.keys, DeadFilter(), max_scan=1000)) == (5, True)
    assert admin.lease(qname, "t0") is None  # not in the stream
    q.enqueue("ok", job_id="l1")
    lease = admin.lease(qname, "l1")
    assert lease is not None and lease.consumer == "" and lease.idle_s is None


async def test_async_listings_match(url: str, qname: str) -> None:
    await settled_queue(url, qname)
    admin = AsyncAdmin.from_url(url)
    try:
        assert (await admin.delayed(qname)).items[0].job_id == "later"
        assert len((await admin.recent(qname, "completed")).items) == 5
        assert (await admin.ready(qname)).items == []
        assert len(await admin.workers(qname)) == 1 and await admin.cron(qname) == []
        assert await admin.run_now(qname, "later") == "due now"
        assert not (await admin.cancel(qname, "t0")).cancelled
        await admin.audit(qname, "resume")
        events = (await admin.timeline(qname, "t0")).events
        assert [e.ev for e in events][-2:] == ["failed", "admin"]
    finally:
        await admin.close()
