"""Bad input (DESIGN.md invariant 9): a typed error at the API boundary with nothing written,
or, for what reaches a queue some other way, a dead letter (or a retry) with a reason while the
worker keeps running and nothing else is affected.

The API half is property-based (hypothesis): arbitrary ids, types, payloads, timing options,
attempts, headers and queue names are either accepted, and then read back exactly, or refused
with ``InvalidArgument`` (or a subclass) and the queue's keys untouched. Any other exception
type is a failure of the test. The queue half writes garbage behind the engine's back (stream
entries, job records, the delayed set) and runs misbehaving handlers (unserialisable results,
BaseException subclasses, hangs past the timeout), then checks that every such job settles with
a reason, that neighbours and later jobs complete, and that the pending list drains to zero.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import redis
from helpers import eventually, fast, field, record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sec_support import ThreadWorker, drop_queue, keys_of, snapshot, xpending_count

from streamq import (
    AsyncQueue,
    InvalidArgument,
    InvalidQueueName,
    Job,
    JobInfo,
    MsgpackSerde,
    PayloadTooLarge,
    Queue,
    QueueConfig,
    Registry,
    RetryPolicy,
    Serde,
    StreamqError,
    Worker,
)
from streamq._core.keys import _JOB_ID_RE, _QUEUE_RE

TERMINAL = ("completed", "failed", "cancelled")
API = settings(deadline=None, max_examples=120, database=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture,
                                      HealthCheck.too_slow])


# --------------------------------------------------------------------------- helpers


def new_qname() -> str:
    return f"bad-{uuid.uuid4().hex[:12]}"


def same(a: Any, b: Any) -> bool:
    """Exact equality: same types all the way down (1 is not 1.0 is not True; "1" is not 1).
    Iterative, so payloads nested deeper than the recursion limit compare too."""
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if type(x) is not type(y):
            return False
        if isinstance(x, dict):
            if len(x) != len(y):
                return False
            for k, v in x.items():
                twins = [ky for ky in y if type(ky) is type(k) and ky == k]
                if len(twins) != 1:
                    return False
                stack.append((v, y[twins[0]]))
        elif isinstance(x, list):
            if len(x) != len(y):
                return False
            stack.extend(zip(x, y, strict=True))
        elif isinstance(x, float):
            if repr(x) != repr(y):  # -0.0 and nan compare by their spelling
                return False
        elif x != y:
            return False
    return True


def server_ms(r: redis.Redis) -> int:
    t: Any = r.time()
    return int(t[0]) * 1000 + int(t[1]) // 1000


class Attempt:
    """Enqueue through the public API and classify the outcome, checking the contract:
    accepted (returned) or InvalidArgument with the queue's keys exactly as before."""

    def __init__(self, r: redis.Redis, config: QueueConfig | None = None) -> None:
        self.r = r
        self.config = config

    def __call__(self, job_type: Any, payload: Any = None, *, qname: str | None = None,
                 **options: Any) -> tuple[Queue, JobInfo] | None:
        name = qname or new_qname()
        q = Queue(self.r, name, self.config)
        before = snapshot(self.r, name)
        try:
            res = q.enqueue(job_type, payload, **options)
        except InvalidArgument:
            assert snapshot(self.r, name) == before, "a refused enqueue wrote to the queue"
            return None
        info = q.get(res.job_id)  # any exception here fails the test: accepted means readable
        assert info is not None and info.state in ("queued", "scheduled"), info
        return q, info


@pytest.fixture
def attempt(r: redis.Redis) -> Attempt:
    return Attempt(r)


# --------------------------------------------------------------------------- strategies

json_scalars = (st.none() | st.booleans() | st.integers(min_value=-(2**63), max_value=2**64 - 1)
                | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=16)
wild_scalars = (json_scalars | st.floats() | st.binary(max_size=8)
                | st.sets(st.integers(), max_size=2) | st.builds(object) | st.complex_numbers()
                | st.integers(min_value=10**4400, max_value=10**4400 + 5)
                | st.text(alphabet=st.characters(categories=["Cs"]), min_size=1, max_size=2)
                | st.datetimes() | st.decimals(allow_nan=False))
