"""The worker: fetch with XREADGROUP, start, run handlers, settle outcomes in batches, recover."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import os
import signal
import socket
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import attrs
import redis.asyncio as aredis
from redis.exceptions import NoPermissionError, ResponseError

from . import _housekeeping as hk
from . import _settle as st
from . import _telemetry as tel
from ._config import QueueConfig, RetryPolicy, WorkerConfig
from ._conn import async_client, sync_client
from ._errors import Fail, PayloadTooLarge, Retry, SerializationError
from ._invoke import Expired, bounded, capture, error_info
from ._keys import GROUP, Keys, queues_key
from ._lease import Lease, LeaseKeeper
from ._model import Envelope, Job, envelope_from_plain
from ._promote import Promoter
from ._registry import HandlerSpec, Registry
from ._retry import TRANSIENT
from ._scripts import SCRIPTS

log = logging.getLogger("streamq.worker")
_BATCH = 1000
_instance = itertools.count()
_last_exc: contextvars.ContextVar[BaseException | None] = contextvars.ContextVar(
    "streamq_last_exc", default=None)
Finish = tuple[str, str, str, str, bytes, Any, str]
"""(job id, entry, token, outcome, data, delay ms or reason, error type) for finish.lua."""


@attrs.define
class _QState:
    keys: Keys
    buf: list[Finish] = attrs.field(factory=list)
    flush: asyncio.Event = attrs.field(factory=asyncio.Event)
    paused: bool = False
    cursor: str = "0-0"
    """XAUTOCLAIM cursor, kept between reclaim rounds."""
    next_reclaim: float = 0.0
    own_cursor: str | None = "0"
    """Where to read this consumer's own pending entries from; None once they are all seen."""
    promoter: Promoter | None = None
    starting: set[asyncio.Task[None]] = attrs.field(factory=set)
    """start.lua calls in flight: the fetch loop reads on while a batch starts."""
    labels: dict[str, str] = attrs.field(factory=dict)
    """Metric attributes of this queue."""
    gauges: dict[str, float] = attrs.field(factory=dict)


@attrs.define
class WorkerStats:
    started: int = 0
    completed: int = 0
    retried: int = 0
    failed: int = 0
    lost: int = 0
    reclaimed: int = 0
    released: int = 0


