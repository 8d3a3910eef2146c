"""One attempt of a job: decode its envelope, find its handler, call it within its timeout,
turn what happened into an outcome for settling (finish.lua), and log a failure."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import time
from collections.abc import Callable
from typing import Any

from .._core import telemetry as tel
from .._core.config import QueueConfig, RetryPolicy, WorkerConfig
from .._core.driver import adrive
from .._core.errors import (
    MAX_RETRY_AFTER_S,
    Fail,
    InvalidArgument,
    InvalidPayload,
    PayloadTooLarge,
    RateLimited,
    Retry,
    SerializationError,
    WaitForChildren,
)
from .._core.flow import DEPS_HEADER, all_results, results_of
from .._core.model import Job, envelope_from_data, new_job, plain_body
from .._core.timeseries import SeriesRecorder
from .cancel import cancelled
from .invoke import Expired, SyncRunner, bounded, error_info
from .lease import Lease
from .pool import Encoded, ProcessPool
from .progress import Progress, Sent
from .registry import HandlerSpec, Registry
from .state import Finish, QState, WorkerStats

log = logging.getLogger("streamq.worker")
_OK_NONE = ("ok", b"", 0, "")
"""The rest of a ``Finish`` for a handler that returned None (not stored)."""
_perf_counter = time.perf_counter
_last_exc: contextvars.ContextVar[BaseException | None] = contextvars.ContextVar(
    "streamq_last_exc", default=None)
_deliberate: contextvars.ContextVar[bool] = contextvars.ContextVar("streamq_deliberate",
                                                                   default=False)
"""The attempt's dead letter was asked for (Fail, fail_on, an invalid payload): one WARNING
line, no traceback."""


def by_rule(spec: HandlerSpec, exc: BaseException) -> str | None:
    """The dead-letter reason when the handler's retry rules say ``exc`` fails the job at
    once (``fail_on`` first, then ``retry_on``), else None (retried while attempts last)."""
    if spec.fail_on and isinstance(exc, spec.fail_on):
        _deliberate.set(True)
        return f"{type(exc).__name__} is in fail_on"
    if spec.retry_on is not None and not isinstance(exc, spec.retry_on):
        names = ", ".join(t.__name__ for t in spec.retry_on)
        return f"{type(exc).__name__} is not in retry_on ({names})"[:500]
    return None


class Attempts:
    """Runs attempts for one worker (``runner`` runs its sync handlers; set at start)."""

    def __init__(self, config: WorkerConfig, queue_config: QueueConfig, registry: Registry,
                 stats: WorkerStats) -> None:
        self.config = config
        self.queue_config = queue_config
        self.registry = registry
        self.stats = stats
        self.runner: SyncRunner | None = None
        self.pool: ProcessPool | None = None
        """The process pool, when a handler runs isolated (pool.py)."""
        self.progress: Progress | None = None
        self.series: SeriesRecorder | None = None
        self.in_flight = tel.InFlight()
        self.deps_client: Any = None
        """Reads a waiting job's dependency results before its handler runs (workflows)."""
        self.started = tel.Started()
        self.known_types: frozenset[str] = frozenset()
        """The registry's job types (set at start): any other counts as type ``?``, so a
        producer's typo never makes a new series."""
        self.server: tuple[str, int] | None = None
        """The Redis server's address and port (the spans' ``server.*``; set at start)."""
        self.seen: list[tuple[str, bool, int, float]] | None = None
        """While a batch's first steps run (``collect``): the chart observations of the
        attempts that ended there, handed to ``series`` in one call (``flush_seen``)."""
        self.found = registry.found
        """The registry's handlers as found by (job type, version): a lookup per job without
        a call (``Registry.get`` on a miss)."""
        self.metering = False
        """Job metrics are recorded (``tel.metering()``), as asked for the batch (``ask``)."""
        self.tracing = False
        """Attempts make spans (``tel.tracing()``), as asked for the batch (``ask``)."""
        self.record: Callable[[Lease, str, Any], Sent] | None = None
        """``progress.record`` (bound once a batch): a job's reporter is its lease, which
        calls it (``Lease.__call__``)."""

    def ask(self) -> None:
        """Ask once for a batch of attempts (Worker._start_jobs) whether metrics and spans
        are recorded (each attempt asked for itself before): a provider installed while a
        batch starts counts from the next batch on."""
        self.metering = tel.metering()
        self.tracing = tel.tracing()
        self.record = self.progress.record if self.progress is not None else None

    def collect(self) -> None:
        """Attempts that end from here on are observed for the charts in one call, at
        ``flush_seen`` (a batch of first steps: Worker._start_jobs)."""
        self.seen = []

    def flush_seen(self) -> None:
        seen, self.seen = self.seen, None
        if seen and self.series is not None:
            self.series.observe_many(seen)

    def internal_error(self, lease: Lease, attempt: int, exc: Exception) -> Finish:
        """The outcome of an attempt that met a bug of ours (call it in the ``except``): a
        retry (not forever), never a lost slot."""
        log.exception("job %s: internal error", lease.job_id)
        err = self.queue_config.serde.dumps(error_info(exc))
        if attempt >= self.config.default_max_attempts:
            return (lease.job_id, lease.entry, lease.token, "dead", err, "internal error",
                    type(exc).__name__)
        return (lease.job_id, lease.entry, lease.token, "retry", err, 1000,
                type(exc).__name__)

    async def attempt(self, qs: QState, lease: Lease, attempt: int, data: bytes,
                      times: tuple[int, int, int], task: asyncio.Task[Any] | None) -> Finish:
        """One attempt's outcome, run in ``task`` (the current one). Raises CancelledError
        when the worker stops (the job is handed back); an error of ours is the caller's
        (``internal_error``). A cancel of the job stops the handler (``interrupt``): an async
        handler's task is cancelled, and an attempt that ends after the request is settled
        with the ``cancel`` outcome."""
        deadline_ms, wait_ms, age_ms = times
        job_id = lease.job_id
        ident = (job_id, lease.entry, lease.token)
        serde = self.queue_config.serde
        metering = self.metering  # (asked once per batch: ask)
        record = self.record

        try:  # a bare body (every envelope option at its default) needs no Envelope
            plain = plain_body(data, serde)
            env = envelope_from_data(lease.job_id, data, serde) if plain is None else None
        except (SerializationError, RecursionError) as exc:
            if metering:
                self._begin(qs, lease.entry, "?", wait_ms)
            return self._dead(qs, ident, attempt, "MalformedEnvelope", str(exc)[:500],
                              "malformed envelope")
        if env is None:
            assert plain is not None
            jtype, payload = plain
            version, env_attempts, idem = 1, 0, job_id
            headers: dict[str, str] = {}
            carrier: dict[str, str] = {}
        else:
            jtype, payload, version, env_attempts = env.type, env.payload, env.version, \
                env.max_attempts
            idem, headers, carrier = env.idempotency_key or env.id, env.headers, env.trace
        if metering:
            self._begin(qs, lease.entry, jtype, wait_ms)
        if env is not None and env.id != job_id:  # never another job's id (idempotency)
            return self._dead(qs, ident, attempt, "MalformedEnvelope",
                              f"the envelope names job {env.id!r}", "malformed envelope",
                              jtype)
        spec = self.found.get((jtype, version)) or self.registry.get(jtype, version)
        if spec is None:
            return self._dead(qs, ident, attempt, "UnknownJobType",
                              f"no handler for {jtype!r} version {version} on this worker"
                              f" (registered: {', '.join(self.registry.names())})",
                              "unknown job type", jtype)
        max_attempts = env_attempts or spec.max_attempts or self.config.default_max_attempts
        if attempt > max_attempts:
            return self._dead(qs, ident, attempt, "LeaseExpired", f"attempt {attempt} of"
                              f" {max_attempts}: the previous run's lease lapsed",
                              "attempts exhausted (lease lapsed)", jtype)
        queue = qs.keys.queue
        # (new_job: Job(...) without the class call, once per job.) A job's priority is the
        # level of the ready stream it was read from (each level has its own).
        lease.report = record  # (the lease is the job's reporter and its cancel flag)
        job = new_job(job_id, jtype, payload, attempt, max_attempts, queue, version, idem,
                      headers, carrier, deadline_ms, qs.keys.level,
                      lease if record is not None else None, lease,
                      self.registry.lifecycle.ctx)
        if self.deps_client is not None and (spec.children or (headers and DEPS_HEADER in
                                                               headers)):
            # a job that waited for others: its dependency results, sent with its start
            # (a hand-off: Lease.deps) or read page by page
            deps = (results_of(lease.deps, serde) if lease.deps is not None else
                    await adrive(self.deps_client, all_results(qs.keys, job.id, serde)))
            object.__setattr__(job, "_dependencies", tuple(deps))
        if self.tracing:
            span: tel.Attempt | None = tel.Attempt(queue, job_id, jtype, attempt, carrier,
                                                   self.config.trace_parent, self.server)
            assert span is not None
            tel.JOB.set({"job_id": job_id, "job_type": jtype, "queue": queue,
                         "attempt": attempt, "trace_id": span.trace_id})
        else:  # the log context is the job itself: its fields read only when a line is
            span = None  # logged (tel.job_fields)
            tel.JOB.set(job)
        # (never reset: every attempt runs in a context of its own, made for it and dropped
        # with it, Running._start_jobs and _run_job)
        if metering:  # the in-flight gauge (read only where metrics are recorded: an
            # attempt that began before a provider was installed is not counted)
            running = self.in_flight.by_queue
            try:  # (no call: a queue's first job only meets the KeyError)
                running[queue] += 1
            except KeyError:
                running[queue] = 1
        started = time.perf_counter()
        exc_seen: BaseException | None = None
        item: Finish | None = None
        try:
            if lease._set:  # asked before the handler began: it never runs (the lease's
                # cancel flag, CancelFlag.is_set without its call)
                item = cancelled(lease)
            else:  # interrupt() cancels an async handler's task (cancel.py)
                pool = self.pool if spec.isolation == "process" or \
                    self.config.pool == "process" else None
                if spec.is_async and pool is None:  # (a pool child is told: pool.py)
                    lease.task = task
                timeout = spec.timeout_s or self.config.default_timeout_s
                # (_last_exc and _deliberate are at their defaults: each attempt runs in a
                # fresh copy of the worker's context, Worker._start_jobs)
                try:
                    try:
                        if pool is not None:  # a child process; the timeout is a hard limit
                            result = await pool.run(job, timeout, lease.cancel)
                        elif spec.is_async:  # without a limit: no Timeout context, no extra task
                            coro = spec.fn(job)
                            result = await (coro if timeout is None else bounded(coro, timeout))
                        else:  # the timeout counts from when a thread starts the handler
                            assert self.runner is not None
                            result = await self.runner.run(spec.fn, job, timeout)
                            self.stats.stuck_threads = len(self.runner.stuck())
                    except BaseException as exc:  # any handler failure is the job's, not ours
                        if isinstance(exc, asyncio.CancelledError) and (
                                task is None or task.cancelling()):
                            raise  # the worker stops, or interrupt(): a handler's own fails it
                        item = self._failed(spec, job, ident, attempt, max_attempts, exc,
                                            timeout)
                    else:  # (None is not stored: finish.lua reads b'' back as None)
                        item = ident + _OK_NONE if result is None else \
                            self._succeeded(spec, ident, attempt, max_attempts, result)
                except asyncio.CancelledError:
                    if not lease.interrupted or task is None:
                        raise  # the worker is stopping: hand the job back
                    lease.interrupted = False
                    if task.uncancel() > 0:
                        raise  # the worker is stopping as well (start.lua ends it cancelled)
                    item = cancelled(lease)
                finally:
                    lease.task = None
                if lease.interrupted and task is not None:  # it swallowed its cancellation
                    lease.interrupted = False
                    task.uncancel()
                if lease._set:  # asked while it ran: settled 'cancel'
                    item = cancelled(lease)
        except BaseException as exc:
            exc_seen = exc
            raise
        finally:
            if metering:
                running[queue] -= 1
            ran_s = time.perf_counter() - started
            if item is not None:
                if metering:  # (the queue wait was recorded at the start: _begin)
                    labels = tel.outcome_attrs(queue, jtype, item[3])
                    tel.DURATION.record(ran_s, labels)
                    tel.END_TO_END.record(age_ms / 1000 + ran_s, labels)
                if span is not None:
                    span.end(item[3], _last_exc.get(), str(item[5]) if item[3] != "ok" else "",
                             item[6])
                outcome = item[3]
                ok = outcome == "ok"
                if ok or outcome == "dead":
                    seen = self.seen
                    if seen is not None:  # a batch's first steps: observed once per batch
                        seen.append((queue, ok, wait_ms, ran_s * 1000))
                    elif self.series is not None:
                        self.series.observe(queue, ok, wait_ms, ran_s * 1000)
                if not ok and (outcome == "retry" or outcome == "dead"):
                    exc_now = _last_exc.get()
                    self._log_outcome(job.queue, job.id, job.type, attempt, max_attempts,
                                      item[5] if item[3] == "dead" else int(item[5]),
                                      item[6], str(exc_now) if exc_now else "", exc_now)
            elif span is not None:
                span.end("interrupted", exc_seen, "worker stopping")
        return item

    def _begin(self, qs: QState, entry: str, jtype: str, wait_ms: int) -> None:
        """An attempt starts (its type known), while metrics are recorded: counted, and its
        queue wait recorded now."""
        if jtype not in self.known_types:  # a type from the stream: not a label value
            jtype = "?"
        key = (qs.keys.queue, jtype)
        started = self.started.by_type
        started[key] = started.get(key, 0) + 1
        tel.QUEUE_WAIT.record(wait_ms / 1000, tel.job_attrs(*key))
        qs.job_types[entry] = jtype  # the settling loop counts its outcome by type

    def _dead(self, qs: QState, ident: tuple[str, str, str], attempt: int, etype: str,
              message: str, reason: str, jtype: str = "?") -> Finish:
        """An attempt that never reached its handler: dead-lettered, and logged."""
        self._log_outcome(qs.keys.queue, ident[0], jtype, attempt, None, reason, etype,
                          message, None)
        err = {"type": etype, "message": message, "traceback": ""}
        return (*ident, "dead", self.queue_config.serde.dumps(err), reason, etype)

    def _log_outcome(self, queue: str, job_id: str, jtype: str, attempt: int,
                     max_attempts: int | None, after: str | int, etype: str, message: str,
                     exc: BaseException | None) -> None:
        """A failed attempt is a WARNING naming the job, its type, the attempt, the error and
        the retry delay; a dead letter an ERROR, with the traceback unless turned off."""
        extra = {"job_id": job_id, "job_type": jtype, "attempt": attempt, "queue": queue}
        of = f"/{max_attempts}" if max_attempts else ""
        what = f"{etype}: {message}" if message else etype
        if isinstance(after, int):
            log.warning("job %s (%s) attempt %d%s failed: %s; retrying in %.1f s", job_id,
                        jtype, attempt, of, what, after / 1000, extra=extra)
            return
        why = "" if after == message else f" ({after})"  # a Fail's reason is its message
        if exc is not None and _deliberate.get():  # asked for: the handler's own decision
            log.warning("job %s (%s) attempt %d%s failed: %s; dead-lettered%s", job_id, jtype,
                        attempt, of, what, why, extra=extra)
            return
        tb = exc if exc is not None and self.config.log_dead_tracebacks else None
        log.error("job %s (%s) attempt %d%s failed: %s; dead-lettered%s", job_id, jtype,
                  attempt, of, what, why, exc_info=tb, extra=extra)

    def _failed(self, spec: HandlerSpec, job: Job, ident: tuple[str, str, str], attempt: int,
                max_attempts: int, exc: BaseException, timeout: float | None) -> Finish:
        """The outcome of a handler that raised (not the worker's own cancellation)."""
        _last_exc.set(exc)
        if isinstance(exc, Fail):
            _deliberate.set(True)
            return (*ident, "dead", self.queue_config.serde.dumps(error_info(exc)),
                    exc.reason[:500], "Fail")
        if isinstance(exc, InvalidPayload):  # the same payload fails the same way again
            _deliberate.set(True)
            return (*ident, "dead", self.queue_config.serde.dumps(error_info(exc)),
                    str(exc)[:500], "InvalidPayload")
        if isinstance(exc, Retry):
            return self._retry_or_bury(ident, spec, attempt, max_attempts, exc, exc.delay_s)
        if isinstance(exc, WaitForChildren):  # (finish.lua's 'children': _flow.lua's park)
            return (*ident, "children", self.queue_config.serde.dumps(error_info(exc)), 0,
                    "WaitForChildren")
        if isinstance(exc, RateLimited):
            return self._rate_limited(ident, job.type, spec, attempt, max_attempts, exc)
        if timeout is not None and isinstance(exc, Expired):
            if self.runner is not None:
                self.stats.stuck_threads = len(self.runner.stuck())
            ours = TimeoutError(f"handler timed out after {timeout:g} s{exc}")
            ours.__cause__ = None
            _last_exc.set(ours)
            exc = ours
        elif isinstance(exc, (KeyboardInterrupt, SystemExit)):
            log.warning("handler of job %s raised %s; treated as a job failure",
                        job.id, type(exc).__name__)
        rule = by_rule(spec, exc)
        if rule is not None:
            return (*ident, "dead", self.queue_config.serde.dumps(error_info(exc)), rule,
                    type(exc).__name__)
        return self._retry_or_bury(ident, spec, attempt, max_attempts, exc, None)

    def _succeeded(self, spec: HandlerSpec, ident: tuple[str, str, str], attempt: int,
                   max_attempts: int, result: Any) -> Finish:
        """The outcome of a handler that returned ``result``."""
        if result is None:  # not stored (finish.lua): b'' reads back as None
            return (*ident, "ok", b"", 0, "")
        serde = self.queue_config.serde
        try:
            if type(result) is Encoded:  # encoded by a pool child (pool.py)
                if result.error:
                    raise SerializationError(result.error)
                payload = result.data
            else:
                payload = serde.dumps(result)
        except Exception as exc:  # noqa: BLE001 - a custom serde may raise anything
            err = exc if isinstance(exc, SerializationError) else SerializationError(
                f"result not serialisable: {exc!r}")
            _last_exc.set(err)  # the handler's retry policy decides, as for any failure
            return self._retry_or_bury(ident, spec, attempt, max_attempts, err, None,
                                       exhausted="result not serialisable")
        limit_bytes = self.queue_config.max_payload_bytes
        if len(payload) > limit_bytes:
            big = PayloadTooLarge(f"result is {len(payload)} bytes, over the queue's"
                                  f" max_payload_bytes of {limit_bytes}")
            _last_exc.set(big)
            return (*ident, "dead", serde.dumps(error_info(big)), "result too large",
                    "PayloadTooLarge")
        return (*ident, "ok", payload, 0, "")

    def _rate_limited(self, ident: tuple[str, str, str], jtype: str, spec: HandlerSpec,
                      attempt: int, max_attempts: int, exc: RateLimited) -> Finish:
        """Back after ``retry_after`` without counting the attempt (finish.lua's 'later');
        a bad ``retry_after`` makes it an ordinary failure."""
        after = exc.retry_after
        if (isinstance(after, bool) or not isinstance(after, (int, float))
                or not 0 < after <= MAX_RETRY_AFTER_S):  # (NaN fails the comparison)
            bad = InvalidArgument(f"RateLimited(retry_after={after!r}): retry_after must be a"
                                  f" number of seconds > 0 and <= {MAX_RETRY_AFTER_S:g}")
            _last_exc.set(bad)
            return self._retry_or_bury(ident, spec, attempt, max_attempts, bad, None)
        log.info("job %s (%s) rate limited (%s); back in %.1f s, attempt %d not counted",
                 ident[0], jtype, exc.reason, after, attempt,
                 extra={"job_id": ident[0], "job_type": jtype, "attempt": attempt})
        data = self.queue_config.serde.dumps(error_info(exc))
        outcome = "later_group" if exc.group else "later"  # later_group: the group waits too
        return (*ident, outcome, data, max(1, math.ceil(after * 1000)), "RateLimited")

    def _retry_or_bury(self, ident: tuple[str, str, str], spec: HandlerSpec,
                       attempt: int, max_attempts: int, exc: BaseException,
                       delay_s: float | None, exhausted: str = "attempts exhausted") -> Finish:
        data = self.queue_config.serde.dumps(error_info(exc))
        etype = type(exc).__name__
        if attempt >= max_attempts:
            return (*ident, "dead", data, exhausted, etype)
        if delay_s is None:
            policy: RetryPolicy = spec.retry or self.config.retry
            delay_s = policy.delay_s(attempt)
        return (*ident, "retry", data, max(0, int(delay_s * 1000)), etype)