wild_keys = (st.text(max_size=5) | st.integers(min_value=-5, max_value=5) | st.booleans()
             | st.none() | st.floats(allow_nan=False, allow_infinity=False)
             | st.tuples(st.integers()) | st.binary(max_size=3))
wild_values = st.recursive(
    wild_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(wild_keys, inner, max_size=3),
    max_leaves=10)
anything = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
            | st.binary(max_size=10) | st.lists(st.integers(), max_size=2) | st.builds(object)
            | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
durations = (st.none() | st.booleans() | st.integers(min_value=-10, max_value=10**20)
             | st.floats() | st.timedeltas() | st.text(max_size=4)
             | st.decimals(allow_nan=False, allow_infinity=False) | st.fractions())
aware = st.datetimes(timezones=st.just(dt.UTC) | st.builds(
    dt.timezone, st.timedeltas(min_value=-dt.timedelta(hours=23),
                               max_value=dt.timedelta(hours=23))))
moments = st.none() | st.datetimes() | aware | st.dates() | st.floats() | st.text(max_size=4)


# --------------------------------------------------------------------------- API: ids, types


@API
@given(job_id=st.from_regex(_JOB_ID_RE, fullmatch=True) | st.text(max_size=210) | anything)
def test_job_ids_are_accepted_exactly_or_refused(attempt: Attempt, r: redis.Redis,
                                                 job_id: Any) -> None:
    out = attempt("t", {"for": "id"}, job_id=job_id)
    if out is None:
        return
    q, info = out
    try:
        if job_id is None:  # None asks for a generated id
            job_id = info.id
        assert isinstance(job_id, str) and info.id == job_id and _JOB_ID_RE.fullmatch(job_id)
        assert keys_of(r, q.name) >= {q.keys.job(job_id).encode(), q.keys.stream.encode()}
        assert same(info.payload, {"for": "id"}) and info.envelope is not None
        assert info.envelope.id == job_id
    finally:
        drop_queue(r, q.name)


@API
@given(job_type=st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9._:/-]{0,199}", fullmatch=True)
       | st.text(max_size=210) | anything)
def test_job_types_are_accepted_exactly_or_refused(attempt: Attempt, r: redis.Redis,
                                                   job_type: Any) -> None:
    out = attempt(job_type, 1)
    if out is None:
        return
    q, info = out
    try:
        assert isinstance(job_type, str) and info.type == job_type
        assert info.envelope is not None and info.envelope.type == job_type
    finally:
        drop_queue(r, q.name)


# --------------------------------------------------------------------------- API: payloads


SERDES: dict[str, Callable[[], Serde]] = {"json": QueueConfig().serde.__class__,
                                          "msgpack": MsgpackSerde}


@pytest.mark.parametrize("serde", sorted(SERDES))
@API
@given(payload=json_values)
def test_plain_payloads_round_trip_exactly(r: redis.Redis, serde: str, payload: Any) -> None:
    out = Attempt(r, QueueConfig(serde=SERDES[serde]()))("t", payload)
    if serde == "json" and out is None:
        raise AssertionError("plain JSON data was refused")
    if out is None:
        return  # msgpack refuses ints beyond 64 bits, typed
    q, info = out
    try:
        assert same(info.payload, payload), (info.payload, payload)
    finally:
        drop_queue(r, q.name)


@pytest.mark.parametrize("serde", sorted(SERDES))
@API
@given(payload=wild_values)
def test_any_payload_round_trips_exactly_or_is_refused(r: redis.Redis, serde: str,
                                                       payload: Any) -> None:
    """Sets, bytes, objects, NaN, huge ints, lone surrogates, non-string keys ...: refused with
    SerializationError, or read back exactly. Silently changing the data (an int key coming back
    as a string, two keys collapsing into one, a key the reader then refuses) is a failure."""
    out = Attempt(r, QueueConfig(serde=SERDES[serde]()))("t", payload)
    if out is None:
        return
    q, info = out
    try:
        assert same(info.payload, payload), f"stored {payload!r}, read back {info.payload!r}"
    finally:
        drop_queue(r, q.name)