class Worker:
    """Runs registered handlers for jobs of one or more queues.

    ``worker.run()`` blocks until SIGTERM/SIGINT; inside a running service use
    ``async with worker:`` or ``await worker.start()`` / ``await worker.stop()``.
    """

    def __init__(self, url: str, queues: Sequence[str], registry: Registry,
                 config: WorkerConfig | None = None, queue_config: QueueConfig | None = None,
                 *, consumer: str | None = None, **client_kwargs: Any) -> None:
        self.config = config or WorkerConfig()
        self.queue_config = queue_config or QueueConfig()
        self.registry = registry
        self.url = url
        if not queues:
            raise ValueError("a worker needs at least one queue")
        self.consumer = consumer or f"{socket.gethostname()}:{os.getpid()}:{next(_instance)}"
        self._client_kwargs = client_kwargs
        self._qs = {q: _QState(Keys(q, self.queue_config.key_prefix), labels=tel.attrs_for(q))
                    for q in queues}
        self._gauges_read = False
        self.stats = WorkerStats()
        self._free = self.config.concurrency
        self._unsettled = 0
        """Outcomes handed to the flush loops and not settled yet, over all queues."""
        self._capacity = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._jobs: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._loops: list[asyncio.Task[None]] = []
        self._flushers: list[asyncio.Task[None]] = []
        self._running = False
        self._settling = False
        self._stopped = asyncio.Event()
        self._client: aredis.Redis | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._leases = LeaseKeeper(self._sync_client, self.consumer, self.config.renew_every_s)

    @classmethod
    def from_url(cls, url: str, *, queues: Sequence[str], registry: Registry,
                 concurrency: int | None = None, visibility_timeout: float | None = None,
                 config: WorkerConfig | None = None, queue_config: QueueConfig | None = None,
                 **kwargs: Any) -> Worker:
        cfg = config or WorkerConfig()
        if concurrency is not None:
            cfg = attrs.evolve(cfg, concurrency=concurrency)
        if visibility_timeout is not None:
            cfg = attrs.evolve(cfg, visibility_timeout_s=visibility_timeout)
        return cls(url, queues, registry, cfg, queue_config, **kwargs)

    def _sync_client(self) -> Any:
        return sync_client(self.url, **self._client_kwargs)

    # ----------------------------------------------------------------- lifecycle

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> None:
        """Connect, create the consumer groups, and start fetching in background tasks."""
        if self._running:
            return
        timeout = self.config.block_ms / 1000 + 10
        self._client = async_client(self.url, socket_timeout_s=timeout, **self._client_kwargs)
        self._pool = ThreadPoolExecutor(self.config.sync_threads or self.config.concurrency,
                                        thread_name_prefix="streamq-job")
        try:
            await self._client.sadd(queues_key(self.queue_config.key_prefix), *self._qs)
        except NoPermissionError:  # an ACL user confined to its own queues' keys
            log.info("queue names not registered in %s (no ACL permission): `streamq stats`"
                     " needs them named", queues_key(self.queue_config.key_prefix))
        for qs in self._qs.values():
            await self._ensure_group(qs.keys)
            if self.config.promote:
                qs.promoter = Promoter(qs.keys, self.queue_config)
        await hk.refresh_paused(self)  # never fetch from a queue that is already paused
        self._running = True
        self._settling = True
        self._stopped.clear()
        self._unsettled = sum(len(qs.buf) for qs in self._qs.values())
        self._free = self.config.concurrency - self._owed()
        self._capacity.set()
        for qs in self._qs.values():
            qs.own_cursor = "0"
        self._leases = LeaseKeeper(self._sync_client, self.consumer, self.config.renew_every_s)
        self._leases.start()
        for qs in self._qs.values():
            self._loops.append(asyncio.create_task(self._fetch_loop(qs)))
            self._flushers.append(asyncio.create_task(st.flush_loop(self, qs)))
        tel.register_gauges(self, lambda: hk.gauge_values(self))
        self._loops.append(asyncio.create_task(hk.control_loop(self)))
        if self.config.promote:
            self._loops.append(asyncio.create_task(hk.promote_loop(self)))
        log.info("worker %s started on %s (concurrency %d)", self.consumer,
                 ", ".join(self._qs), self.config.concurrency)

    async def stop(self) -> None:
        """Stop fetching, let in-flight jobs finish within the grace period, hand back the rest."""
        if not self._running:
            return
        self._running = False  # every loop also ends on its own (a cancellation racing a
        for t in self._loops:  # client timeout can surface as TimeoutError on Python 3.11)
            t.cancel()
        await asyncio.wait(self._loops, timeout=5)
        self._loops.clear()
        starting = {t for qs in self._qs.values() for t in qs.starting}
        if starting:  # a batch being started: let its jobs launch (they get the grace period)
            await asyncio.wait(starting, timeout=5)
            for t in starting:
                t.cancel()
            await asyncio.gather(*starting, return_exceptions=True)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=self.config.grace_period_s)
        leftover = [(key, task) for key, task in self._jobs.items() if not task.done()]
        for _key, task in leftover:
            task.cancel()
        await asyncio.gather(*(t for _, t in leftover), return_exceptions=True)
        self._settling = False  # flushers settle what is buffered, then end
        for qs in self._qs.values():
            qs.flush.set()
        await asyncio.wait(self._flushers, timeout=self.config.grace_period_s)
        for t in self._flushers:
            t.cancel()
        self._flushers.clear()
        tel.unregister_gauges(self)
        try:
            await st.hand_back(self)
        finally:
            self._leases.stop()
            assert self._pool is not None and self._client is not None
            self._pool.shutdown(wait=False, cancel_futures=True)
            await self._client.aclose()
            self._stopped.set()
        log.info("worker %s stopped: %s", self.consumer, self.stats)

    def run(self) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully."""
        asyncio.run(self._run_until_signal())

    async def _run_until_signal(self) -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await self.start()
        try:
            await stop.wait()
        finally:
            await self.stop()

    # ----------------------------------------------------------------- fetching

    async def _ensure_group(self, keys: Keys) -> None:
        assert self._client is not None
        try:
            await self._client.xgroup_create(keys.stream, GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _reserve(self, want: int) -> int:
        share = max(1, self._free // max(1, len(self._qs)))
        n = min(want, share, self._free)
        self._free -= n
        if self._free <= 0:
            self._capacity.clear()
        return n

    def _release(self, n: int) -> None:
        if n > 0:
            self._free += n
            self._capacity.set()

    def _owed(self) -> int:
        """Slots kept by finished handlers whose outcomes wait to be settled: none while at
        most ``concurrency`` outcomes wait, so a slot is free again as soon as its handler
        returns, and a worker holds at most twice ``concurrency`` leases."""
        return max(0, self._unsettled - self.config.concurrency)

    def _handed_over(self) -> None:
        """A handler is done and its outcome is buffered for settling: free its slot now,
        unless too many outcomes already wait (Redis slow or away); then it is freed when
        the backlog is settled."""
        self._unsettled += 1
        if not self._owed():
            self._release(1)

    def _settled_n(self, n: int) -> None:
        before = self._owed()
        self._unsettled -= n
        self._release(before - self._owed())

    async def _fetch_loop(self, qs: _QState) -> None:
        """Fetch for one queue: own pending entries first, lapsed leases when a reclaim is
        due, new entries otherwise. The loop alone owns the capacity it reserves."""
        assert self._client is not None
        loop = asyncio.get_running_loop()
        backoff = 0.05
        while self._running:
            if qs.paused:
                await asyncio.sleep(0.2)
                continue
            await self._capacity.wait()
            # at most half the slots per fetch: one batch starts while another settles
            n = self._reserve(min(self.config.fetch_batch,
                                  max(1, self.config.concurrency // 2)))
            if n == 0:
                await asyncio.sleep(0)
                continue
            reclaimed = False
            try:
                if qs.starting and (qs.own_cursor is not None or loop.time() >= qs.next_reclaim):
                    # reading own entries or reclaiming must not meet a batch still starting
                    await asyncio.wait(set(qs.starting))
                if qs.own_cursor is not None:  # entries delivered to this consumer name earlier
                    entries = await self._read_own(qs, n)
                elif loop.time() >= qs.next_reclaim:
                    entries = await self._reclaim(qs, n)
                    reclaimed = True
                    if qs.cursor == "0-0":  # a full sweep is done; the next one when due
                        qs.next_reclaim = loop.time() + self.config.reclaim_every_s
                else:
                    reply: Any = await self._client.xreadgroup(
                        GROUP, self.consumer, {qs.keys.stream: ">"}, count=n,
                        block=min(self.config.block_ms,
                                  max(1, int((qs.next_reclaim - loop.time()) * 1000))))
                    entries = reply[0][1] if reply else []
                backoff = 0.05
            except asyncio.CancelledError:
                self._release(n)
                raise
            except ResponseError as exc:
                self._release(n)
                if "NOGROUP" in str(exc):
                    await self._ensure_group(qs.keys)
                    continue
                log.exception("fetch from %s failed", qs.keys.queue)
                await asyncio.sleep(1.0)
                continue
            except TRANSIENT as exc:
                self._release(n)
                log.warning("fetch from %s failed (%s); reconnecting in %.2fs",
                            qs.keys.queue, exc, backoff)
                qs.own_cursor = "0"
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            self._release(n - len(entries))
            if entries:  # start in the background: the next read overlaps this round trip
                task = asyncio.create_task(self._start_batch(qs, entries, reclaimed))
                qs.starting.add(task)
                task.add_done_callback(qs.starting.discard)

    async def _start_batch(self, qs: _QState, entries: list[Any], reclaimed: bool) -> None:
        try:
            await self._start(qs, entries, reclaimed=reclaimed)
        except asyncio.CancelledError:
            self._release(len(entries))
            raise
        except TRANSIENT as exc:
            log.warning("start on %s failed (%s); entries stay pending", qs.keys.queue, exc)
            self._release(len(entries))
            qs.own_cursor = "0"
        except Exception:  # entries stay pending and are reclaimed later
            log.exception("start on %s failed", qs.keys.queue)
            self._release(len(entries))

    async def _read_own(self, qs: _QState, n: int) -> list[Any]:
        assert self._client is not None and qs.own_cursor is not None
        reply: Any = await self._client.xreadgroup(
            GROUP, self.consumer, {qs.keys.stream: qs.own_cursor}, count=n)
        raw: list[Any] = reply[0][1] if reply else []
        qs.own_cursor = raw[-1][0].decode() if raw else None
        return [e for e in raw if (qs.keys.queue, e[0].decode()) not in self._jobs]

    async def _reclaim(self, qs: _QState, n: int) -> list[Any]:
        """Take over up to n entries whose lease lapsed (XAUTOCLAIM; the cursor is kept)."""
        assert self._client is not None
        min_idle = int(self.config.visibility_timeout_s * 1000)
        reply: Any = await self._client.xautoclaim(
            qs.keys.stream, GROUP, self.consumer, min_idle, qs.cursor, count=n)
        qs.cursor = reply[0].decode()
        entries = [e for e in reply[1] if (qs.keys.queue, e[0].decode()) not in self._jobs]
        if entries:
            log.info("reclaiming %d lapsed entries of %s", len(entries), qs.keys.queue)
        return entries

    async def _start(self, qs: _QState, entries: list[Any], *, reclaimed: bool = False) -> None:
        """Start delivered entries (capacity for all of them is already reserved)."""
        assert self._client is not None
        k = qs.keys
        good: list[tuple[str, str]] = []
        bad: list[tuple[str, str]] = []
        ghosts: list[str] = []
        for entry_id, fields in entries:
            eid = entry_id.decode()
            if fields is None:
                ghosts.append(eid)
                continue
            raw = fields.get(b"id")
            try:
                good.append((eid, raw.decode()))
            except (AttributeError, UnicodeDecodeError):
                bad.append((eid, repr(fields)[:500]))
        if ghosts:
            await self._client.xack(k.stream, GROUP, *ghosts)
        skipped = len(bad) + len(ghosts)
        cfg = self.queue_config
        for i in range(0, max(len(good), 1), _BATCH):
            part = good[i:i + _BATCH]
            if not part and not bad:
                break
            keys = [k.stream, k.dead, k.stats, k.events, k.lease_seq]
            keys.extend(k.job(j) for _, j in part)
            args: list[Any] = [GROUP, self.consumer, cfg.events_maxlen, cfg.dead_ttl_s,
                               cfg.dead_maxlen, len(part)]
            for eid, jid in part:
                args += [eid, jid]
            args.append(len(bad))
            for eid, desc in bad:
                args += [eid, desc]
            bad = []
            reply = await SCRIPTS["start"].run_async(self._client, keys, args)
            launched = 0
            for n, (eid, jid) in enumerate(part):
                code, token, attempt, data, deadline, wait_ms, age_ms = reply[7 * n:7 * n + 7]
                if code != b"run":
                    skipped += 1
                    continue
                launched += 1
                self._launch(qs, eid, jid, str(token), int(attempt), data,
                             (int(deadline), int(wait_ms), int(age_ms)))
            if launched:
                self.stats.started += launched
                tel.STARTED.add(launched, qs.labels)
                if reclaimed:
                    self.stats.reclaimed += launched
                    tel.RECLAIMED.add(launched, qs.labels)
        self._release(skipped)

    def _launch(self, qs: _QState, entry: str, job_id: str, token: str, attempt: int,
                data: bytes, times: tuple[int, int, int]) -> None:
        lease = Lease(qs.keys, job_id, entry, token)
        self._leases.add(lease)
        task = asyncio.create_task(self._run_job(qs, lease, attempt, data, times))
        self._tasks.add(task)
        self._jobs[(qs.keys.queue, entry)] = task
        task.add_done_callback(self._tasks.discard)

    # ----------------------------------------------------------------- running

    async def _run_job(self, qs: _QState, lease: Lease, attempt: int, data: bytes,
                       times: tuple[int, int, int]) -> None:
        try:
            item = await self._attempt(qs, lease, attempt, data, times)
        except asyncio.CancelledError:  # worker stopping: hand the job back, untouched
            return
        except Exception as exc:  # a bug of ours: retry the job rather than lose the slot,
            log.exception("job %s: internal error", lease.job_id)  # but not forever
            data = self.queue_config.serde.dumps(error_info(exc))
            if attempt >= self.config.default_max_attempts:
                item = (lease.job_id, lease.entry, lease.token, "dead", data, "internal error",
                        type(exc).__name__)
            else:
                item = (lease.job_id, lease.entry, lease.token, "retry", data, 1000,
                        type(exc).__name__)
        qs.buf.append(item)
        qs.flush.set()
        self._handed_over()

    async def _attempt(self, qs: _QState, lease: Lease, attempt: int, data: bytes,
                       times: tuple[int, int, int]) -> Finish:
        deadline_ms, wait_ms, age_ms = times
        ident = (lease.job_id, lease.entry, lease.token)
        serde = self.queue_config.serde
        try:
            env = envelope_from_plain(serde.loads(data))
        except (SerializationError, RecursionError) as exc:
            return (*ident, "dead", serde.dumps(error_info(exc)), "malformed envelope",
                    "MalformedEnvelope")
        if env.id != lease.job_id:  # never hand a handler another job's id (idempotency key)
            err = {"type": "MalformedEnvelope", "message": f"the envelope names job {env.id!r}",
                   "traceback": ""}
            return (*ident, "dead", serde.dumps(err), "malformed envelope", "MalformedEnvelope")
        spec = self.registry.get(env.type, env.version)
        if spec is None:
            err = {"type": "UnknownJobType", "message": f"no handler for {env.type!r}"
                   f" version {env.version} on this worker", "traceback": ""}
            return (*ident, "dead", serde.dumps(err), "unknown job type", "UnknownJobType")
        max_attempts = env.max_attempts or spec.max_attempts or self.config.default_max_attempts
        if attempt > max_attempts:
            err = {"type": "AttemptsExhausted", "message": f"attempt {attempt} of"
                   f" {max_attempts}: the previous run's lease lapsed", "traceback": ""}
            return (*ident, "dead", serde.dumps(err), "attempts exhausted (lease lapsed)",
                    "LeaseExpired")
        job = Job(id=env.id, type=env.type, payload=env.payload, attempt=attempt,
                  max_attempts=max_attempts, queue=qs.keys.queue, version=env.version,
                  idempotency_key=env.idempotency_key or env.id, headers=env.headers,
                  trace=env.trace, deadline_ms=deadline_ms)
        span = tel.Attempt(qs.keys.queue, job.id, job.type, attempt, env.trace,
                           self.config.trace_parent)
        token = tel.JOB.set({"job_id": job.id, "job_type": job.type, "queue": job.queue,
                             "attempt": attempt, "trace_id": span.trace_id})
        started = time.perf_counter()
        exc_seen: BaseException | None = None
        item: Finish | None = None
        try:
            item = await self._call(spec, job, ident, env, attempt, max_attempts)
        except BaseException as exc:
            exc_seen = exc
            raise
        finally:
            tel.JOB.reset(token)
            ran_s = time.perf_counter() - started
            if item is not None:
                tel.QUEUE_WAIT.record(wait_ms / 1000, qs.labels)
                tel.DURATION.record(ran_s, qs.labels)
                tel.END_TO_END.record(age_ms / 1000 + ran_s, qs.labels)
                span.end(item[3], _last_exc.get(), str(item[5]) if item[3] != "ok" else "")
            else:
                span.end("interrupted", exc_seen, "worker stopping")
        return item

    async def _call(self, spec: HandlerSpec, job: Job, ident: tuple[str, str, str],
                    env: Envelope, attempt: int, max_attempts: int) -> Finish:
        serde = self.queue_config.serde
        timeout = spec.timeout_s or self.config.default_timeout_s
        limit = asyncio.timeout(timeout)
        _last_exc.set(None)
        try:
            if spec.is_async:  # without a limit: no Timeout context, no extra task
                coro = spec.fn(job)
                result = await (coro if timeout is None else bounded(coro, timeout))
            else:
                async with limit:
                    loop = asyncio.get_running_loop()
                    ctx = contextvars.copy_context()  # logs and spans see the job in threads
                    raised, result = await loop.run_in_executor(self._pool, ctx.run, capture,
                                                                spec.fn, job)
                if raised:
                    raise result
        except BaseException as exc:  # any handler failure is the job's, not ours
            task = asyncio.current_task()
            if isinstance(exc, asyncio.CancelledError) and (task is None or task.cancelling()):
                raise  # the worker is stopping: hand the job back (a handler's own is a failure)
            _last_exc.set(exc)
            if isinstance(exc, Fail):
                return (*ident, "dead", serde.dumps(error_info(exc)), exc.reason[:500], "Fail")
            if isinstance(exc, Retry):
                return self._retry_or_bury(ident, env, spec, attempt, max_attempts, exc,
                                           exc.delay_s)
            if timeout is not None and (isinstance(exc, Expired) or (
                    isinstance(exc, TimeoutError) and limit.expired())):
                ours = TimeoutError(f"handler timed out after {timeout:g} s")
                ours.__cause__ = None if isinstance(exc, Expired) else exc
                return self._retry_or_bury(ident, env, spec, attempt, max_attempts, ours, None)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                log.warning("handler of job %s raised %s; treated as a job failure",
                            job.id, type(exc).__name__)
            return self._retry_or_bury(ident, env, spec, attempt, max_attempts, exc, None)
        try:
            payload = serde.dumps(result)
        except Exception as exc:  # noqa: BLE001 - a custom serde may raise anything
            err = exc if isinstance(exc, SerializationError) else SerializationError(
                f"result not serialisable: {exc!r}")
            _last_exc.set(err)
            return (*ident, "dead", serde.dumps(error_info(err)), "result not serialisable",
                    "SerializationError")
        limit_bytes = self.queue_config.max_payload_bytes
        if len(payload) > limit_bytes:
            big = PayloadTooLarge(f"result is {len(payload)} bytes, over the queue's"
                                  f" max_payload_bytes of {limit_bytes}")
            _last_exc.set(big)
            return (*ident, "dead", serde.dumps(error_info(big)), "result too large",
                    "PayloadTooLarge")
        return (*ident, "ok", payload, 0, "")

    def _retry_or_bury(self, ident: tuple[str, str, str], env: Envelope, spec: HandlerSpec,
                       attempt: int, max_attempts: int, exc: BaseException,
                       delay_s: float | None) -> Finish:
        data = self.queue_config.serde.dumps(error_info(exc))
        etype = type(exc).__name__
        if attempt >= max_attempts:
            return (*ident, "dead", data, "attempts exhausted", etype)
        if delay_s is None:
            policy: RetryPolicy = spec.retry or self.config.retry
            delay_s = policy.delay_s(attempt)
        return (*ident, "retry", data, max(0, int(delay_s * 1000)), etype)
