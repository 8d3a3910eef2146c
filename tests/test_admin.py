"""Admin API and ops CLI against a real server: stats, pending, job, dead letters, re-drive,
requeue, pause, consumers, purge; --json shapes and the error paths a person meets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from helpers import eventually, fast

from streamq import Fail, InvalidArgument, Job, JobNotFound, Queue, Registry, UnknownQueue, Worker
from streamq._keys import GROUP
from streamq.admin import Admin, AsyncAdmin, DeadFilter

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


async def settled_queue(url: str, qname: str) -> Queue:
    """5 completed, 3 dead (Fail), 2 dead (TimeoutError), 1 scheduled, 1 queued (paused)."""
    q = Queue.from_url(url, qname)
    q.enqueue_many([{"type": "ok"} for _ in range(5)]
                   + [{"type": "bad", "job_id": f"b{i}", "payload": i} for i in range(3)]
                   + [{"type": "timeout", "job_id": f"t{i}", "max_attempts": 1}
                      for i in range(2)])
    q.enqueue("ok", job_id="later", delay=3600)
    async with Worker(url, [qname], registry(), fast()) as w:
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
    r.hset(k.job("wanted"), "state", "failed")
    r.xadd(k.dead, {"job": "wanted", "reason": "x", "etype": "E", "type": "email.send", "t": 0})
    assert Admin.from_url(url).redrive_matching(qname, DeadFilter(type="email.send")) == {
        "redriven": 1}


def test_redact_hides_passwords() -> None:
    from streamq._cli_ops import redact

    assert redact("redis://user:s3cret@h:1/0") == "redis://user:***@h:1/0"
    assert "s3cret" not in redact("unix:///tmp/r.sock?db=0&password=s3cret")
