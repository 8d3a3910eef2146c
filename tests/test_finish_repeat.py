"""A repeated finish.lua call (its reply was lost) answers what the first one did, also for a
fire-and-forget job (``result_ttl=0``) whose record the first call deleted; a late finish of
another worker, whose lease was taken over, still gets 'lost' (invariants 3 and 12; issue #28,
defect 3)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis
from helpers import eventually, running, start_entries

from streamq import Job, Queue, QueueConfig, Registry
from streamq._core.keys import GROUP
from streamq._core.scripts import SCRIPTS, Script


def _lose_finish_replies(monkeypatch: pytest.MonkeyPatch, lose: list[int]) -> None:
    """The reply of the first lose[0] finish.lua calls is lost after the script ran."""
    orig = Script.run_async

    async def lossy(self: Script, client: Any, keys: Any, args: Any, **kw: Any) -> Any:
        reply = await orig(self, client, keys, args, **kw)
        if self is SCRIPTS["finish"] and lose[0] > 0:
            lose[0] -= 1
            raise redis.ConnectionError("reply of finish.lua lost (test)")
        return reply

    monkeypatch.setattr(Script, "run_async", lossy)
    monkeypatch.setattr(Script, "packable", lambda self, client: False)  # (unpacked)


async def test_a_lost_finish_reply_of_a_fire_and_forget_job_counts_a_completion(
        url: str, q: Queue, r: redis.Redis, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    lose = [1]
    _lose_finish_replies(monkeypatch, lose)
    reg = Registry()
    runs: list[str] = []

    @reg.handler("t")
    async def t(job: Job) -> None:
        runs.append(job.id)

    caplog.set_level(logging.WARNING, logger="streamq.worker")
    async with running(url, q.name, reg) as w:
        jid = q.enqueue("t", result_ttl=0).job_id
        await eventually(lambda: w.stats.completed + w.stats.lost == 1, what="the outcome")
        assert lose == [0]  # the first reply was lost: the settling loop sent it again
        assert (w.stats.completed, w.stats.lost) == (1, 0)
    assert runs == [jid] and q.get(jid) is None  # nothing of it is kept
    assert r.hget(q.keys.stats, "lease_lost") is None
    assert r.hget(q.keys.stats, "completed") == b"1"
    assert not [x for x in caplog.records if "lease lost" in x.getMessage()]


def _finish(r: redis.Redis, q: Queue, consumer: str, done: list[tuple[str, str, str]]
            ) -> list[bytes]:
    """finish.lua as a worker named ``consumer`` sends it: (job id, entry, token) per job,
    each completed with a None result."""
    k = q.keys
    keys = [k.stream, k.delayed, k.dead, k.stats, k.events, *(k.job(j) for j, _, _ in done),
            *k.group_keys, k.finished(consumer)]
    args: list[Any] = [GROUP, "1000", 3600, 1000, "", len(done)]
    for job, entry, token in done:
        args += [job, entry, token, "ok", b"", 0, ""]
    args.append(QueueConfig().group_arg)
    return list(SCRIPTS["finish"](r, keys, args))


def _read_and_start(r: redis.Redis, q: Queue, consumer: str) -> tuple[str, str, str]:
    got: Any = r.xreadgroup(GROUP, consumer, {q.keys.stream: ">"}, count=1)
    entry, fields = got[0][1][0]
    jid = fields[b"id"].decode()
    reply = start_entries(r, q.keys, consumer, [(entry.decode(), jid)])
    assert reply[0] == b"run"
    return jid, entry.decode(), reply[1].decode()


def test_a_repeat_is_told_from_another_workers_late_finish(q: Queue, r: redis.Redis) -> None:
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue("t", job_id="ff", result_ttl=0)
    _jid, entry, tok_a = _read_and_start(r, q, "A")
    # A's lease lapses: B takes the entry over (a reclaim) and starts it again
    r.xclaim(k.stream, GROUP, "B", 0, [entry], justid=True)
    reply: Any = start_entries(r, k, "B", [(entry, "ff")])
    assert reply[0] == b"run" and reply[2] == 2
    tok_b = reply[1].decode()
    assert _finish(r, q, "B", [("ff", entry, tok_b)]) == [b"completed"]
    assert not r.exists(k.job("ff"))  # fire-and-forget: nothing kept
    # A's late finish: its lease was taken over, whatever marker it names
    assert _finish(r, q, "A", [("ff", entry, tok_a)]) == [b"lost"]
    assert _finish(r, q, "B", [("ff", entry, tok_a)]) == [b"lost"]
    # B's repeat (its reply was lost) answers the same and writes nothing
    before = r.hgetall(k.stats)
    assert _finish(r, q, "B", [("ff", entry, tok_b)]) == [b"completed"]
    assert r.hgetall(k.stats) == before
    assert before[b"completed"] == b"1" and before[b"lease_lost"] == b"2"
    # the id enqueued again meanwhile (a new job): the repeat leaves it alone
    q.enqueue("t", job_id="ff", result_ttl=0)
    assert _finish(r, q, "B", [("ff", entry, tok_b)]) == [b"completed"]
    info = q.get("ff")
    assert info is not None and info.state == "queued"
    # a repeat that brings a new outcome along (the batch grew): both answered, and a
    # second repeat of that call still knows both
    _jid2, entry2, tok2 = _read_and_start(r, q, "B")
    assert _finish(r, q, "B", [("ff", entry, tok_b), ("ff", entry2, tok2)]) == [
        b"completed", b"completed"]
    assert not r.exists(k.job("ff"))
    assert _finish(r, q, "B", [("ff", entry, tok_b), ("ff", entry2, tok2)]) == [
        b"completed", b"completed"]
    assert r.hget(k.stats, "completed") == b"2" and r.hget(k.stats, "lease_lost") == b"2"
    assert 0 < r.ttl(k.finished("B")) <= 3600
