"""Compact job records (layout 2): the encodings and leftovers that the memory per job rests
on. These are layout facts, not timings."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from helpers import eventually, running

from streamq import Job, Queue, QueueConfig, Registry
from streamq._core.config import ALL_EVENTS, DEFAULT_EVENTS
from streamq._core.errors import InvalidArgument


def _registry() -> Registry:
    reg = Registry()

    @reg.handler("email.send")
    async def send(job: Job) -> dict[str, Any]:
        return {"sent": True, "n": job.payload["n"]}

    @reg.handler("noop")
    async def noop(job: Job) -> None:
        return None

    return reg


async def test_typical_records_stay_listpacks(url: str, q: Queue, r: redis.Redis) -> None:
    k = q.keys
    jid = q.enqueue("email.send", {"n": 12345, "to": "ada@example.com"}).job_id
    assert len(jid) == 22
    assert r.object("encoding", k.job(jid)) == b"listpack"
    raw: Any = r.hgetall(k.job(jid))
    assert set(raw) == {b"s", b"b", b"e"}  # no defaults, no copies
    assert all(len(v) <= 64 for v in raw.values())
    assert r.xlen(k.events) == 0  # the default event kinds leave out the steps every job takes
    async with running(url, q.name, _registry()):
        await eventually(lambda: r.hget(k.job(jid), "s") == b"c", what="completed")
    assert q.result(jid, timeout=1) == {"sent": True, "n": 12345}
    assert r.object("encoding", k.job(jid)) == b"listpack"
    assert 0 < r.ttl(k.job(jid)) <= 86400
    assert r.xlen(k.events) == 0
    info = q.get(jid)
    assert info is not None and info.state == "completed" and info.attempts == 1
    assert info.created_at is not None and info.enqueued_at == info.created_at
    assert info.started_at is not None and info.finished_at is not None and info.owner


async def test_fire_and_forget_leaves_nothing_behind(url: str, q: Queue, r: redis.Redis
                                                     ) -> None:
    k = q.keys
    ids = [q.enqueue("noop", {"n": i}, result_ttl=0).job_id for i in range(5)]
    async with running(url, q.name, _registry()):
        await eventually(lambda: r.exists(*(k.job(j) for j in ids)) == 0, what="records gone")
        await eventually(lambda: r.xlen(k.stream) == 0, what="stream empty")
    assert r.xlen(k.events) == 0 and r.zcard(k.delayed) == 0


async def test_every_event_kind_is_opt_in(url: str, qname: str, r: redis.Redis) -> None:
    cfg = QueueConfig(event_kinds=ALL_EVENTS)
    with Queue.from_url(url, qname, cfg) as q:
        jid = q.enqueue("noop", {"n": 1}).job_id
        async with running(url, qname, _registry(), ):
            await eventually(lambda: r.hget(q.keys.job(jid), "s") == b"c", what="completed")
    evs: Any = r.xrange(q.keys.events)
    # the producer wrote 'enqueued'; the worker's own (default) config writes no happy steps
    assert [f[b"ev"] for _, f in evs] == [b"enqueued"]
    assert "started" not in DEFAULT_EVENTS and "failed" in DEFAULT_EVENTS
    assert QueueConfig(event_kinds=frozenset()).events_arg == "0"
    assert QueueConfig(event_kinds=ALL_EVENTS).events_arg == "100000"
    with pytest.raises(InvalidArgument, match="unknown event kinds"):
        QueueConfig(event_kinds=frozenset({"enqueud"}))


async def test_an_entry_stored_as_its_id_and_a_non_default_ttl_work(url: str, q: Queue,
                                                                      r: redis.Redis) -> None:
    """'e' holds '<ms><seq, 3 digits>' or, when seq >= 1000, the stream id as it is; both
    start and settle. A result TTL other than the default is kept in 'x' and applied."""
    k = q.keys
    jid = q.enqueue("noop", {"n": 1}, result_ttl=600).job_id
    entries: Any = r.xrange(k.stream)
    [(entry, _)] = entries
    ms, seq = entry.decode().split("-")
    assert r.hget(k.job(jid), "e") == f"{ms}{int(seq):03d}".encode()
    assert r.hget(k.job(jid), "x") == b"600"
    r.hset(k.job(jid), "e", entry)  # the other form, as a seq >= 1000 is stored
    async with running(url, q.name, _registry()):
        await eventually(lambda: r.hget(k.job(jid), "s") == b"c", what="completed")
    assert 0 < r.ttl(k.job(jid)) <= 600
    info = q.get(jid)
    assert info is not None and info.result is None and info.enqueued_at is not None
