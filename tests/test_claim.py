"""The fetch path (streamq/_worker/fetch.py, claim.lua): claims under a backlog, a lost
claim reply, and the idle wait, against a real redis-server."""

from __future__ import annotations

from typing import Any

import redis
from helpers import eventually, fast

from streamq import Job, Queue, Registry, Worker
from streamq._core.config import QueueConfig
from streamq._core.keys import GROUP, Keys
from streamq._core.scripts import SCRIPTS
from streamq._worker.calls import claim_call, claim_rows
from streamq.admin import Admin


def _parse(reply: list[Any], prefix: str = "pfx", first: int = 0) -> list[dict[str, Any]]:
    return [{"entry": eid, "id": jid, "code": code, "token": token, "attempt": attempt,
             "level": lv}
            for lv, eid, jid, code, token, attempt, *_ in claim_rows(reply, prefix, first)]


def test_claim_reads_and_starts_a_batch(r: redis.Redis, qname: str, url: str) -> None:
    k = Keys(qname)
    with Queue.from_url(url, qname) as q:
        for i in range(5):
            q.enqueue("t", {"i": i}, job_id=f"j{i}")
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    reply = SCRIPTS["claim"](r, *claim_call(k, "c1", QueueConfig(), "pfx", 16, 3))
    got = _parse(reply, "pfx", 16)
    assert reply[0] == b"ok" and reply[1] == b""
    assert [g["id"] for g in got] == ["j0", "j1", "j2"]
    assert [g["token"] for g in got] == ["pfx10", "pfx11", "pfx12"]
    assert all(g["code"] == "run" and g["attempt"] == 1 for g in got)
    rec = r.hgetall(k.job("j0"))
    assert rec[b"s"] == b"a" and rec[b"o"] == b"c1" and rec[b"k"] == b"pfx10"
    pending = r.xpending(k.stream, GROUP)
    assert pending["pending"] == 3
    # fewer left than asked: the two that are left, then nothing
    assert [g["id"] for g in _parse(SCRIPTS["claim"](
        r, *claim_call(k, "c1", QueueConfig(), "pfx", 19, 3)))] == ["j3", "j4"]
    assert _parse(SCRIPTS["claim"](r, *claim_call(k, "c1", QueueConfig(), "pfx", 22, 3))) == []


def test_claim_answers_paused_and_reads_nothing(r: redis.Redis, qname: str, url: str) -> None:
    k = Keys(qname)
    with Queue.from_url(url, qname) as q:
        q.enqueue("t", job_id="a")
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    r.set(k.paused, 1)
    reply = SCRIPTS["claim"](r, *claim_call(k, "c1", QueueConfig(), "p", 1, 10))
    assert reply[0] == b"paused" and len(reply) == 4
    assert r.xpending(k.stream, GROUP)["pending"] == 0


def test_claim_dead_letters_a_malformed_entry(r: redis.Redis, qname: str) -> None:
    k = Keys(qname)
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    r.xadd(k.stream, {"junk": "x"})
    got = _parse(SCRIPTS["claim"](r, *claim_call(k, "c1", QueueConfig(), "p", 1, 10)), "p", 1)
    assert [g["code"] for g in got] == ["dead"]
    assert r.xlen(k.stream) == 0 and r.xlen(k.dead) == 1
    assert r.xpending(k.stream, GROUP)["pending"] == 0


def test_claim_reports_a_missing_group(r: redis.Redis, qname: str) -> None:
    k = Keys(qname)
    r.xadd(k.stream, {"id": "x"})
    reply = SCRIPTS["claim"](r, *claim_call(k, "c1", QueueConfig(), "p", 1, 10))
    assert reply[0] == b"ok" and reply[1] == b"1" and len(reply) == 4