@pytest.mark.parametrize("depth", [10, 100, 500, 990, 2_000, 100_000])
def test_deeply_nested_payloads_are_read_back_or_refused(attempt: Attempt, r: redis.Redis,
                                                         depth: int) -> None:
    payload: Any = []
    for _ in range(depth):
        payload = [payload]
    out = attempt("t", payload)
    if out is not None:
        q, info = out
        assert same(info.payload, payload)
        drop_queue(r, q.name)


def test_payload_size_limit_counts_encoded_bytes(r: redis.Redis) -> None:
    limit = 2_000
    attempt = Attempt(r, QueueConfig(max_payload_bytes=limit))
    accepted = attempt("t", "a" * 1_000)
    assert accepted is not None
    qname = new_qname()
    q = Queue(r, qname, QueueConfig(max_payload_bytes=limit))
    cases: list[tuple[str, dict[str, Any]]] = [("a" * limit, {}),
                             ("é" * (limit // 2 + 1), {}),  # 2 bytes each in UTF-8
                             ("", {"headers": {"h": "x" * limit}}),
                             ("", {"idempotency_key": "k" * limit})]
    for payload, options in cases:
        with pytest.raises(PayloadTooLarge, match="max_payload_bytes"):
            q.enqueue("t", payload, **options)
    with pytest.raises(PayloadTooLarge):
        q.enqueue_many([{"type": "t", "payload": "ok"}, {"type": "t", "payload": "x" * limit}])
    assert keys_of(r, qname) == set()
    drop_queue(r, accepted[0].name)


@settings(deadline=None, max_examples=60, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(min_value=0, max_value=3_000))
def test_every_accepted_envelope_fits_the_limit(r: redis.Redis, size: int) -> None:
    limit = 1_500
    out = Attempt(r, QueueConfig(max_payload_bytes=limit))("t", "ü" * size)
    if out is None:
        assert len(("ü" * size).encode()) > limit - 200  # refused only when near the limit
        return
    q, info = out
    try:
        k = q.keys.job(info.id)
        stored: Any = r.hstrlen(k, "b") + r.hstrlen(k, "op")
        assert stored <= limit
    finally:
        drop_queue(r, q.name)


# --------------------------------------------------------------------------- API: options


@API
@given(delay=durations, result_ttl=durations)
def test_delays_and_ttls_are_accepted_sanely_or_refused(attempt: Attempt, r: redis.Redis,
                                                        delay: Any, result_ttl: Any) -> None:
    before = server_ms(r)
    out = attempt("t", None, delay=delay, result_ttl=result_ttl)
    if out is None:
        return
    q, info = out
    try:
        rec: Any = record(r, q.keys.job(info.id))
        ttl = int(rec.get(b"result_ttl", 86400))  # absent: the default
        if ttl == 0:  # fire-and-forget: only when a zero duration was asked for
            assert result_ttl == 0 or (isinstance(result_ttl, dt.timedelta) and not result_ttl)
        else:
            assert ttl >= 1
            assert r.expire(f"{q.keys.base}:scratch", ttl) is not None  # EXPIRE takes it
        if info.state == "scheduled":
            assert info.due_at is not None and info.due_at.timestamp() * 1000 >= before
            assert int(rec[b"due"]) < 2**53, "due time is not an exact integer for Lua"
    finally:
        drop_queue(r, q.name)


@API
@given(run_at=moments, deadline=durations | moments)
def test_run_at_and_deadlines_are_accepted_sanely_or_refused(
    attempt: Attempt, r: redis.Redis, run_at: Any, deadline: Any
) -> None:
    before = server_ms(r)
    out = attempt("t", None, run_at=run_at, deadline=deadline)
    if out is None:
        return
    q, info = out
    try:
        rec: Any = record(r, q.keys.job(info.id))
        if deadline is not None:
            stored = int(rec[b"deadline"]) if b"deadline" in rec else 0
            if isinstance(deadline, dt.datetime):
                want = deadline.timestamp() * 1000
                # a deadline in the past must stay in the past (it is dead on arrival)
                assert stored <= max(before, want + 1) or stored == 0
            else:
                assert before < stored < 2**53
        if info.state == "scheduled":
            assert info.due_at is not None
    finally:
        drop_queue(r, q.name)


@API
@given(max_attempts=st.none() | anything | st.integers(), version=anything | st.integers())
def test_attempts_and_versions_are_accepted_or_refused(attempt: Attempt, r: redis.Redis,
                                                       max_attempts: Any, version: Any) -> None:
    options: dict[str, Any] = {"max_attempts": max_attempts}
    if version is not None:
        options["version"] = version
    out = attempt("t", None, **options)
    if out is None:
        return
    q, info = out
    try:
        assert info.max_attempts == (max_attempts or 0)
        assert info.envelope is not None and info.envelope.version == options.get("version", 1)
    finally:
        drop_queue(r, q.name)


hashables = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5)
             | st.binary(max_size=5))
