"""The job envelope and the objects users see: Job (handed to handlers), JobInfo, results."""

from __future__ import annotations

import datetime as dt
import json as serde_json
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Literal

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from .errors import SerializationError

State = Literal["scheduled", "queued", "active", "retrying", "completed", "failed", "cancelled"]
STATES: tuple[State, ...] = (
    "scheduled", "queued", "active", "retrying", "completed", "failed", "cancelled",
)
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})


@attrs.frozen
class Envelope:
    """What a producer hands over: immutable for the life of the job."""

    id: str
    type: str
    payload: Any = None
    version: int = 1
    max_attempts: int = 0
    """0 = the handler's (or the worker's) default."""
    created_ms: int = 0
    """Producer's clock, informational; due times and deadlines use the server's clock."""
    not_before_ms: int = 0
    deadline_ms: int = 0
    idempotency_key: str | None = None
    trace: dict[str, str] = attrs.field(factory=dict)
    """Trace-context carrier (W3C traceparent/tracestate/baggage), filled by instrumentation."""
    result_ttl_s: int = 0
    headers: dict[str, str] = attrs.field(factory=dict)


def _as_is(payload: Any) -> Any:
    """Payloads are plain data handed to the serde as they are: cattrs must not walk (and
    copy) them, which overflows the stack on deep nesting and mangles tuple keys."""
    return payload


_conv = cattrs.Converter()
_conv.register_unstructure_hook(
    Envelope,
    make_dict_unstructure_fn(Envelope, _conv, _cattrs_omit_if_default=True,
                             id=override(rename="i"), type=override(rename="t"),
                             payload=override(rename="p", omit_if_default=False,
                                              unstruct_hook=_as_is)),
)
_conv.register_structure_hook(
    Envelope,
    make_dict_structure_fn(Envelope, _conv, id=override(rename="i"),
                           type=override(rename="t"), payload=override(rename="p")),
)


def plain_envelope(
    id: str, type: str, payload: Any, version: int, max_attempts: int, created_ms: int,
    not_before_ms: int, deadline_ms: int, idempotency_key: str | None,
    trace: dict[str, str], result_ttl_s: int, headers: dict[str, str],
) -> dict[str, Any]:
    """``envelope_to_plain(Envelope(...))`` without building the Envelope (the enqueue hot
    path): the same keys in the same order, defaults left out. A property test keeps the two
    identical; the attrs class stays the schema and the decoder."""
    plain: dict[str, Any] = {"i": id, "t": type, "p": payload}
    if version != 1:
        plain["version"] = version
    if max_attempts:
        plain["max_attempts"] = max_attempts
    if created_ms:
        plain["created_ms"] = created_ms
    if not_before_ms:
        plain["not_before_ms"] = not_before_ms
    if deadline_ms:
        plain["deadline_ms"] = deadline_ms
    if idempotency_key is not None:
        plain["idempotency_key"] = idempotency_key
    if trace:
        plain["trace"] = trace
    if result_ttl_s:
        plain["result_ttl_s"] = result_ttl_s
    if headers:
        plain["headers"] = headers
    return plain


def envelope_to_plain(env: Envelope) -> dict[str, Any]:
    plain: dict[str, Any] = _conv.unstructure(env)
    return plain


def envelope_from_plain(obj: Any) -> Envelope:
    try:
        return _conv.structure(obj, Envelope)
    except Exception as exc:  # cattrs raises ClassValidationError groups, KeyError, TypeError
        raise SerializationError(f"malformed job envelope: {exc}") from exc


@attrs.frozen
class Job:
    """One attempt of a job, as a handler sees it."""

    id: str
    type: str
    payload: Any
    attempt: int
    """1 on the first run."""
    max_attempts: int
    queue: str
    version: int = 1
    idempotency_key: str = ""
    """Stable across attempts (defaults to the job id): key side effects on it."""
    headers: dict[str, str] = attrs.field(factory=dict)
    trace: dict[str, str] = attrs.field(factory=dict)
    deadline_ms: int = 0
    _reporter: Callable[[str, Any], Awaitable[None]] | None = attrs.field(
        default=None, repr=False, eq=False)

    def progress(self, value: Any) -> Awaitable[None]:
        """Report progress: a number (e.g. percent done), a string, or a small dict/list of
        plain JSON data (at most 2 KB). The job record keeps the latest (``JobInfo.progress``,
        ``streamq job``), the events stream gets a ``progress`` event, and a caller waiting in
        ``enqueue_and_wait`` is told. Returns at once, from async and sync handlers alike;
        ``await job.progress(v)`` also waits (at most 2 s) until it is written."""
        if self._reporter is None:
            return _done()
        return self._reporter("progress", value)

    def log(self, message: str) -> None:
        """Add a line (at most 1,000 characters) to the job's log, kept in its record (the
        last 100 lines: ``JobInfo.logs``, ``streamq job``) and in the events stream."""
        if self._reporter is not None:
            self._reporter("log", message)


