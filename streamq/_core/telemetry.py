"""OpenTelemetry (API only) and structured logging for streamq.

With no SDK installed everything here is a no-op, and no span objects are even created (a
no-op span costs more than a whole job's settle), so the overhead stays a few percent.
Metric names follow ``streamq.*``; span names and attributes follow the OpenTelemetry
messaging semantic conventions (``publish <queue>``, ``process <queue>``).
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from opentelemetry import context as otel_context
from opentelemetry import metrics, propagate, trace
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .._version import VERSION

SYSTEM = "streamq"
SCHEMA_URL = "https://opentelemetry.io/schemas/1.27.0"
"""The semantic conventions the attributes follow (1.27: ``messaging.operation.type`` and
``messaging.consumer.group.name``): the instrumentation scope's schema URL."""
CONSUMER_GROUP = "streamq"
"""Every queue's consumer group (``keys.GROUP``; core's keys module is not imported here)."""
_tracer = trace.get_tracer("streamq", VERSION, schema_url=SCHEMA_URL)
_meter = metrics.get_meter("streamq", VERSION, schema_url=SCHEMA_URL)


def _counter(name: str, description: str) -> Any:
    return _meter.create_counter(f"streamq.jobs.{name}", unit="{job}", description=description)


ENQUEUED = _counter("enqueued", "jobs accepted by enqueue")
DUPLICATES = _counter("duplicates", "enqueues answered with an existing job (dedup)")
COMPLETED = _counter("completed", "jobs completed")
RETRIED = _counter("retried", "attempts that failed and were scheduled for a retry")
FAILED = _counter("failed", "jobs dead-lettered")
RECLAIMED = _counter("reclaimed", "entries taken over from a worker whose lease lapsed")
LEASE_LOST = _counter("lease_lost", "results discarded because the lease had been taken over")
CANCELLED = _counter("cancelled", "running jobs stopped by a requested cancel")
RATE_LIMITED = _counter("rate_limited", "attempts that raised RateLimited (no attempt counted)")
SECONDS_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0, 3600.0, 21600.0, 86400.0)
"""Bucket boundaries advised for the histograms (in seconds, from 0.5 ms: a no-op job runs in
tens of µs and an idle worker starts a job within a millisecond; the SDK's default boundaries,
0 to 10,000, are meant for milliseconds). A View of your own still overrides them."""


def _seconds(name: str, description: str) -> Any:
    return _meter.create_histogram(name, unit="s", description=description,
                                   explicit_bucket_boundaries_advisory=SECONDS_BUCKETS)


QUEUE_WAIT = _seconds("streamq.job.queue_wait",
                      "time from (re)entering the stream to start (recorded at the start)")
DURATION = _seconds("streamq.job.duration", "handler run time of one attempt")
END_TO_END = _seconds("streamq.job.end_to_end", "time from enqueue to the end of the attempt")

WORKER_COUNTERS = (COMPLETED, RETRIED, FAILED, LEASE_LOST, CANCELLED, RATE_LIMITED)
"""The counters a worker adds to with ``queue`` and ``type`` labels (and ``started``, an
observable counter: ``Started``)."""
OUTCOMES = {"ok": "completed", "retry": "retried", "dead": "failed", "cancel": "cancelled",
            "later": "rate_limited", "later_group": "rate_limited"}
"""An attempt's outcome (finish.lua's) -> the ``outcome`` label of its duration."""


def metering() -> bool:
    """False while the job histograms record nothing (no meter provider set yet: the API's
    proxy instruments have no real instrument behind them), so a job skips three calls.
    Asked once per job; true as soon as a provider is set."""
    return getattr(QUEUE_WAIT, "_real_instrument", True) is not None


_PROVIDER_ENV = "OTEL_PYTHON_TRACER_PROVIDER"


def tracing() -> bool:
    """True when an SDK tracer provider is installed (spans would be recorded).

    Asked once per job. While no provider is set, the API's own answer reads ``os.environ``
    on every call; the provider global it keeps answers the same without that, so it is read
    first (and the API asked whenever it holds anything, or the environment named a provider
    when streamq was imported)."""
    if getattr(trace, "_TRACER_PROVIDER", _UNSET) is None and _PROVIDER_ENV not in _ENV_AT_IMPORT:
        return False
    return not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