headers_strategy = (st.none() | st.dictionaries(st.text(max_size=8), st.text(max_size=8),
                                                max_size=4)
                    | st.dictionaries(hashables, anything, max_size=2) | anything
                    | st.lists(st.tuples(st.text(max_size=3), st.text(max_size=3)), max_size=2)
                    | st.text(min_size=1, max_size=4))


@API
@given(headers=headers_strategy,
       idempotency_key=st.none() | st.text(max_size=40) | anything)
def test_headers_and_idempotency_keys_are_accepted_exactly_or_refused(
    attempt: Attempt, r: redis.Redis, headers: Any, idempotency_key: Any
) -> None:
    out = attempt("t", None, headers=headers, idempotency_key=idempotency_key)
    if out is None:
        return
    q, info = out
    try:
        env = info.envelope
        assert env is not None
        assert same(env.headers, dict(headers or {}))
        assert env.idempotency_key == idempotency_key
    finally:
        drop_queue(r, q.name)


@API
@given(name=st.from_regex(_QUEUE_RE, fullmatch=True) | st.text(max_size=140) | anything,
       prefix=st.just("streamq") | st.text(max_size=70) | anything)
def test_queue_names_and_prefixes_are_usable_or_refused(r: redis.Redis, name: Any,
                                                        prefix: Any) -> None:
    try:
        config = QueueConfig(key_prefix=prefix)
        q = Queue(r, name, config)
    except InvalidArgument:
        return
    try:
        res = q.enqueue("t", [name])
        info = q.get(res.job_id)
        assert info is not None and same(info.payload, [name])
        written = keys_of(r, name, prefix)
        assert written and all(k.startswith(f"{prefix}:{{{name}}}:".encode()) for k in written)
    finally:
        drop_queue(r, name, prefix)


@pytest.mark.parametrize("option", ["protocol=3", "decode_responses=True", "protocol=banana"])
async def test_url_options_cannot_unpin_the_connection(url: str, r: redis.Redis,
                                                       option: str) -> None:
    """streamq pins RESP2 and bytes replies (its parsing assumes them); redis-py lets URL query
    options override arguments, so such a URL must be refused, or work all the way through."""
    qname = new_qname()
    odd = f"{url}?{option}"
    try:
        q = Queue.from_url(odd, qname)
        res = q.enqueue("ok", {"x": 1})
    except InvalidArgument:
        assert keys_of(r, qname) == set()
        return
    info = q.get(res.job_id)
    assert info is not None and same(info.payload, {"x": 1})
    async with Worker(odd, [qname], registry(), fast()) as w:
        await eventually(lambda: state(r, q, res.job_id) == "completed", timeout_s=5,
                         what="a job through that URL")
        await still_working(r, q, w)
    q.close()


def test_bad_queue_names_never_reach_redis(r: redis.Redis) -> None:
    for name in ["", " ", "a b", "a{b}", "{x}", "*", "a\x00", "é", "x" * 129, None, 5, b"q"]:
        with pytest.raises(InvalidQueueName):
            Queue(r, name)  # type: ignore[arg-type]


