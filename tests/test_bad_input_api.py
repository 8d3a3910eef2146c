"""Bad input at the API boundary (DESIGN.md invariant 9): a typed error with nothing written.

Property-based (hypothesis): arbitrary ids, types, payloads, timing options, attempts, headers
and queue names are either accepted, and then read back exactly, or refused with
``InvalidArgument`` (or a subclass) and the queue's keys untouched. Any other exception type is
a failure of the test. What reaches a queue some other way (garbage written behind the engine's
back, misbehaving handlers) is in test_bad_input_records.py and test_bad_input_handlers.py.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import math
from collections.abc import Callable
from typing import Any

import pytest
import redis
from helpers import eventually, fast, record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sec_support import bad_input_registry as registry
from sec_support import (
    drop_queue,
    keys_of,
    new_qname,
    server_ms,
    snapshot,
    state,
    still_working,
)

from streamq import (
    AsyncQueue,
    InvalidArgument,
    InvalidQueueName,
    JobInfo,
    MsgpackSerde,
    PayloadTooLarge,
    Queue,
    QueueConfig,
    Serde,
    StreamqError,
    Worker,
)
from streamq._core.keys import _JOB_ID_RE, _QUEUE_RE

API = settings(deadline=None, max_examples=120, database=None,
               suppress_health_check=[HealthCheck.function_scoped_fixture,
                                      HealthCheck.too_slow])


# --------------------------------------------------------------------------- helpers


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
