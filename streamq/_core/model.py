"""The job envelope and the objects users see: Job (handed to handlers), JobInfo, results."""

from __future__ import annotations

import datetime as dt
import json as serde_json
import threading
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Literal

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override

from .context import Context
from .dedup import decode_dk
from .errors import SerializationError

State = Literal["waiting", "scheduled", "queued", "active", "retrying", "completed", "failed",
                "cancelled"]
STATES: tuple[State, ...] = (
    "waiting", "scheduled", "queued", "active", "retrying", "completed", "failed", "cancelled",
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


def plain_options(
    version: int, max_attempts: int, not_before_ms: int, deadline_ms: int,
    idempotency_key: str | None, trace: dict[str, str], headers: dict[str, str],
) -> dict[str, Any]:
    """The envelope's options that are not default, by their envelope names: what a layout-2
    record keeps in its ``op`` field (empty for most jobs, and then not stored)."""
    plain: dict[str, Any] = {}
    if version != 1:
        plain["version"] = version
    if max_attempts:
        plain["max_attempts"] = max_attempts
    if not_before_ms:
        plain["not_before_ms"] = not_before_ms
    if deadline_ms:
        plain["deadline_ms"] = deadline_ms
    if idempotency_key is not None:
        plain["idempotency_key"] = idempotency_key
    if trace:
        plain["trace"] = trace
    if headers:
        plain["headers"] = headers
    return plain


def envelope_from_parts(job_id: str, body: bytes, options: bytes, serde: Any,
                        result_ttl_s: int = 0) -> Envelope:
    """The Envelope of a layout-2 record: its body ('<type> <serialised payload>') and its
    options (serialised dict, b'' = all default). Raises SerializationError."""
    jtype, sep, data = body.partition(b" ")
    if not sep or not jtype:
        raise SerializationError("malformed job body: no '<type> ' prefix")
    if not options and not result_ttl_s:  # the common case: no cattrs pass needed
        return Envelope(job_id, jtype.decode(errors="replace"), serde.loads(data))
    plain: dict[str, Any] = {}
    if options:
        opts = serde.loads(options)
        if not isinstance(opts, dict):
            raise SerializationError("malformed job options: not a mapping")
        plain.update(opts)
    plain.update({"i": job_id, "t": jtype.decode(errors="replace"), "p": serde.loads(data)})
    if result_ttl_s:
        plain["result_ttl_s"] = result_ttl_s
    return envelope_from_plain(plain)


def plain_body(data: bytes, serde: Any) -> tuple[str, Any] | None:
    """(type, payload) of start.lua's job data when it is a bare body (a layout-2 record
    without options: every other envelope field at its default), else None (then
    ``envelope_from_data`` reads it). The worker's common case, without an Envelope.
    Raises SerializationError."""
    if data[:1] in (b"~", b"!"):
        return None
    jtype, sep, payload = data.partition(b" ")
    if not sep or not jtype:
        raise SerializationError("malformed job body: no '<type> ' prefix")
    return jtype.decode(errors="replace"), serde.loads(payload)


def envelope_from_data(job_id: str, data: bytes, serde: Any) -> Envelope:
    """The Envelope from start.lua's job data: ``~<envelope>`` (a layout-1 record),
    ``!<n>:<options><body>`` or ``<body>``. Raises SerializationError."""
    if data[:1] == b"~":
        return envelope_from_plain(serde.loads(data[1:]))
    if data[:1] == b"!":
        n, colon, rest = data[1:].partition(b":")
        if not colon or not n.isdigit() or int(n) > len(rest):
            raise SerializationError("malformed job data: bad options length")
        return envelope_from_parts(job_id, rest[int(n):], rest[:int(n)], serde)
    return envelope_from_parts(job_id, data, b"", serde)


def envelope_to_plain(env: Envelope) -> dict[str, Any]:
    plain: dict[str, Any] = _conv.unstructure(env)
    return plain


def envelope_from_plain(obj: Any) -> Envelope:
    try:
        return _conv.structure(obj, Envelope)
    except Exception as exc:  # cattrs raises ClassValidationError groups, KeyError, TypeError
        raise SerializationError(f"malformed job envelope: {exc}") from exc


class CancelFlag:
    """Set once the worker heard that a cancel was requested for a running job; read by
    ``Job.cancel_requested`` from any thread (a plain flag: setting it is one store, and one
    is made per job, so it is far cheaper than a threading.Event)."""

    __slots__ = ("_set",)

    def __init__(self, value: bool = False) -> None:
        self._set = value

    def set(self) -> None:
        self._set = True

    def is_set(self) -> bool:
        return self._set


@attrs.frozen(slots=False)
class Job:
    """One attempt of a job, as a handler sees it. (The worker builds it with positional
    arguments, in this order: keep the order of the fields, or update attempt.py.)"""

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
    priority: int = 2
    """0 (lowest) to 4 (highest), 2 by default: the level it was enqueued at
    (docs/fairness.md#priorities)."""
    _reporter: Callable[[str, Any], Awaitable[None]] | None = attrs.field(
        default=None, repr=False, eq=False)
    _cancel: CancelFlag | threading.Event | None = attrs.field(default=None, repr=False,
                                                               eq=False)
    ctx: Context = attrs.field(factory=Context, repr=False, eq=False)
    """The worker context: the shared resources the startup hooks built
    (``@registry.on_startup``), e.g. ``job.ctx.db``; the same object for every job of the
    process."""
    _dependencies: tuple[Any, ...] | None = attrs.field(default=None, repr=False, eq=False)

    def dependency_results(self) -> list[Any]:
        """The jobs this one waited for, in ``depends_on`` order (a chain step: the previous
        step; a chord's callback: every member of its group), each a
        ``streamq.DependencyResult`` (queue, job_id, state, result, reason); read by the
        worker before the handler started (page by page). Empty for a job that waited for
        none (docs/workflows.md)."""
        return list(self._dependencies or ())

    @property
    def batch_id(self) -> str | None:
        """The batch this job belongs to (a batch's job or callback), else None: add more
        jobs with ``q.batch_ref(job.batch_id).add([...], from_job=job)``
        (docs/workflows.md#batches-with-callbacks)."""
        return self.headers.get("streamq-batch")

    def batch_summary(self) -> Any:
        """In a batch's callback: a ``streamq.BatchSummary`` (counts, failed ids, every
        job's result) built from ``dependency_results()``."""
        from .flow import BatchSummary

        return BatchSummary.of(self.dependency_results())

    def previous_result(self) -> Any:
        """The result of the first job this one waited for (a chain's previous step), or
        None."""
        deps = self._dependencies
        return deps[0].result if deps else None

    @property
    def cancel_requested(self) -> bool:
        """True once ``cancel(job_id)`` was asked for this running job and its worker heard of
        it (within a second). A sync handler cannot be interrupted: poll this between steps
        and return (or raise) soon; the job then ends ``cancelled`` whatever the handler
        returns. An async handler is also cancelled (``asyncio.CancelledError`` at its next
        ``await``; clean up in ``finally``)."""
        return self._cancel is not None and self._cancel.is_set()

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


_new = object.__new__


def new_job(id: str, type: str, payload: Any, attempt: int, max_attempts: int, queue: str,
            version: int, idempotency_key: str, headers: dict[str, str],
            trace: dict[str, str], deadline_ms: int, priority: int,
            reporter: Callable[[str, Any], Awaitable[None]] | None,
            cancel: CancelFlag | threading.Event | None, ctx: Context,
            dependencies: tuple[Any, ...] | None = None) -> Job:
    """``Job(...)`` with every field given, for the worker's once-per-attempt path: the same
    object, its fields written straight into its ``__dict__`` (as the generated ``__init__``
    of a frozen dict class does), without calling the class, which costs about 2,400
    CPU instructions more per job (``type_call`` into the generated ``__init__`` through a
    bound-method call). Keep it in step with Job's fields: checked at import (below)."""
    job = _new(Job)
    d = job.__dict__
    d["id"] = id
    d["type"] = type
    d["payload"] = payload
    d["attempt"] = attempt
    d["max_attempts"] = max_attempts
    d["queue"] = queue
    d["version"] = version
    d["idempotency_key"] = idempotency_key
    d["headers"] = headers
    d["trace"] = trace
    d["deadline_ms"] = deadline_ms
    d["priority"] = priority
    d["_reporter"] = reporter
    d["_cancel"] = cancel
    d["ctx"] = ctx
    d["_dependencies"] = dependencies
    return job


def _check_new_job() -> None:
    values: list[Any] = [f"v{i}" for i in range(len(attrs.fields(Job)))]
    if new_job(*values).__dict__ != Job(*values).__dict__:
        raise ImportError("streamq: Job's fields changed; update model.new_job")


_check_new_job()

@attrs.frozen
class EnqueueResult:
    job_id: str
    status: Literal["queued", "scheduled", "waiting", "duplicate", "deduplicated", "rejected",
                    "error"]
    """``error`` only inside a PartialEnqueueError's results: the job's own shard's call
    failed (``exception``); enqueue and enqueue_many never return it. ``deduplicated``: folded
    by its dedup key (docs/dedup.md) into the job ``job_id`` names (``reason``: the mode)."""
    state: str
    """For a duplicate: the existing job's state; deduplicated: the state of the job it was
    folded into ('' when that job's record is gone: throttle outlives it)."""
    result: Any = None
    """For a duplicate that completed: its result."""
    error: dict[str, Any] | None = None
    reason: str = ""
    """For a rejected job in a bulk enqueue: why (for an ``error`` one: its error's text)."""
    exception: BaseException | None = attrs.field(default=None, eq=False, repr=False)
    """For an ``error`` one: the error of its shard's call."""


@attrs.frozen
class CancelResult:
    job_id: str
    cancelled: bool
    """True when the job is cancelled (for a running job: once it has stopped, with
    ``wait_s``)."""
    state: str
    """The state the job was in when cancel was asked ('' when not found)."""
    reason: str = ""
    code: str = ""
    """What happened: ``cancelled``, ``cancel_requested`` (the job was running: its worker was
    told to stop it; it ends ``cancelled`` unless it finishes first), ``not_found`` or
    ``not_cancellable`` (already finished)."""
    final_state: str = ""
    """The job's state when the call returned: ``cancelled``; for a running job ``active``
    (still stopping), or with ``wait_s`` the state it ended in (``completed`` when it finished
    before the cancel reached it)."""


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
    group: str | None = None
    """The job's group (``enqueue(group=...)``), None when it has none."""
    priority: int = 2
    """0 (lowest) .. 4 (highest); 2 is the default (docs/fairness.md#priorities)."""
    dedup_key: str | None = None
    """The job's dedup key (``enqueue(dedup=Dedup(key=...))``: docs/dedup.md), None without."""
    dedup_mode: str | None = None
    """The mode of ``dedup_key``: throttle, debounce, keep_last, until_start, until_finish."""

    @property
    def finished(self) -> bool:
        return self.state in TERMINAL


STATE_NAMES: dict[bytes, str] = {b"s": "scheduled", b"q": "queued", b"a": "active",
                                 b"r": "retrying", b"c": "completed", b"f": "failed",
                                 b"x": "cancelled", b"w": "waiting"}
"""Layout-2 record state letters (field ``s``) -> state names."""
V1_FIELDS: dict[bytes, bytes] = {b"state": b"s", b"entry": b"e", b"created": b"c",
                                 b"attempts": b"n", b"token": b"k", b"owner": b"o",
                                 b"started": b"a", b"finished": b"f", b"result": b"r",
                                 b"result_ttl": b"x"}
"""Layout-1 field names -> their layout-2 names (_lib.lua's upgrade_v1)."""
DEFAULT_RESULT_TTL_S = 86400
"""A layout-2 record without ``x`` keeps its result this long (QueueConfig's default)."""


def entry_id(v: bytes | None) -> str:
    """A stored stream entry (``e``): '<ms><seq, 3 digits>' or the id itself -> the id."""
    if not v:
        return ""
    text = v.decode(errors="replace")
    if "-" in text or len(text) < 4 or not text.isdigit():
        return text
    return f"{text[:-3]}-{int(text[-3:])}"


def _entry_ms(v: bytes | None) -> bytes | None:
    eid = entry_id(v)
    ms = eid.partition("-")[0]
    return ms.encode() if ms.isdigit() else None


def record_state(v: bytes | None) -> str:
    """The state name of a record's ``s`` (layout 2) or ``state`` (layout 1) value."""
    if not v:
        return ""
    return STATE_NAMES.get(v) or v.decode(errors="replace")


def normalize_record(h: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """A record in either layout as layout-2 fields (state and entry decoded: ``s`` holds the
    state name, ``e`` the entry id; ``c`` filled in from the entry's time)."""
    if b"s" not in h and b"state" in h:
        h = {V1_FIELDS.get(k, k): v for k, v in h.items()}
        if h.get(b"e") == b"":
            h.pop(b"e")
    else:
        h = dict(h)
    if b"s" in h:
        h[b"s"] = record_state(h[b"s"]).encode()
    if h.get(b"e"):
        if b"c" not in h:
            ms = _entry_ms(h[b"e"])
            if ms is not None:
                h[b"c"] = ms
        h[b"e"] = entry_id(h[b"e"]).encode()
    return h


BRIEF_FIELDS = ("b", "s", "n", "type", "state", "attempts")
"""HMGET fields for a record's type, state and attempts in either layout (``brief``)."""


def brief(vals: Any) -> tuple[str, str, int]:
    """(type, state, attempts) from HMGET ``BRIEF_FIELDS``; blanks when not a record."""
    if not isinstance(vals, list) or len(vals) < 6:
        return "", "", 0
    body, st, n, t1, st1, n1 = vals[:6]
    if st is None:
        body, st, n = None, st1, n1
    jtype = (body.partition(b" ")[0] if body else t1) or b""
    try:
        attempts = int(n or 0)
    except ValueError:
        attempts = 0
    return jtype.decode(errors="replace"), record_state(st), attempts


def decode_record(queue: str, job_id: str, h: dict[bytes, bytes], serde: Any) -> JobInfo:
    """A JobInfo from HGETALL of a job record, either layout."""
    layout1 = b"s" not in h and b"state" in h
    h = normalize_record(h)

    def s(k: str) -> str:
        v = h.get(k.encode())
        return v.decode(errors="replace") if v is not None else ""

    env: Envelope | None = None
    payload: Any = None
    ttl = _int(h.get(b"x")) if b"x" in h else DEFAULT_RESULT_TTL_S
    try:
        if h.get(b"b") is not None:
            env = envelope_from_parts(job_id, h[b"b"], h.get(b"op", b""), serde, ttl)
        elif h.get(b"env") is not None:
            env = envelope_from_plain(serde.loads(h[b"env"]))
        payload = env.payload if env is not None else None
    except (SerializationError, RecursionError):
        env = None
    jtype = env.type if env is not None else s("type")
    if not jtype and h.get(b"b"):
        jtype = h[b"b"].partition(b" ")[0].decode(errors="replace")
    state = s("s")
    result: Any = None
    if h.get(b"r") is not None and state == "completed":
        try:
            result = serde.loads(h[b"r"])
        except SerializationError:
            result = h[b"r"]
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
    # the time the job last entered the stream: its entry's (a layout-1 record kept it too)
    enqueued = h.get(b"enqueued") if layout1 else _entry_ms(h.get(b"e"))
    return JobInfo(
        errors=errors, progress=progress, logs=_json_list(h.get(b"logs")),
        id=job_id, queue=queue, type=jtype, state=state,
        attempts=_int(h.get(b"n")), max_attempts=_int(h.get(b"max_attempts")),
        payload=payload, created_at=_ms_to_dt(h.get(b"c")),
        enqueued_at=_ms_to_dt(enqueued), due_at=_ms_to_dt(h.get(b"due")),
        started_at=_ms_to_dt(h.get(b"a")), finished_at=_ms_to_dt(h.get(b"f")),
        owner=s("o") or None, result=result, error=error, reason=s("reason"),
        envelope=env, group=s("g") or None,
        priority=_int(h.get(b"p")) if h.get(b"p") else 2,
        **_dedup_fields(h.get(b"dk")),
    )


def _dedup_fields(raw: bytes | None) -> dict[str, str]:
    d = decode_dk(raw)
    return {} if d is None else {"dedup_mode": d[0], "dedup_key": d[1]}


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