async def test_a_lost_claim_reply_burns_no_attempt(url: str, qname: str,
                                                   r: redis.Redis) -> None:
    """claim.lua ran (entries in the worker's pending list, jobs active under its tokens)
    but the worker never saw the reply: it reads its own pending entries again and runs
    each job once, as attempt 1 (start.lua answers the start it already made)."""
    k = Keys(qname)
    ledger: list[tuple[str, int]] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        ledger.append((job.id, job.attempt))

    admin = Admin.from_url(url)
    admin.pause(qname)  # the worker's own fetch stays out of the way while the call runs
    with Queue.from_url(url, qname) as q:
        for i in range(6):
            q.enqueue("t", job_id=f"j{i}")
        async with Worker(url, [qname], reg, fast(), consumer="lost-1") as w:
            # the call the worker made, run here; its reply "lost". A flag key that is not
            # set stands in for the pause flag, so the call itself is not refused.
            first = w._take_tokens(4)
            keys, args = claim_call(k, w.consumer, QueueConfig(), w._token_prefix, first, 4)
            keys[3] = k.base + ":not-paused"
            got = _parse(SCRIPTS["claim"](r, keys, args), w._token_prefix, first)
            assert [g["code"] for g in got] == ["run"] * 4
            assert all(r.hget(k.job(g["id"]), "n") == b"1" for g in got)
            admin.resume(qname)  # the worker reads its own pending entries first
            await eventually(lambda: len(ledger) == 6, what="all jobs to run")
            await eventually(lambda: all(q.get(f"j{i}").state == "completed"  # type: ignore
                                         for i in range(6)), what="all jobs to complete")
        assert sorted(ledger) == [(f"j{i}", 1) for i in range(6)]
        assert all(q.get(f"j{i}").attempts == 1 for i in range(6))  # type: ignore[union-attr]
    admin.close()


async def test_an_own_pending_entry_deleted_meanwhile_is_acked_not_dead_lettered(
        url: str, qname: str, r: redis.Redis) -> None:
    """A worker restarted under its consumer name reads its own pending entries first; one
    deleted from the stream meanwhile (redis-py 8 reads it as {} fields, older ones as None)
    is a ghost: acked, no dead letter, no failure counted, the others run."""
    k = Keys(qname)
    ran: list[str] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        ran.append(job.id)

    admin = Admin.from_url(url)
    admin.pause(qname)
    with Queue.from_url(url, qname) as q:
        for i in range(3):
            q.enqueue("t", job_id=f"j{i}")
        r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
        # delivered to "ghost-1" (its start never ran), then j1's entry and record removed
        got: Any = r.xreadgroup(GROUP, "ghost-1", {k.stream: ">"})
        entries = {f[b"id"].decode(): eid for eid, f in got[0][1]}
        r.xdel(k.stream, entries["j1"])
        r.delete(k.job("j1"))
        async with Worker(url, [qname], reg, fast(), consumer="ghost-1"):
            admin.resume(qname)
            await eventually(lambda: sorted(ran) == ["j0", "j2"], what="j0 and j2 to run")
            await eventually(lambda: r.xpending(k.stream, GROUP)["pending"] == 0,
                             what="nothing left pending")
        assert r.xlen(k.dead) == 0
        assert r.hget(k.stats, "failed") in (None, b"0")
        assert q.get("j0").state == "completed"  # type: ignore[union-attr]
    admin.close()


async def test_idle_worker_starts_a_job_then_drains_by_claims(url: str, qname: str) -> None:
    """An idle worker (blocking read) starts a lone job; a backlog after it is claimed."""
    done: list[str] = []
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        done.append(job.id)

    with Queue.from_url(url, qname) as q:
        async with Worker(url, [qname], reg, fast(), consumer="idle-1") as w:
            q.enqueue("t", job_id="first")
            await eventually(lambda: done == ["first"], what="the lone job")
            q.enqueue_many([{"type": "t", "job_id": f"b{i}"} for i in range(300)])
            await eventually(lambda: len(done) == 301, what="the backlog")
            assert w.stats.started == 301