def test_enqueue_many_is_all_or_nothing(r: redis.Redis) -> None:
    qname = new_qname()
    q = Queue(r, qname)
    bad_specs: list[Any] = [
        {"type": "t", "job_id": "a b"}, {"type": "t", "delay": -1}, {"type": ""},
        {"payload": 1}, {"type": "t", "payload": {1, 2}}, {"type": "t", "headers": {"a": 1}},
        {"type": "t", "headers": "abc"}, {"type": "t", "headers": 7},
        {"type": "t", "max_attempts": 0}, {"type": "t", "unknown_option": 1}, "t", None, 5,
    ]
    for bad in bad_specs:
        with pytest.raises(InvalidArgument):
            q.enqueue_many([{"type": "t", "payload": 1}, bad, {"type": "t"}])
        assert keys_of(r, qname) == set(), bad


async def test_async_queue_refuses_the_same_input(url: str, r: redis.Redis) -> None:
    qname = new_qname()
    async with AsyncQueue.from_url(url, qname) as q:
        cases: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
            (("t", {1, 2}), {}), (("",), {}), (("t",), {"job_id": ""}),
            (("t",), {"delay": math.inf}), (("t",), {"headers": "abc"}),
            (("t",), {"result_ttl": -1}), (("t",), {"max_attempts": 1.5})]
        for args, options in cases:
            with pytest.raises(InvalidArgument):
                await q.enqueue(*args, **options)
        with pytest.raises(InvalidArgument):
            await q.get("bad id")
        with pytest.raises(InvalidArgument):
            await q.cancel("")
    assert keys_of(r, qname) == set()


@API
@given(job_id=st.text(max_size=20) | anything)
def test_lookups_take_any_id(r: redis.Redis, job_id: Any) -> None:
    q = Queue(r, "lookups-only")
    for call in (q.get, q.cancel, q.result):
        with contextlib.suppress(StreamqError):
            call(job_id)
    assert keys_of(r, "lookups-only") == set()


# --------------------------------------------------------------------------- the queue side


def registry() -> Registry:
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> Any:
        return {"echo": job.payload, "id": job.id}

    @reg.handler("sync-ok")
    def sync_ok(job: Job) -> Any:
        return job.payload

    return reg


def state(r: redis.Redis, q: Queue, job_id: str) -> str:
    v: Any = field(r, q.keys.job(job_id), "state")
    return v.decode(errors="replace") if v else ""


def settled(r: redis.Redis, q: Queue, *ids: str) -> bool:
    return all(state(r, q, i) in TERMINAL for i in ids)


def reason_of(r: redis.Redis, q: Queue, job_id: str) -> str:
    v: Any = r.hget(q.keys.job(job_id), "reason")
    return v.decode() if v else ""


def dead_reasons(r: redis.Redis, q: Queue) -> Counter[str]:
    entries: Any = r.xrange(q.keys.dead)
    return Counter(e[1][b"reason"].decode() for e in entries)


async def still_working(r: redis.Redis, q: Queue, w: Worker) -> None:
    """The worker keeps running: a job now and a delayed one (promotion) both complete, and
    the stream and pending list drain."""
    q.enqueue("ok", "after", job_id="after-now")
    q.enqueue("ok", "later", job_id="after-later", delay=0.05)
    await eventually(lambda: settled(r, q, "after-now", "after-later"), timeout_s=10,
                     what="jobs enqueued afterwards")
    assert state(r, q, "after-now") == "completed" and state(r, q, "after-later") == "completed"
    await eventually(lambda: r.xlen(q.keys.stream) == 0 and xpending_count(r, q.keys.stream) == 0,
                     timeout_s=10, what="stream and PEL to drain")
    assert w._running


def readable(q: Queue, job_id: str) -> JobInfo | None:
    """get() on a damaged record answers (fields it cannot read left empty) or raises a typed
    StreamqError; never a bare ValueError, RecursionError or redis error."""
    try:
        return q.get(job_id)
    except StreamqError:
        return None