_UNSET = object()
_ENV_AT_IMPORT = frozenset(k for k in os.environ if k == _PROVIDER_ENV)


def attrs_for(queue: str) -> dict[str, str]:
    """A queue's metric attributes: the messaging conventions' and a plain ``queue``."""
    return {"messaging.system": SYSTEM, "messaging.destination.name": queue, "queue": queue}


_typed: dict[tuple[str, str], dict[str, str]] = {}
_outcome: dict[tuple[str, str, str], dict[str, str]] = {}
_CACHE_MAX = 10_000
"""Label sets kept (one a queue, job type and outcome: bounded by the registries)."""


def job_attrs(queue: str, job_type: str) -> dict[str, str]:
    """The attributes of a job's counters: its queue's and ``type`` (cached: once per job)."""
    got = _typed.get((queue, job_type))
    if got is None:
        got = {**attrs_for(queue), "type": job_type}
        if len(_typed) < _CACHE_MAX:
            _typed[(queue, job_type)] = got
    return got


def outcome_attrs(queue: str, job_type: str, outcome: str) -> dict[str, str]:
    """A finished attempt's attributes: ``queue``, ``type`` and ``outcome`` (``OUTCOMES``)."""
    got = _outcome.get((queue, job_type, outcome))
    if got is None:
        got = {**job_attrs(queue, job_type), "outcome": OUTCOMES.get(outcome, outcome)}
        if len(_outcome) < _CACHE_MAX:
            _outcome[(queue, job_type, outcome)] = got
    return got


def zero_counters(queues: Iterable[str], job_types: Iterable[str]) -> None:
    """Every worker counter at 0 for each queue and job type (and ``reclaimed`` for each
    queue), so the series exist from the first scrape (``absent()`` alerts, ``rate()``)."""
    types = list(job_types)
    for queue in queues:
        RECLAIMED.add(0, attrs_for(queue))
        for job_type in types:
            for counter in WORKER_COUNTERS:
                counter.add(0, job_attrs(queue, job_type))


_PLAIN_PROPAGATORS = (TraceContextTextMapPropagator, W3CBaggagePropagator)
_plain_textmap: list[object] = [None]
"""The global propagator last found to be the default kind (see ``carrier``)."""


def _plain(textmap: object) -> bool:
    """The propagator only writes a span's context and baggage (OTel's default: W3C trace
    context and baggage): with an empty context it writes nothing."""
    if textmap is _plain_textmap[0]:
        return True
    inner = getattr(textmap, "_propagators", None)
    if type(textmap) is not CompositePropagator or not isinstance(inner, list | tuple) or \
            not all(type(p) in _PLAIN_PROPAGATORS for p in inner):
        return False
    _plain_textmap[0] = textmap
    return True


def carrier() -> dict[str, str]:
    """The carrier of a job enqueued without a producer span (not tracing): the caller's
    context (and baggage) still travel. Per enqueue call, so the common case is quick: an
    empty context and the default propagator inject nothing."""
    out: dict[str, str] = {}
    if otel_context.get_current() or not _plain(propagate.get_global_textmap()):
        propagate.inject(out)
    return out


@contextlib.contextmanager
def publish(queue: str, n: int, job_id: str | None) -> Iterator[dict[str, str]]:
    """A producer span (one per enqueue call, whatever the batch size) and the carrier that
    every job of the call carries: W3C traceparent/tracestate and baggage, through the
    globally configured propagator."""
    if not tracing():
        yield carrier()
        return
    carrier_: dict[str, str] = {}
    attributes: dict[str, Any] = {**attrs_for(queue), "messaging.operation.type": "send",
                                  "messaging.operation.name": "publish"}
    if n == 1 and job_id:
        attributes["messaging.message.id"] = job_id
    else:
        attributes["messaging.batch.message_count"] = n
    with _tracer.start_as_current_span(f"publish {queue}", kind=SpanKind.PRODUCER,
                                       attributes=attributes):
        propagate.inject(carrier_)
        yield carrier_