@attrs.frozen
class EnqueueResult:
    job_id: str
    status: Literal["queued", "scheduled", "duplicate", "rejected"]
    state: str
    """For a duplicate: the existing job's state."""
    result: Any = None
    """For a duplicate that completed: its result."""
    error: dict[str, Any] | None = None
    reason: str = ""
    """For a rejected job in a bulk enqueue: why."""


@attrs.frozen
class CancelResult:
    job_id: str
    cancelled: bool
    state: str
    """The state the job was in when cancel was asked ('' when not found)."""
    reason: str = ""


def _ms_to_dt(v: bytes | None) -> dt.datetime | None:
    if not v:
        return None
    try:
        return dt.datetime.fromtimestamp(int(v) / 1000, tz=dt.UTC)
    except (ValueError, OverflowError, OSError):  # a damaged field: unknown, not an error
        return None


def _int(v: bytes | None) -> int:
    try:
        return int(v or 0)
    except ValueError:  # a damaged field ('inf', '1e+30', text): unknown
        return 0


@attrs.frozen
class JobInfo:
    """A snapshot of a job record."""

    id: str
    queue: str
    type: str
    state: str
    attempts: int
    """Runs started (a reclaimed run counts)."""
    max_attempts: int
    payload: Any
    created_at: dt.datetime | None
    enqueued_at: dt.datetime | None
    due_at: dt.datetime | None
    started_at: dt.datetime | None
    finished_at: dt.datetime | None
    owner: str | None
    result: Any
    error: dict[str, Any] | None
    """The last error (type, message, traceback summary) of a failed or retried attempt."""
    reason: str
    envelope: Envelope | None
    errors: list[dict[str, Any]] = attrs.field(factory=list)
    """Failed attempts, oldest first (at most 10): attempt, error type, time (ms)."""
    progress: Any = None
    """The latest ``job.progress(...)`` value reported by a handler, None if none."""
    logs: list[dict[str, Any]] = attrs.field(factory=list)
    """Lines from ``job.log(...)``, oldest first (the last 100): ``{"n", "t" (ms), "m"}``."""

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL


def decode_record(queue: str, job_id: str, h: dict[bytes, bytes], serde: Any) -> JobInfo:
    def s(k: str) -> str:
        v = h.get(k.encode())
        return v.decode(errors="replace") if v is not None else ""

    env: Envelope | None = None
    payload: Any = None
    raw_env = h.get(b"env")
    if raw_env is not None:
        try:
            env = envelope_from_plain(serde.loads(raw_env))
            payload = env.payload
        except (SerializationError, RecursionError):
            env = None
    result: Any = None
    if h.get(b"result") is not None and s("state") == "completed":
        try:
            result = serde.loads(h[b"result"])
        except SerializationError:
            result = h[b"result"]
    error: dict[str, Any] | None = None
    if h.get(b"error"):
        try:
            err = serde.loads(h[b"error"])
            error = err if isinstance(err, dict) else {"message": str(err)}
        except SerializationError:
            error = {"message": s("error")}
    errors = _json_list(h.get(b"errors"))
    progress: Any = None
    if h.get(b"progress"):
        try:
            progress = serde_json.loads(h[b"progress"])
        except (ValueError, RecursionError):
            progress = s("progress")
    return JobInfo(
        errors=errors, progress=progress, logs=_json_list(h.get(b"logs")),
        id=job_id, queue=queue, type=s("type"), state=s("state"),
        attempts=_int(h.get(b"attempts")), max_attempts=_int(h.get(b"max_attempts")),
        payload=payload, created_at=_ms_to_dt(h.get(b"created")),
        enqueued_at=_ms_to_dt(h.get(b"enqueued")), due_at=_ms_to_dt(h.get(b"due")),
        started_at=_ms_to_dt(h.get(b"started")), finished_at=_ms_to_dt(h.get(b"finished")),
        owner=s("owner") or None, result=result, error=error, reason=s("reason"),
        envelope=env,
    )


def _json_list(raw: bytes | None) -> list[Any]:
    """A JSON list kept in a record by a script (errors, logs); [] when absent or damaged."""
    if not raw:
        return []
    try:
        value = serde_json.loads(raw)
    except (ValueError, RecursionError):
        return []
    return value if isinstance(value, list) else []


class _Done:
    """An awaitable that is already done (a Job without a worker behind it)."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield  # a generator: awaiting it finishes at once


def _done() -> Awaitable[None]:
    return _Done()