@pytest.fixture
def q(url: str) -> Any:
    queue = Queue.from_url(url, new_qname())
    yield queue
    queue.close()


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
        eventually_sync(lambda: state(r, q, "finished-job") == "completed")
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
            eventually_sync(lambda: state(r, q, live) == "completed"
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


def eventually_sync(pred: Callable[[], Any], timeout_s: float = 10.0,
                    what: str = "condition") -> Any:
    end = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


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


# ------------------------------------------------------------------ misbehaving handlers


class Raising(dict[str, Any]):
    """A mapping whose serialisation raises something else than TypeError/ValueError."""

    def items(self) -> Any:
        raise KeyError("items() exploded")


def _cyclic() -> Any:
    a: list[Any] = []
    a.append(a)
    return a


def _deep() -> Any:
    x: Any = []
    for _ in range(100_000):
        x = [x]
    return x


UNSERIALISABLE: dict[str, Callable[[], Any]] = {
    "object": object, "set": lambda: {1, 2}, "bytes": lambda: b"raw", "nan": lambda: math.nan,
    "inf": lambda: {"x": -math.inf}, "cyclic": _cyclic, "deep": _deep,
    "surrogate": lambda: "\udc80", "huge-int": lambda: 10**5000,
    "tuple-key": lambda: {(1, 2): 3}, "raising-mapping": lambda: Raising(a=1),
    "complex": lambda: 1 + 2j, "exception": lambda: ValueError("x"),
}


@pytest.mark.parametrize("kind", sorted(UNSERIALISABLE))
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_unserialisable_results_go_to_the_retry_policy(
    url: str, q: Queue, r: redis.Redis, kind: str, sync: bool
) -> None:
    """The side effects already ran, so the handler's policy decides (as for any failure);
    once attempts are exhausted the dead letter says why."""
    reg = registry()
    make = UNSERIALISABLE[kind]
    fast_retry = RetryPolicy(base_s=0.01, cap_s=0.01)
    if sync:
        reg.register("bad", lambda job: make(), max_attempts=3, retry=fast_retry)
    else:
        async def bad(job: Job) -> Any:
            return make()
        reg.register("bad", bad, max_attempts=3, retry=fast_retry)
    q.enqueue("ok", job_id="n1")
    q.enqueue("bad", job_id="victim")
    q.enqueue("ok", job_id="n2")
    async with Worker(url, [q.name], reg, fast()) as w:
        await eventually(lambda: settled(r, q, "n1", "n2", "victim"), timeout_s=8,
                         what=f"the {kind} result to settle")
        await still_working(r, q, w)
    info = q.get("victim")
    assert info is not None and info.state == "failed"
    assert info.reason == "result not serialisable" and info.attempts == 3
    assert info.error is not None and info.error["type"] == "SerializationError"


class CustomBase(BaseException):
    pass


def _raise(kind: str) -> None:
    exc: BaseException = {
        "SystemExit": SystemExit(3), "KeyboardInterrupt": KeyboardInterrupt(),
        "GeneratorExit": GeneratorExit(), "CustomBase": CustomBase("custom"),
        "CancelledError": asyncio.CancelledError(),
    }[kind]
    raise exc


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "GeneratorExit",
                                  "CustomBase", "CancelledError"])
@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_base_exceptions_from_handlers_are_job_failures(
    url: str, q: Queue, r: redis.Redis, kind: str, sync: bool
) -> None:
    reg = registry()
    if sync:
        reg.register("bad", lambda job: _raise(kind), max_attempts=2,
                     retry=RetryPolicy(base_s=0.01, cap_s=0.01))
    else:
        async def bad(job: Job) -> None:
            _raise(kind)
        reg.register("bad", bad, max_attempts=2, retry=RetryPolicy(base_s=0.01, cap_s=0.01))
    q.enqueue("ok", job_id="n1")
    q.enqueue("bad", job_id="victim")
    async with Worker(url, [q.name], reg, fast()) as w:
        await eventually(lambda: settled(r, q, "n1", "victim"), timeout_s=6,
                         what=f"the job raising {kind} to settle")
        await still_working(r, q, w)
    info = q.get("victim")
    assert info is not None and info.state == "failed" and info.attempts == 2
    assert info.reason == "attempts exhausted"
    assert info.error is not None and info.error["type"] == kind
    assert [e["type"] for e in info.errors] == [kind, kind]