class InFlight:
    """Handlers running, by queue, of one worker: changed on its event loop only (no lock
    per job); the in-flight gauge adds up every worker's of the process."""

    __slots__ = ("__weakref__", "by_queue")

    def __init__(self) -> None:
        self.by_queue: dict[str, int] = {}
        with _in_flight_lock:
            _in_flight_sources.add(self)


_in_flight_sources: weakref.WeakSet[InFlight] = weakref.WeakSet()
_in_flight_lock = threading.Lock()  # a worker made while the gauge is read on another thread


class Started:
    """Attempts started by one worker, by (queue, job type): counted in a dict on its event
    loop (no SDK call per job: a counter's ``add`` costs the SDK about 10 µs), read by the
    ``streamq.jobs.started`` observable counter, which adds up every worker of the process
    (and the counts of workers since garbage-collected, so the total never goes down)."""

    __slots__ = ("__weakref__", "by_type")

    def __init__(self) -> None:
        self.by_type: dict[tuple[str, str], int] = {}
        with _started_lock:
            _started_sources.add(self)
        weakref.finalize(self, _retire, self.by_type)

    def zero(self, queues: Iterable[str], job_types: Iterable[str]) -> None:
        """Each queue and job type at 0 (the series there from the first scrape)."""
        types = list(job_types)
        for queue in queues:
            for job_type in types:
                self.by_type.setdefault((queue, job_type), 0)


_started_sources: weakref.WeakSet[Started] = weakref.WeakSet()
_started_retired: dict[tuple[str, str], int] = {}
_started_lock = threading.Lock()


def _retire(counts: dict[tuple[str, str], int]) -> None:
    with _started_lock:
        for key, n in counts.copy().items():
            _started_retired[key] = _started_retired.get(key, 0) + n


def _started(_options: CallbackOptions) -> Iterable[Observation]:
    with _started_lock:
        sources = list(_started_sources)
        totals = dict(_started_retired)
    for source in sources:
        for key, n in source.by_type.copy().items():  # (a copy is one step under the GIL)
            totals[key] = totals.get(key, 0) + n
    for (queue, job_type), n in totals.items():
        yield Observation(n, job_attrs(queue, job_type))


STARTED = _meter.create_observable_counter("streamq.jobs.started", [_started], unit="{job}",
                                           description="attempts started")


class Attempt:
    """The consumer span of one attempt; made only while tracing (``tracing()``)."""

    __slots__ = ("_scope", "span", "trace_id")

    def __init__(self, queue: str, job_id: str, job_type: str, attempt: int,
                 carrier: dict[str, str], parent: bool,
                 server: tuple[str, int] | None = None) -> None:
        ctx = propagate.extract(carrier)
        producer = trace.get_current_span(ctx).get_span_context()
        links = [Link(producer)] if producer.is_valid else []
        self.span = _tracer.start_span(
            f"process {queue}", context=ctx if parent else None, kind=SpanKind.CONSUMER,
            links=links, attributes={**attrs_for(queue), "messaging.operation.type": "process",
                                     "messaging.operation.name": "process",
                                     "messaging.message.id": job_id,
                                     "messaging.consumer.group.name": CONSUMER_GROUP,
                                     **server_attrs(server),
                                     "streamq.job.type": job_type, "streamq.job.attempt": attempt})
        self.trace_id = format(self.span.get_span_context().trace_id, "032x")
        self._scope = trace.use_span(self.span, end_on_exit=False)
        self._scope.__enter__()

    def end(self, outcome: str, exc: BaseException | None = None, detail: str = "",
            error_type: str = "") -> None:
        """``error_type``: the failure's kind (the exception's class name, or streamq's own
        such as ``UnknownJobType``): the span's ``error.type`` on an attempt that failed."""
        self._scope.__exit__(None, None, None)
        self.span.set_attribute("streamq.job.outcome", outcome)
        if exc is not None:
            self.span.record_exception(exc)
        if outcome != "ok":  # (with the ERROR status, as the conventions ask)
            self.span.set_attribute("error.type", error_type or (
                type(exc).__qualname__ if exc is not None else "_OTHER"))
        if outcome == "retry":
            self.span.add_event("streamq.job.retry", {"streamq.retry.delay_s": detail})
        elif outcome == "dead":
            self.span.add_event("streamq.job.dead_lettered", {"streamq.reason": detail})
        if outcome != "ok":
            self.span.set_status(Status(StatusCode.ERROR, detail or outcome))
        self.span.end()


