"""Workflow hand-off: a job its dependency's terminal script releases is started there for a
worker waiting for work (finish.lua's caller, or an idle worker's ticket; _flow.lua's hand;
docs/workflows.md#hand-off). What a user relies on: it runs once, with attempt 1; a repeated
finish hands nothing twice; a paused queue, a priority or a group keeps the release in the
stream; a worker that stops without reading it gives it back without its attempt."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from helpers import eventually, fast, finished, started

from streamq import Job, Queue, Registry, Worker
from streamq._core.keys import GROUP
from streamq._core.scripts import SCRIPTS, Script
from streamq._worker.handoff import inbox_row
from streamq.admin import Admin

PREFIX = "px"
"""The lease-token prefix of the made-up worker the scripts below hand jobs to."""


def _finish_as(r: redis.Redis, q: Queue, job_id: str, entry: str, token: str,
               consumer: str = "c1", takes: int = 4) -> list[Any]:
    """finish.lua completing ``job_id`` for ``consumer``, which takes up to ``takes`` jobs the
    call releases (the worker's own arguments: settle.py)."""
    k = q.keys
    keys = [k.stream, k.delayed, k.dead, k.stats, k.events, k.job(job_id), *k.group_keys,
            k.finished(consumer), k.recent]
    out: list[Any] = SCRIPTS["finish"](r, keys, [
        GROUP, "1000", 3600, 1000, "", 1, job_id, entry, token, "ok", b"42", 1000, "",
        q.config.group_arg, 100, consumer, k.job(""), PREFIX, takes])
    return out


def _started(r: redis.Redis, q: Queue, job_id: str) -> tuple[str, str]:
    r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    return started(r, q, job_id)


def _pending_of(r: redis.Redis, q: Queue, consumer: str) -> list[str]:
    got: Any = r.xreadgroup(GROUP, consumer, {q.keys.stream: "0"}, count=100)
    return [e[0].decode() for e in got[0][1]] if got else []


def test_the_finishing_caller_is_handed_the_released_job_started(
        r: redis.Redis, q: Queue) -> None:
    entry, token = _started(r, q, "a")
    q.enqueue("x", job_id="b", depends_on=["a"])
    out = _finish_as(r, q, "a", entry, token)
    assert out[0] == b"completed"
    assert len(out) == 1 + 10
    eid, jid, code, tok, attempt = out[1:6]
    assert out[10] == [f"0 {q.name} a".encode(), b"c42"]  # its dependency results, inline
    assert (jid, code, int(attempt)) == (b"b", b"run", 1)
    assert tok == f"{PREFIX}h{eid.decode()}".encode()
    rec = q.get("b")
    assert rec is not None and rec.state == "active"
    assert r.hget(q.keys.job("b"), "n") == b"1"
    assert _pending_of(r, q, "c1") == [eid.decode()]  # delivered to the caller, as a claim's


def test_a_repeated_finish_hands_the_released_job_once(r: redis.Redis, q: Queue) -> None:
    entry, token = _started(r, q, "a")
    q.enqueue("x", job_id="b", depends_on=["a"])
    first = _finish_as(r, q, "a", entry, token)
    again = _finish_as(r, q, "a", entry, token)  # the client's repeat after a lost reply
    assert len(first) == 11
    assert again == [b"completed"]  # nothing released, nothing handed again
    assert r.hget(q.keys.job("b"), "n") == b"1"
    assert len(_pending_of(r, q, "c1")) == 1
    assert r.xlen(q.keys.stream) == 1
    # the repeat's caller finds it among its own pending entries: start.lua with its token
    # prefix answers the same start (no second attempt)
    got: Any = SCRIPTS["start"](r, [q.keys.stream, q.keys.dead, q.keys.stats, q.keys.events,
                                    q.keys.paused, q.keys.job("b")],
                                [GROUP, "c1", "1000", 3600, 1000, PREFIX, 1, first[1], "b",
                                 "other-token", 0])
    assert (got[0], got[1], int(got[2])) == (b"run", first[4], 1)


@pytest.mark.parametrize("why", ["paused", "priority", "group", "takes none"])
def test_a_release_that_must_not_start_here_stays_in_its_stream(
        r: redis.Redis, q: Queue, why: str) -> None:
    entry, token = _started(r, q, "a")
    q.enqueue("x", job_id="b", depends_on=["a"], priority=4 if why == "priority" else None)
    if why == "paused":
        Admin(q.client).pause(q.name)
    if why == "group":  # (group= with dependencies is refused by the producer: the guard)
        r.hset(q.keys.job("b"), "g", "g1")
    out = _finish_as(r, q, "a", entry, token, takes=0 if why == "takes none" else 4)
    assert out == [b"completed"]
    rec = q.get("b")
    assert rec is not None and rec.state == "queued"
    assert r.hget(q.keys.job("b"), "n") in (None, b"0")
    assert _pending_of(r, q, "c1") == []


def test_a_handed_job_never_read_goes_back_without_its_attempt(
        r: redis.Redis, q: Queue) -> None:
    """The worker's reply was lost and it stops: its hand-back (settle.py: its whole pending
    list, release.lua with its token prefix) refunds the attempt the hand-off counted."""
    entry, token = _started(r, q, "a")
    q.enqueue("x", job_id="b", depends_on=["a"])
    out = _finish_as(r, q, "a", entry, token)
    eid = out[1].decode()
    k = q.keys
    released = SCRIPTS["release"](r, [k.stream, k.stats, k.events, k.job("b")],
                                  [GROUP, "1000", "c1", PREFIX, "b", eid, ""])
    assert released == [1]
    rec = q.get("b")
    assert rec is not None and rec.state == "queued"
    assert r.hget(k.job("b"), "n") in (None, b"0")
    assert _pending_of(r, q, "c1") == []


def test_a_cross_slot_release_takes_an_idle_workers_ticket(r: redis.Redis, q: Queue,
                                                           url: str) -> None:
    """resolve.lua (the relay's step in the parent's slot) hands the job it releases to an idle
    worker's ticket (ticket.lua), as enqueue.lua hands a new job."""
    k = q.keys
    other = f"{q.name}-other"
    with Queue.from_url(url, other) as oq:
        oq.enqueue("x", job_id="a")
    q.enqueue("x", job_id="b", depends_on=[(other, "a")])
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)  # (a worker made it)
    inbox = k.inbox(PREFIX)
    member = "|".join((k.job(""), inbox, PREFIX, "1000", "3600", "1000", "w1"))
    SCRIPTS["ticket"](r, [k.tickets, inbox], [member, 5000, GROUP, "w1"])
    sub = r.pubsub()  # type: ignore[no-untyped-call]
    sub.subscribe(inbox)  # a live worker listens on its inbox's channel
    assert sub.get_message(timeout=5.0) is not None  # (subscribed)
    try:
        members: Any = r.smembers(k.deps("b"))
        code = SCRIPTS["resolve"](r, [k.job("b")], ["b", members.pop().decode(), "c1"])
        assert code == 3
    finally:
        sub.close()
    got: Any = r.xrange(inbox)
    fields = got[0][1]
    assert (fields[b"id"], fields[b"c"], fields[b"n"]) == (b"b", b"run", b"1")
    dep = f"0 {other} a".encode()  # its dependency results came along
    assert fields[b"r"] == b"%d:%s2:c1" % (len(dep), dep)
    assert inbox_row(got[0])[-1] == [dep, b"c1"]
    assert r.zcard(k.tickets) == 0  # the ticket was used
    assert _pending_of(r, q, "w1") == [fields[b"e"].decode()]


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_a_chain_runs_each_step_once_with_attempt_1_handed_over(
        url: str, qname: str, concurrency: int) -> None:
    runs: dict[str, list[int]] = {}
    seen: dict[str, list[Any]] = {}
    reg = Registry()

    @reg.handler("step")
    async def step(job: Job) -> int:
        runs.setdefault(job.id, []).append(job.attempt)
        seen[job.id] = [d.result for d in job.dependency_results()]
        return len(runs)

    from streamq import JobSpec, chain
    async with Worker(url, [qname], reg, fast(concurrency=concurrency)) as w:
        with Queue.from_url(url, qname) as q:
            await asyncio.sleep(0.2)  # (not needed for correctness: the worker goes idle)
            q.enqueue_flow(chain(*(JobSpec("step") for _ in range(20))), flow_id="f")
            await eventually(lambda: finished(q, "f.19"), 30.0, "chain done")
        # every step ran once, with attempt 1; the steps after the first were released by
        # their dependency's finish.lua and started there for this worker
        assert runs == {f"f.{i}": [1] for i in range(20)}
        # each step saw the step before it (its results came with its start, or were read)
        assert seen == {f"f.{i}": [i] if i else [] for i in range(20)}
        assert w.stats.handed_over >= 19