async def test_handlers_hanging_past_their_timeout_fail_with_a_reason(
    url: str, q: Queue, r: redis.Redis
) -> None:
    reg = registry()
    release = threading.Event()

    @reg.handler("sleeps", timeout=0.2, max_attempts=1)
    async def sleeps(job: Job) -> None:
        await asyncio.sleep(60)

    @reg.handler("blocks", timeout=0.2, max_attempts=1)
    def blocks(job: Job) -> None:
        release.wait(30)

    @reg.handler("stubborn", timeout=0.2, max_attempts=1)
    async def stubborn(job: Job) -> str:
        end = time.monotonic() + 4.0  # ignores cancellation for 4 s
        while time.monotonic() < end:
            try:
                await asyncio.sleep(end - time.monotonic())
            except asyncio.CancelledError:
                continue
        return "too late"

    try:
        for t in ("sleeps", "blocks", "stubborn"):
            q.enqueue(t, job_id=t)
        async with Worker(url, [q.name], reg, fast()) as w:
            await eventually(lambda: settled(r, q, "sleeps", "blocks"), timeout_s=5,
                             what="the hanging jobs")
            await still_working(r, q, w)
            q.enqueue("sync-ok", "still", job_id="sync-after")  # a pool thread is still free
            await eventually(lambda: state(r, q, "sync-after") == "completed",
                             what="a sync job after the hung one")
            await eventually(lambda: settled(r, q, "stubborn"), timeout_s=2.5,
                             what="the handler that ignores cancellation to be timed out")
        for jid in ("sleeps", "blocks", "stubborn"):
            info = q.get(jid)
            assert info is not None and info.state == "failed", (jid, info)
            assert info.error is not None and info.error["type"] == "TimeoutError", jid
            assert "0.2" in info.error["message"]
    finally:
        release.set()


# ------------------------------------------------------------------ extreme accepted options


async def test_extreme_options_that_are_accepted_also_run(url: str, q: Queue,
                                                          r: redis.Redis) -> None:
    """Whatever enqueue accepts must settle cleanly: a result TTL Redis's EXPIRE refuses, or a
    deadline no integer can hold, must be refused at the door, not break a worker's batch."""
    seen: dict[str, int] = {}
    reg = registry()

    @reg.handler("t")
    async def t(job: Job) -> str:
        seen[job.id] = job.deadline_ms
        return "done"

    candidates: dict[str, dict[str, Any]] = {
        "ttl-1e16": {"result_ttl": 1e16}, "ttl-1e300": {"result_ttl": 1e300},
        "ttl-timedelta-max": {"result_ttl": dt.timedelta.max},
        "deadline-1e300": {"deadline": 1e300}, "deadline-1e13": {"deadline": 1e13},
        "deadline-timedelta-max": {"deadline": dt.timedelta.max},
        "attempts-max": {"max_attempts": 10_000},
    }
    accepted = []
    for jid, options in candidates.items():
        try:
            q.enqueue("t", job_id=jid, **options)
            accepted.append(jid)
        except InvalidArgument:
            pass
    q.enqueue("t", job_id="neighbour")
    async with Worker(url, [q.name], reg, fast(visibility_timeout_s=2.0)) as w:
        await eventually(lambda: settled(r, q, "neighbour", *accepted), timeout_s=8,
                         what="accepted extreme jobs")
        await still_working(r, q, w)
    assert w.stats.lost == 0, "a settle batch failed"
    now = server_ms(r)
    for jid in [*accepted, "neighbour"]:
        info = q.get(jid)
        assert info is not None and info.state == "completed" and info.attempts == 1, info
        assert seen[jid] == 0 or now < seen[jid] < 2**53, (jid, seen[jid])
        ttl: Any = r.ttl(q.keys.job(jid))
        assert ttl > 0, f"{jid}: a finished record must expire"


async def test_a_deadline_before_1970_is_already_passed(url: str, q: Queue, r: redis.Redis) -> None:
    ran: list[str] = []
    reg = registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        ran.append(job.id)

    try:
        q.enqueue("t", job_id="old", deadline=dt.datetime(1960, 1, 1, tzinfo=dt.UTC))
    except InvalidArgument:
        return
    async with Worker(url, [q.name], reg, fast()) as w:
        await eventually(lambda: settled(r, q, "old"), what="the expired job")
        await still_working(r, q, w)
    assert ran == [] and reason_of(r, q, "old") == "deadline passed"


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