def server_attrs(server: tuple[str, int] | None) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of the Redis a worker reads (when known)."""
    if server is None:
        return {}
    return {"server.address": server[0], "server.port": server[1]}


def carrier_trace_id(carrier: dict[str, str]) -> str:
    """The trace id a producer's carrier names ('' when none)."""
    if not carrier:
        return ""
    tp = carrier.get("traceparent", "")
    parts = tp.split("-")
    return parts[1] if len(parts) == 4 else ""


# ------------------------------------------------------------------ queue gauges

_gauge_sources: dict[int, Callable[[], Iterable[tuple[str, dict[str, float]]]]] = {}


def register_gauges(owner: object, source: Callable[[], Iterable[tuple[str, dict[str, float]]]]
                    ) -> None:
    """Let ``source`` answer the per-queue gauges (cached values; it must not do I/O)."""
    _gauge_sources[id(owner)] = source


def unregister_gauges(owner: object) -> None:
    _gauge_sources.pop(id(owner), None)


def _observe(field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        for source in list(_gauge_sources.values()):
            for queue, values in source():
                if field in values:
                    yield Observation(values[field], attrs_for(queue))
    return callback


for _field, _unit, _desc in [
    ("ready", "{job}", "entries not yet delivered"),
    ("pending", "{job}", "entries delivered and not settled"),
    ("delayed", "{job}", "scheduled and retrying jobs"),
    ("dead", "{job}", "dead-lettered jobs"),
    ("oldest_ready_age", "s", "age of the oldest undelivered entry"),
    ("workers", "{worker}", "workers with a recent heartbeat"),
    ("group_waiting", "{job}", "grouped jobs waiting for a slot of their group"),
    ("waiting", "{job}", "jobs waiting for their dependencies (workflows)"),
    ("oldest_waiting_age", "s", "how long the oldest job waiting for dependencies has waited"),
    ("backlog", "{job}", "what workers have to run: ready, pending, due delayed and grouped"
                         " waiting jobs of every priority level and shard"),
    ("slots", "{slot}", "concurrency of the workers of the queue with a recent heartbeat"),
    ("saturation", "1", "(pending + ready) / the slots (concurrency) of the live workers"),
]:
    _meter.create_observable_gauge(f"streamq.queue.{_field}", [_observe(_field)], unit=_unit,
                                   description=_desc)


def _in_flight(_options: CallbackOptions) -> Iterable[Observation]:
    running: dict[str, int] = {}
    with _in_flight_lock:
        sources = list(_in_flight_sources)
    for source in sources:
        for queue, n in source.by_queue.copy().items():  # (a copy is one step under the GIL)
            running[queue] = running.get(queue, 0) + n
    for queue, n in running.items():
        yield Observation(n, attrs_for(queue))


_meter.create_observable_gauge("streamq.worker.in_flight", [_in_flight], unit="{job}",
                               description="handlers running in this process")


# ------------------------------------------------------------------ process pools

POOL_EVENTS = ("started", "recycled_max_jobs", "recycled_max_memory", "died", "timed_out")
"""What a process pool counts (``PoolCounts.counts``)."""


class PoolCounts:
    """One process pool's figures, changed on its worker's event loop (no SDK call per job),
    read by the ``streamq.pool.*`` instruments, which add up every pool of the process (and
    the counts of pools since garbage-collected, so the counters never go down). All present
    at 0 from the pool's creation."""

    __slots__ = ("__weakref__", "busy", "closed", "counts", "size")

    def __init__(self, size: int) -> None:
        self.size = size
        self.busy = 0
        """Children running a job now."""
        self.closed = False
        self.counts: dict[str, int] = dict.fromkeys(POOL_EVENTS, 0)
        with _pool_lock:
            _pool_sources.add(self)
        weakref.finalize(self, _retire_pool, self.counts)


_pool_sources: weakref.WeakSet[PoolCounts] = weakref.WeakSet()
_pool_retired: dict[str, int] = {}
_pool_lock = threading.Lock()


def _retire_pool(counts: dict[str, int]) -> None:
    with _pool_lock:
        for key, n in counts.copy().items():
            _pool_retired[key] = _pool_retired.get(key, 0) + n


def _pools() -> tuple[list[PoolCounts], dict[str, int]]:
    """The live pools, and every count added up (retired pools included); empty when this
    process never made a pool (a worker without one has no pool series)."""
    with _pool_lock:
        sources = list(_pool_sources)
        totals = dict(_pool_retired)
    for source in sources:
        for key, n in source.counts.copy().items():
            totals[key] = totals.get(key, 0) + n
    return sources, totals


def _pool_gauge(field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        sources, totals = _pools()
        if totals:
            yield Observation(sum(getattr(s, field) for s in sources if not s.closed))
    return callback


def _pool_counter(*events: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        _sources, totals = _pools()
        if not totals:
            return
        if len(events) == 1:
            yield Observation(totals.get(events[0], 0))
            return
        for event in events:  # recycled_<cause>
            yield Observation(totals.get(event, 0),
                              {"cause": event.removeprefix("recycled_")})
    return callback


_meter.create_observable_gauge("streamq.pool.size", [_pool_gauge("size")], unit="{process}",
                               description="child processes the process pools may run")
_meter.create_observable_gauge("streamq.pool.busy", [_pool_gauge("busy")], unit="{process}",
                               description="process pool children running a job now")
_meter.create_observable_counter(
    "streamq.pool.started", [_pool_counter("started")], unit="{process}",
    description="process pool children started (replacements included)")
_meter.create_observable_counter(
    "streamq.pool.recycled", [_pool_counter("recycled_max_jobs", "recycled_max_memory")],
    unit="{process}", description="children retired between jobs, by cause (max_jobs,"
    " max_memory)")
_meter.create_observable_counter(
    "streamq.pool.died", [_pool_counter("died")], unit="{process}",
    description="children that died by themselves (a signal, os._exit, an OOM kill)")
_meter.create_observable_counter(
    "streamq.pool.timeouts", [_pool_counter("timed_out")], unit="{process}",
    description="children killed because a job outlived its timeout (hard timeouts)")


# ------------------------------------------------------------------ structured logs

class JobLike(Protocol):
    """What the log context needs of a running job (a ``streamq.Job``)."""

    @property
    def id(self) -> str: ...
    @property
    def type(self) -> str: ...
    @property
    def queue(self) -> str: ...
    @property
    def attempt(self) -> int: ...
    @property
    def trace(self) -> dict[str, str]: ...


JOB: contextvars.ContextVar[dict[str, Any] | JobLike | None] = contextvars.ContextVar(
    "streamq_job", default=None)
"""The running job's log context: its fields (a dict: a traced attempt's, with its span's
trace id) or the ``Job`` itself, read when a record is logged (``job_fields``): an attempt
that logs nothing builds no dict."""
_JOB_FIELDS = ("job_id", "job_type", "queue", "attempt", "trace_id")


def job_fields() -> dict[str, Any] | None:
    """The running job's log fields (job_id, job_type, queue, attempt, trace_id), or None."""
    ctx = JOB.get()
    if ctx is None or type(ctx) is dict:
        return ctx
    job: Any = ctx  # (a Job: its trace id is the producer's, as a span-less attempt's)
    return {"job_id": job.id, "job_type": job.type, "queue": job.queue,
            "attempt": job.attempt, "trace_id": carrier_trace_id(job.trace)}
_EXTRA_FIELDS = ("stats",)
"""Structured values a log record may carry (``extra=``) that JSON lines keep as fields."""


class JobContextFilter(logging.Filter):
    """Adds job_id, job_type, queue, attempt and trace_id to every record logged while a job
    runs (the handler's own logging included). Install it on a handler:
    ``handler.addFilter(JobContextFilter())``."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = job_fields()
        for name in _JOB_FIELDS:
            if not hasattr(record, name):
                setattr(record, name, ctx.get(name) if ctx else None)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, job fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname, "logger": record.name, "message": record.getMessage(),
        }
        ctx = job_fields()
        for name in _JOB_FIELDS:
            value = getattr(record, name, None) or (ctx.get(name) if ctx else None)
            if value not in (None, ""):
                out[name] = value
        for name in _EXTRA_FIELDS:  # structured extras (``extra={"stats": {...}}``)
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)