async def test_concurrency_holds_when_one_end_releases_many(url: str, qname: str) -> None:
    """One job's end releases ten jobs: the worker takes a few of them started (the slots it
    offered, reserved for the call), the rest are read from the stream; never more at once
    than its concurrency."""
    running, peak = [0], [0]
    runs: dict[str, int] = {}
    reg = Registry()

    @reg.handler("x")
    async def x(job: Job) -> None:
        runs[job.id] = runs.get(job.id, 0) + 1
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        try:
            await asyncio.sleep(0.01)
        finally:
            running[0] -= 1

    with Queue.from_url(url, qname) as q:
        q.enqueue("x", job_id="a")  # (linked before the worker runs it)
        for i in range(10):
            q.enqueue("x", job_id=f"p{i}", depends_on=["a"])
        async with Worker(url, [qname], reg, fast(concurrency=3)):
            await eventually(lambda: finished(q, *(f"p{i}" for i in range(10))), 30.0,
                             "every parent done")
    assert runs == {"a": 1, **{f"p{i}": 1 for i in range(10)}}
    assert peak[0] <= 3


async def test_a_lost_finish_reply_runs_the_handed_job_once(
        url: str, qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The connection drops as finish.lua's reply (with a job it released and started for the
    worker) comes back: the worker sends the call again (it answers the same outcome and
    hands nothing again) and reads its own pending entries, where start.lua answers the same
    start: the released job runs once, with attempt 1, without waiting for its lease."""
    runs: dict[str, list[int]] = {}
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> int:
        runs.setdefault(job.id, []).append(job.attempt)
        return job.attempt

    orig = Script.run_async
    lost = [0]

    async def lossy(self: Script, client: Any, keys: Any, args: Any, *a: Any, **kw: Any
                    ) -> Any:
        reply: Any = await orig(self, client, keys, args, *a, **kw)
        if (self is SCRIPTS["finish"] and not lost[0]
                and len(reply) > abs(int(args[5]))):  # (it handed a job over; -N: compact)
            lost[0] += 1
            raise redis.ConnectionError("reply of finish.lua lost (test)")
        return reply

    # on the class, as other tests do: undoing a patch of the instance would leave the
    # original bound method on it, hiding later tests' patches of the class
    monkeypatch.setattr(Script, "run_async", lossy)
    monkeypatch.setattr(Script, "packable", lambda self, client: False)  # (unpacked)
    with Queue.from_url(url, qname) as q:
        q.enqueue("t", job_id="a")
        q.enqueue("t", job_id="b", depends_on=["a"], max_attempts=1)
        async with Worker(url, [qname], reg, fast(visibility_timeout_s=60.0)):
            await eventually(lambda: finished(q, "b"), 20.0, "the released job done")
        rec = q.get("b")
        assert rec is not None and rec.state == "completed"
    assert lost == [1]
    assert runs == {"a": [1], "b": [1]}
