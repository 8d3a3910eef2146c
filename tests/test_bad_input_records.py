"""Bad input written behind the engine's back (DESIGN.md invariant 9): garbage stream entries,
corrupted job records, record keys of another type, garbage in the delayed set, an envelope
naming another job. Every such job settles with a reason (a dead letter) or completes when the
damage did not matter, neighbours and later jobs complete, the pending list drains to zero, the
worker keeps running, and ``get()`` on a damaged record stays typed.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import redis
from helpers import eventually, fast, wait_until
from hypothesis import given, settings
from hypothesis import strategies as st
from sec_support import (
    ThreadWorker,
    bad_input_queue,  # noqa: F401 - the q fixture
    drop_queue,
    new_qname,
    reason_of,
    settled,
    state,
    still_working,
    xpending_count,
)
from sec_support import bad_input_registry as registry

from streamq import Job, JobInfo, Queue, StreamqError, Worker

# --------------------------------------------------------------------------- helpers


def dead_reasons(r: redis.Redis, q: Queue) -> Counter[str]:
    entries: Any = r.xrange(q.keys.dead)
    return Counter(e[1][b"reason"].decode() for e in entries)


def readable(q: Queue, job_id: str) -> JobInfo | None:
    """get() on a damaged record answers (fields it cannot read left empty) or raises a typed
    StreamqError; never a bare ValueError, RecursionError or redis error."""
    try:
        return q.get(job_id)
    except StreamqError:
        return None


# ------------------------------------------------------------------ garbage in the stream


entry_fields = st.one_of(st.just(b"id"), st.binary(min_size=1, max_size=6),
                         st.text(min_size=1, max_size=6).map(str.encode))
entry_values = st.one_of(st.binary(max_size=24), st.text(max_size=24).map(str.encode),
                         st.sampled_from([b"", b"\xff\xfe", b"\x00", b"*", b"{x}", b"0-0",
                                          b"<other-queue>", b"<finished>", b"<live>"]))


def test_garbage_stream_entries_are_dead_lettered_and_the_worker_keeps_going(
    url: str, r: redis.Redis
) -> None:
    q = Queue(r, new_qname())
    other = Queue(r, new_qname())
    reg = registry()
    runs: Counter[str] = Counter()

    @reg.handler("count")
    def count(job: Job) -> None:
        runs[job.id] += 1

    other.enqueue("ok", job_id="other-job")
    q.enqueue("ok", job_id="finished-job")
    with ThreadWorker(url, [q.name], reg, fast(block_ms=50)) as w:
        wait_until(lambda: state(r, q, "finished-job") == "completed")
        n = 0

        @settings(deadline=None, max_examples=30, database=None)
        @given(entries=st.lists(st.dictionaries(entry_fields, entry_values, min_size=1,
                                                max_size=4), min_size=1, max_size=6))
        def check(entries: list[dict[bytes, bytes]]) -> None:
            nonlocal n
            n += 1
            live = f"live-{n}"
            subst = {b"<other-queue>": b"other-job", b"<finished>": b"finished-job",
                     b"<live>": live.encode()}
            dead_before = dead_reasons(r, q)
            q.enqueue("count", job_id=live)
            want: Counter[str] = Counter()
            for fields in entries:
                fields = {k: subst.get(v, v) for k, v in fields.items()}
                r.xadd(q.keys.stream, fields)  # type: ignore[arg-type]
                raw = fields.get(b"id")
                try:
                    jid = raw.decode() if raw is not None else None
                except UnicodeDecodeError:
                    jid = None
                if jid is None:
                    want["malformed stream entry"] += 1
                elif jid not in ("finished-job", live):
                    want["job record missing"] += 1
            wait_until(lambda: state(r, q, live) == "completed"
                            and r.xlen(q.keys.stream) == 0
                            and xpending_count(r, q.keys.stream) == 0
                            and dead_reasons(r, q) - dead_before == want,
                            what=f"garbage {entries!r} to settle")
            assert runs[live] == 1
            assert w._running

        check()
        assert state(r, other, "other-job") == "queued"  # the other queue is untouched
    drop_queue(r, q.name)
    drop_queue(r, other.name)


# ------------------------------------------------------------------ corrupted job records


def _set(**fields: Any) -> Callable[[redis.Redis, Queue, str], None]:
    def corrupt(r: redis.Redis, q: Queue, job_id: str) -> None:
        r.hset(q.keys.job(job_id), mapping=fields)  # type: ignore[arg-type]
    return corrupt


def _drop(*fields: str) -> Callable[[redis.Redis, Queue, str], None]:
    def corrupt(r: redis.Redis, q: Queue, job_id: str) -> None:
        r.hdel(q.keys.job(job_id), *fields)
    return corrupt


def _body(value: bytes) -> Callable[[redis.Redis, Queue, str], None]:
    """Replace the body ('<type> <payload>')."""
    def corrupt(r: redis.Redis, q: Queue, job_id: str) -> None:
        r.hset(q.keys.job(job_id), "b", value)
    return corrupt


def _opts(value: bytes) -> Callable[[redis.Redis, Queue, str], None]:
    """Replace the options (the envelope's non-default fields)."""
    def corrupt(r: redis.Redis, q: Queue, job_id: str) -> None:
        r.hset(q.keys.job(job_id), "op", value)
    return corrupt


def _nested(depth: int) -> bytes:
    return b"ok " + b"[" * depth + b"]" * depth


CORRUPTIONS: dict[str, Callable[[redis.Redis, Queue, str], None]] = {
    # wrong types in fields (layout 2: docs/key-layout.md#the-job-record)
    "attempts-not-a-number": _set(n="many"),
    "attempts-overflow": _set(n="1e400"),
    "attempts-huge": _set(n="9" * 30),
    "max-attempts-garbage": _set(max_attempts="\xff"),
    "deadline-garbage": _set(deadline="soon"),
    "times-garbage": _set(c="yesterday", due="x", a="1e999"),
    "entry-garbage": _set(e="zzz"),
    "result-ttl-garbage": _set(x="forever"),
    "errors-not-json": _set(errors="[[[["),
    "state-unknown": _set(s="bogus"),
    "state-binary": _set(s=b"\xff\xfe"),
    "body-binary": _body(b"\xff\x00\x80"),
    # missing fields
    "no-body": _drop("b"),
    "no-state": _drop("s"),
    "no-entry": _drop("e"),
    "only-state": _drop("b", "e", "c", "x"),
    # a body or options that do not decode
    "body-no-type": _body(b" 1"),
    "body-no-space": _body(b"ok"),
    "body-bad-payload": _body(b"ok [[["),
    "options-list": _opts(b"[]"),
    "options-string": _opts(b'"ok"'),
    "options-null": _opts(b"null"),
    "options-bad-version": _opts(b'{"version":"two"}'),
    "options-version-overflow": _opts(b'{"version":1e400}'),
    "options-headers-list": _opts(b'{"headers":[1,2]}'),
    "options-trace-number": _opts(b'{"trace":5}'),
    "options-negative-attempts": _opts(b'{"max_attempts":-1}'),
    "options-binary": _opts(b"\xff\x00"),
    # huge values
    "body-deeply-nested": _body(_nested(100_000)),
    "body-huge-string": _body(b'ok "' + b"y" * 5_000_000 + b'"'),
}


@pytest.mark.parametrize("kind", sorted(CORRUPTIONS))
async def test_corrupted_records_settle_with_a_reason_and_nothing_else_is_affected(
    url: str, q: Queue, r: redis.Redis, kind: str
) -> None:
    """The damaged job ends completed (the damage did not matter) or failed with a reason and a
    dead-letter entry; its neighbours run once each; later jobs run; get() stays typed."""
    reg = registry()
    q.enqueue_many([{"type": "ok", "job_id": i, "payload": i} for i in ("n1", "victim", "n2")])
    CORRUPTIONS[kind](r, q, "victim")
    async with Worker(url, [q.name], reg, fast(visibility_timeout_s=2.0)) as w:
        await eventually(lambda: settled(r, q, "n1", "n2", "victim"), timeout_s=8,
                         what=f"the {kind} job to settle")
        await still_working(r, q, w)
    end = state(r, q, "victim")
    if end == "failed":
        assert reason_of(r, q, "victim"), "dead-lettered without a reason"
        dead: Any = r.xrange(q.keys.dead)
        assert [e for e in dead if e[1][b"job"] == b"victim"], "no dead-letter entry"
    else:
        assert end == "completed", end
    for n in ("n1", "n2"):
        info = q.get(n)
        assert info is not None and info.state == "completed" and info.attempts == 1
    assert w.stats.lost == 0
    readable(q, "victim")


@pytest.mark.parametrize("kind", ["string", "list", "set", "zset", "stream"])
async def test_a_record_key_of_another_type_is_dead_lettered(url: str, q: Queue, r: redis.Redis,
                                                             kind: str) -> None:
    key = q.keys.job("victim")
    q.enqueue("ok", job_id="n1")
    r.xadd(q.keys.stream, {"id": "victim"})
    if kind == "string":
        r.set(key, "x")
    elif kind == "list":
        r.rpush(key, "x")
    elif kind == "set":
        r.sadd(key, "x")
    elif kind == "zset":
        r.zadd(key, {"x": 1})
    else:
        r.xadd(key, {"x": "y"})
    q.enqueue("ok", job_id="n2")
    async with Worker(url, [q.name], registry(), fast()) as w:
        await eventually(lambda: settled(r, q, "n1", "n2"), what="the neighbours")
        await eventually(lambda: dead_reasons(r, q)["job record corrupted"] == 1,
                         what="the corrupted record's dead letter")
        await still_working(r, q, w)
    readable(q, "victim")


@pytest.mark.parametrize("kind", ["attempts", "env", "deeply-nested", "not-a-hash"])
def test_get_on_a_damaged_record_stays_typed(q: Queue, r: redis.Redis, kind: str) -> None:
    q.enqueue("ok", job_id="victim")
    key = q.keys.job("victim")
    if kind == "attempts":
        r.hset(key, mapping={"n": "1e400", "c": "x", "f": "9" * 30})
    elif kind == "env":
        r.hset(key, "b", b"\xff")
    elif kind == "deeply-nested":
        r.hset(key, "b", _nested(100_000))
    else:
        r.delete(key)
        r.rpush(key, "x")
    info = readable(q, "victim")
    if kind != "not-a-hash":
        assert info is not None and info.id == "victim"


async def test_garbage_in_the_delayed_set_does_not_stop_promotion(url: str, q: Queue,
                                                                  r: redis.Redis) -> None:
    r.zadd(q.keys.delayed, {b"\xff\xfe": 0, b"no-such-job": 1, b"": 2})
    q.enqueue("ok", job_id="later", delay=0.2)
    async with Worker(url, [q.name], registry(), fast()) as w:
        await eventually(lambda: settled(r, q, "later"), timeout_s=5, what="the delayed job")
        await still_working(r, q, w)
    assert state(r, q, "later") == "completed"


def _mapping_json(m: Mapping[str, Any]) -> bytes:
    return json.dumps(m).encode()


async def test_an_envelope_naming_another_job_is_not_run_as_that_job(
    url: str, q: Queue, r: redis.Redis
) -> None:
    """A record whose envelope carries another id would hand the handler a foreign job id (and
    idempotency key). It must be dead-lettered as malformed, or the handler must see its own."""
    seen: list[tuple[str, str]] = []
    reg = registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        seen.append((job.id, job.idempotency_key))

    q.enqueue("t", job_id="victim")
    r.hset(q.keys.job("victim"), "op", _mapping_json({"i": "someone-else", "t": "t"}))
    async with Worker(url, [q.name], reg, fast()) as w:
        await eventually(lambda: settled(r, q, "victim"), what="the job")
        await still_working(r, q, w)
    if state(r, q, "victim") == "failed":
        assert reason_of(r, q, "victim") == "malformed envelope"
    else:
        assert seen == [("victim", "victim")]
