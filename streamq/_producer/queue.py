"""Queue (blocking) and AsyncQueue (asyncio): the producer and query API of one queue."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import redis
import redis.asyncio as aredis

from .._core import cancel as _cancel
from .._core import durable
from .._core import queues as _queues
from .._core import search as _search
from .._core import shards as _shards
from .._core import telemetry as tel
from .._core.args import seconds
from .._core.config import QueueConfig
from .._core.conn import async_client, sync_client
from .._core.driver import adrive, drive
from .._core.errors import JobNotFound, ReplicationTimeout, ResultNotReady, WaitTimeout
from .._core.flow import DependencyResult, JobRef, results_page
from .._core.flow_cancel import cascade
from .._core.keys import check_job_id
from .._core.locate import locate
from .._core.model import TERMINAL, CancelResult, EnqueueResult, JobInfo
from .._core.retry import acall, call
from . import batches as _batches
from . import flows as _flows
from . import lookup as _lookup
from . import prepare as prod
from . import relayout, resend
from .autobatch import AsyncBatcher, ShardedAsync, ShardedSync, SyncBatcher
from .queue_base import Answer, _answered, _Base, _counted, _progressed, _shard
from .waiters import POLL_MAX_S, AsyncWaiters, SyncWaiters, Wake


class Queue(_Base):
    """A queue, used from blocking code. All methods are thread-safe (redis-py pool)."""

    def __init__(self, client: redis.Redis, name: str, config: QueueConfig | None = None) -> None:
        super().__init__(name, config)
        self.client = client
        self._waiters: SyncWaiters | None = None
        self._waiters_lock = threading.Lock()
        # one batcher per shard: a caller is answered by its own shard's call only
        self._batcher: SyncBatcher[prod.Prepared, Answer] | ShardedSync[prod.Prepared, Answer] = (
            SyncBatcher(self._enqueue_each) if self.config.shards == 1
            else ShardedSync(self._enqueue_each, _shard))

    def _drive_flow(self, op: Any) -> Any:
        """A workflow operation; with min_replicas, a barrier and WAIT after its last step
        (ReplicationTimeout names the jobs it wrote when the replicas fell short)."""
        try:
            out, acked = durable.drive_confirmed(self.client, op, self.config, self._barrier)
        except Exception as exc:
            lc = self._refused(exc)  # (a flow is not resent: some of its nodes may be written)
            self._adopt(call(lambda _r: drive(self.client, relayout.follow(self.keys,
                                                                           self.config))))
            raise lc from exc
        durable.confirm_ids(self.config, acked, *_flows.written(out))
        return out

    @classmethod
    def from_url(cls, url: str, name: str, config: QueueConfig | None = None,
                 **client_kwargs: Any) -> Queue:
        return cls(sync_client(url, **client_kwargs), name, config)

    def close(self) -> None:
        if self._waiters is not None:
            self._waiters.close()
        self.client.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _enqueue_each(self, prepared: list[prod.Prepared]) -> list[Answer]:
        """The auto-batcher's call: a ReplicationTimeout goes only to the callers whose job
        sat on a node whose replicas fell short. The enqueue metrics count the whole batch."""
        try:
            answers: list[Answer] = list(self._enqueue(prepared))
        except ReplicationTimeout as exc:
            answers = durable.split(exc, exc.results)
        return _counted(self.name, answers)

    def _enqueue(self, prepared: list[prod.Prepared]) -> list[EnqueueResult]:
        self._check()
        got = relayout.run(self._following(prepared), self._step, lambda need: resend.lone(
            self.client, self.keys, self.config, self._barrier, need))
        out = self._sent(got)
        self._note()
        return out

    def _step(self, step: list[Any]) -> list[Any]:
        return call(lambda _r: drive(self.client, relayout.one(step)))

    def _check(self) -> None:
        """Refuse (ShardCountMismatch) a queue stored with another shard count, or follow
        its stored layout (shards.check_layout); once."""
        if not self._shards_checked:
            self._adopt(call(lambda _retried: drive(self.client, _shards.check_layout(
                self.keys, self.config.shards))))
            if self.config.search is not None:
                call(lambda _retried: drive(self.client, _search.declare(self.keys,
                                                                         self.config)))
            self._shards_checked = True

    def _note(self) -> None:
        if not self._noted:  # after the first accepted enqueue: `streamq stats` shows the queue
            _queues.note_queue(self.client, self.keys)
            self._noted = True

    def _before(self, job_types: Sequence[Any]) -> None:
        if self._unknown_types(job_types):
            self._check_types(job_types, _queues.registered_types(self.client, self.keys))

    def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> EnqueueResult:
        """Enqueue one job now or later. Options: see ``docs/getting-started.md``;
        ``depends_on``: docs/workflows.md."""
        if self.config.require_handler:
            self._before((job_type,))
        if "depends_on" in options:
            self._check()
            res: EnqueueResult = call(lambda _r: self._drive_flow(_flows.enqueue_waiting(
                self.keys, self.config, job_type, payload, dict(options), self.layout)))
            self._note()
            return res
        if not tel.tracing():  # (no span: no context manager either)
            prepared = prod.prepare(self.keys, self.config, job_type, payload,
                                    trace=tel.carrier(), **options) if options else \
                prod.prepare_plain(self.keys, self.config, job_type, payload, tel.carrier())
            return prod.single(self.name, _answered(self._batcher.submit(prepared)))
        with tel.publish(self.name, 1, options.get("job_id")) as carrier:
            # concurrent calls from several threads gather into one script call
            return prod.single(self.name, _answered(self._batcher.submit(prod.prepare(
                self.keys, self.config, job_type, payload, trace=carrier, **options))))

    def enqueue_flow(self, flow: _flows.Flow, *, flow_id: str | None = None
                     ) -> _flows.FlowResult:
        """Enqueue a flow (``chain``, ``group``, ``chord`` of ``JobSpec``): every node's id in
        the result. The same ``flow_id`` again writes nothing new (docs/workflows.md)."""
        self._check()
        fid = prod.new_job_id() if flow_id is None else check_job_id(flow_id)
        out: _flows.FlowResult = call(lambda _r: self._drive_flow(_flows.enqueue_flow(
            self.keys, self.config, flow, fid, self.layout)))
        self._note()
        return out

    def add_children(self, job_id: str, children: Sequence[_flows.JobSpec], *,
                     policy: str = "fail") -> list[JobRef]:
        """From the handler of running job ``job_id``: enqueue ``children`` (JobSpec) as its
        dependencies; ``raise WaitForChildren()`` then waits for them (docs/workflows.md)."""
        cid = prod.new_job_id()[:12]  # (one per call: a retried call repeats it)
        self._check()
        return call(lambda _r: self._drive_flow(_flows.add_children(
            self.keys, self.config, check_job_id(job_id), children, policy, cid, self.layout)))

    def batch(self, *, on_success: _flows.JobSpec | None = None,
              on_complete: _flows.JobSpec | None = None, on_death: _flows.JobSpec | None = None,
              batch_id: str | None = None) -> _batches.Batch:
        """Open a batch with callbacks (docs/workflows.md#batches-with-callbacks); the same
        ``batch_id`` again opens nothing new."""
        return _batches.Batch.open(self, batch_id, on_success, on_complete, on_death)

    def batch_ref(self, batch_id: str) -> _batches.Batch:
        """An open batch by id (from one of its jobs: ``job.batch_id``), to ``add`` to."""
        return _batches.Batch(self, check_job_id(batch_id))

    def dependency_results(self, job_id: str, *, cursor: int = 0, count: int = 1000
                           ) -> tuple[int, list[DependencyResult]]:
        """One page of a job's dependency results: (next cursor, 0 at the end; results)."""
        self._check()
        k = call(lambda _r: drive(self.client, locate(self.keys, self.layout,
                                                      check_job_id(job_id))))
        return call(lambda _r: drive(self.client, results_page(
            k, job_id, self.config.serde, cursor, count)))

    def enqueue_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[EnqueueResult]:
        """Enqueue many jobs in pipelined batches; each dict takes enqueue's argument names.

        A job the queue has no room for comes back with status 'rejected' (no exception),
        so one full queue never hides which jobs were accepted. When the calls of some shards
        fail (their node down, or the call refused) while others are answered, raises
        PartialEnqueueError with every job's outcome (status 'error' for the failed ones).
        """
        jobs = list(jobs)
        self._before([j.get("type") for j in jobs if isinstance(j, Mapping)])
        with tel.publish(self.name, len(jobs), None) as carrier:
            return prod.count(self.name, self._enqueue_many(
                prod.prepare_many(self.keys, self.config, jobs, carrier)))

    def _enqueue_many(self, prepared: list[prod.Prepared]) -> list[EnqueueResult]:
        self._check()
        jobs, batches, outcomes, layout = relayout.run(
            self._following(prepared), self._step,
            lambda need: resend.many(self.client, self.keys, self.config, self._barrier, need))
        self._adopt(layout)
        if any(not isinstance(o, Exception) for o in outcomes):
            self._note()
        return prod.answered_many(self.name, self.config, jobs, batches, outcomes)

    def get(self, job_id: str) -> JobInfo | None:
        """The job's record, or None when there is none (never enqueued, or expired)."""
        check_job_id(job_id)
        self._check()
        h, lay = _lookup.record(self.client, self.keys, self.layout, job_id)
        if lay is not self.layout:  # (a reshard since: found under the newer layout)
            self._adopt(lay)
        return prod.to_info(self.keys, self.config, job_id, h) if h else None

    def _info(self, job_id: str) -> JobInfo:
        info = self.get(job_id)
        if info is None:
            raise JobNotFound(f"job {job_id!r} not found in queue {self.name!r}")
        return info

    def result(self, job_id: str, *, timeout: float | None = None) -> Any:
        """The result of a completed job; raises JobFailed, ResultNotReady or JobNotFound.

        With ``timeout`` (seconds), waits that long for the job to finish (WaitTimeout).
        """
        info = self._info(job_id)
        if timeout is None or info.finished:
            return prod.outcome(info)
        return self._wait(job_id, timeout, None)

    def cancel(self, job_id: str, *, wait_s: float | None = None) -> CancelResult:
        """Cancel a job. A waiting, scheduled, queued or retrying one is cancelled at once. A
        running one's worker is told (within a second) and stops it: ``code='cancel_requested'``;
        with ``wait_s`` the call waits (at most that long) until it settles and says how
        (``cancelled``, or ``final_state='completed'`` when it finished first)."""
        self._check()
        _cancel.check_cancel_wait(wait_s)
        res, k, lay = _lookup.cancel(self.client, self.keys, self.config, self.layout, job_id)
        if lay is not self.layout:
            self._adopt(lay)
        if res.cancelled:  # its unstarted dependencies no other job waits for (flow_cancel)
            call(lambda _r: drive(self.client, cascade(k, self.config, job_id,
                                                       {self.name: self.layout})))

        def state() -> str:
            info = self.get(job_id)
            return info.state if info is not None else ""

        return _cancel.wait_cancel(res, wait_s, state)

    def enqueue_and_wait(self, job_type: str, payload: Any = None, *, timeout: float,
                         on_progress: Callable[[Any], None] | None = None,
                         **options: Any) -> Any:
        """Enqueue, then wait for the result; raises JobFailed or WaitTimeout (job goes on).
        ``on_progress(value)`` is called with each new ``job.progress(...)`` value seen.
        Every waiter of this queue object shares one subscriber connection."""
        seconds("timeout", timeout, allow_zero=False)
        prod.check_waitable(options)
        job_id = options.pop("job_id", None) or prod.new_job_id()
        waiters = self._started_waiters()
        event = waiters.register(job_id)
        try:
            if options or tel.tracing() or self.config.require_handler:
                r = self.enqueue(job_type, payload, job_id=job_id, notify=waiters.channel,
                                 **options)
            else:  # enqueue's common case, without its option checks (a lone call's latency)
                r = prod.single(self.name, _answered(self._batcher.submit(prod.prepare_plain(
                    self.keys, self.config, job_type, payload, tel.carrier(),
                    check_job_id(job_id), waiters.channel))))
            if r.status == "duplicate" and r.state in TERMINAL:
                return prod.outcome(self._info(job_id))
            return self._wait(job_id, timeout, (waiters, event), on_progress)
        finally:
            waiters.unregister(job_id, event)

    def _started_waiters(self) -> SyncWaiters:
        with self._waiters_lock:
            if self._waiters is None:
                self._waiters = SyncWaiters(self.client, self.keys)
        self._waiters.start()
        return self._waiters

    def _wait(self, job_id: str, timeout: float, waiter: tuple[SyncWaiters, Wake] | None,
              on_progress: Callable[[Any], None] | None = None) -> Any:
        end = time.monotonic() + timeout
        poll = 0.01
        seen: list[Any] = [None]
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(job_id, timeout)
            if waiter is not None:  # a message from the shared subscriber, or a poll at the
                waiters, event = waiter  # latest
                waiters.wait(event, min(remaining, POLL_MAX_S))
                raw = waiters.take_inline(job_id)
                if raw is not None:  # completed, its result in the message
                    return prod.inline_result(raw, self.config.serde)
                event.fired = False  # the record tells what came; a later message wakes again
            else:
                time.sleep(min(remaining, poll))
                poll = min(poll * 2, POLL_MAX_S)
            info = self._info(job_id)
            try:
                return prod.outcome(info)
            except ResultNotReady:
                _progressed(info, seen, on_progress)
                continue


class AsyncQueue(_Base):
    """A queue, used from asyncio code. Same methods as Queue, awaitable."""

    def __init__(self, client: aredis.Redis, name: str, config: QueueConfig | None = None) -> None:
        super().__init__(name, config)
        self.client = client
        self._waiters: AsyncWaiters | None = None
        self._batcher: (AsyncBatcher[prod.Prepared, Answer]
                        | ShardedAsync[prod.Prepared, Answer]) = (
            AsyncBatcher(self._enqueue_each) if self.config.shards == 1
            else ShardedAsync(self._enqueue_each, _shard))

    async def _drive_flow(self, op: Any) -> Any:
        """See ``Queue._drive_flow``."""
        try:
            out, acked = await durable.adrive_confirmed(self.client, op, self.config,
                                                        self._barrier)
        except Exception as exc:
            lc = self._refused(exc)  # (as Queue._drive_flow)
            self._adopt(await acall(lambda _r: adrive(self.client, relayout.follow(
                self.keys, self.config))))
            raise lc from exc
        durable.confirm_ids(self.config, acked, *_flows.written(out))
        return out

    @classmethod
    def from_url(cls, url: str, name: str, config: QueueConfig | None = None,
                 **client_kwargs: Any) -> AsyncQueue:
        return cls(async_client(url, **client_kwargs), name, config)

    async def close(self) -> None:
        if self._waiters is not None:
            await self._waiters.close()
        await self.client.aclose()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _enqueue_each(self, prepared: list[prod.Prepared]) -> list[Answer]:
        try:
            answers: list[Answer] = list(await self._enqueue(prepared))
        except ReplicationTimeout as exc:
            answers = durable.split(exc, exc.results)
        return _counted(self.name, answers)

    async def _enqueue(self, prepared: list[prod.Prepared]) -> list[EnqueueResult]:
        await self._check()
        got = await relayout.arun(self._following(prepared), self._step, lambda need: (
            resend.alone(self.client, self.keys, self.config, self._barrier, need)))
        out = self._sent(got)
        await self._note()
        return out

    async def _step(self, step: list[Any]) -> list[Any]:
        return await acall(lambda _r: adrive(self.client, relayout.one(step)))

    async def _check(self) -> None:
        if not self._shards_checked:
            self._adopt(await acall(lambda _retried: adrive(self.client, _shards.check_layout(
                self.keys, self.config.shards))))
            if self.config.search is not None:
                await acall(lambda _retried: adrive(self.client, _search.declare(
                    self.keys, self.config)))
            self._shards_checked = True

    async def _note(self) -> None:
        if not self._noted:
            await _queues.anote_queue(self.client, self.keys)
            self._noted = True

    async def _before(self, job_types: Sequence[Any]) -> None:
        if self._unknown_types(job_types):
            self._check_types(job_types, await _queues.aregistered_types(self.client, self.keys))

    async def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> EnqueueResult:
        if self.config.require_handler:
            await self._before((job_type,))
        if "depends_on" in options:
            await self._check()
            r: EnqueueResult = await acall(lambda _r: self._drive_flow(_flows.enqueue_waiting(
                self.keys, self.config, job_type, payload, dict(options), self.layout)))
            await self._note()
            return r
        if not tel.tracing():  # (no span: no context manager either)
            prepared = prod.prepare(self.keys, self.config, job_type, payload,
                                    trace=tel.carrier(), **options) if options else \
                prod.prepare_plain(self.keys, self.config, job_type, payload, tel.carrier())
            return prod.single(self.name, _answered(await self._batcher.submit(prepared)))
        with tel.publish(self.name, 1, options.get("job_id")) as carrier:
            # concurrent calls from several coroutines gather into one script call
            return prod.single(self.name, _answered(await self._batcher.submit(prod.prepare(
                self.keys, self.config, job_type, payload, trace=carrier, **options))))

    async def enqueue_flow(self, flow: _flows.Flow, *, flow_id: str | None = None
                           ) -> _flows.FlowResult:
        """Enqueue a flow: see ``Queue.enqueue_flow``."""
        await self._check()
        fid = prod.new_job_id() if flow_id is None else check_job_id(flow_id)
        r: _flows.FlowResult = await acall(lambda _r: self._drive_flow(_flows.enqueue_flow(
            self.keys, self.config, flow, fid, self.layout)))
        await self._note()
        return r

    async def add_children(self, job_id: str, children: Sequence[_flows.JobSpec], *,
                           policy: str = "fail") -> list[JobRef]:
        """See ``Queue.add_children``."""
        cid = prod.new_job_id()[:12]
        await self._check()
        return await acall(lambda _r: self._drive_flow(_flows.add_children(
            self.keys, self.config, check_job_id(job_id), children, policy, cid, self.layout)))

    async def batch(self, *, on_success: _flows.JobSpec | None = None,
                    on_complete: _flows.JobSpec | None = None,
                    on_death: _flows.JobSpec | None = None,
                    batch_id: str | None = None) -> _batches.AsyncBatch:
        """See ``Queue.batch``."""
        return await _batches.AsyncBatch.open(self, batch_id, on_success, on_complete, on_death)

    def batch_ref(self, batch_id: str) -> _batches.AsyncBatch:
        """See ``Queue.batch_ref``."""
        return _batches.AsyncBatch(self, check_job_id(batch_id))

    async def dependency_results(self, job_id: str, *, cursor: int = 0, count: int = 1000
                                 ) -> tuple[int, list[DependencyResult]]:
        """One page of a job's dependency results: see ``Queue.dependency_results``."""
        await self._check()
        k = await acall(lambda _r: adrive(self.client, locate(self.keys, self.layout,
                                                              check_job_id(job_id))))
        return await acall(lambda _r: adrive(self.client, results_page(
            k, job_id, self.config.serde, cursor, count)))

    async def enqueue_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[EnqueueResult]:
        jobs = list(jobs)
        await self._before([j.get("type") for j in jobs if isinstance(j, Mapping)])
        with tel.publish(self.name, len(jobs), None) as carrier:
            return prod.count(self.name, await self._enqueue_many(
                prod.prepare_many(self.keys, self.config, jobs, carrier)))

    async def _enqueue_many(self, prepared: list[prod.Prepared]) -> list[EnqueueResult]:
        await self._check()
        jobs, batches, outcomes, layout = await relayout.arun(
            self._following(prepared), self._step,
            lambda need: resend.amany(self.client, self.keys, self.config, self._barrier, need))
        self._adopt(layout)
        if any(not isinstance(o, Exception) for o in outcomes):
            await self._note()
        return prod.answered_many(self.name, self.config, jobs, batches, outcomes)

    async def get(self, job_id: str) -> JobInfo | None:
        check_job_id(job_id)
        await self._check()
        h, lay = await _lookup.arecord(self.client, self.keys, self.layout, job_id)
        if lay is not self.layout:  # (as Queue.get)
            self._adopt(lay)
        return prod.to_info(self.keys, self.config, job_id, h) if h else None

    async def _info(self, job_id: str) -> JobInfo:
        info = await self.get(job_id)
        if info is None:
            raise JobNotFound(f"job {job_id!r} not found in queue {self.name!r}")
        return info

    async def result(self, job_id: str, *, timeout: float | None = None) -> Any:
        info = await self._info(job_id)
        if timeout is None or info.finished:
            return prod.outcome(info)
        return await self._wait(job_id, timeout, None)

    async def cancel(self, job_id: str, *, wait_s: float | None = None) -> CancelResult:
        """Cancel a job (see ``Queue.cancel``)."""
        await self._check()
        _cancel.check_cancel_wait(wait_s)

        async def state() -> str:
            info = await self.get(job_id)
            return info.state if info is not None else ""

        res, k, lay = await _lookup.acancel(self.client, self.keys, self.config, self.layout,
                                            job_id)
        if lay is not self.layout:
            self._adopt(lay)
        if res.cancelled:  # (as Queue.cancel)
            await acall(lambda _r: adrive(self.client, cascade(k, self.config, job_id,
                                                               {self.name: self.layout})))
        return await _cancel.await_cancel(res, wait_s, state)

    async def enqueue_and_wait(self, job_type: str, payload: Any = None, *, timeout: float,
                               on_progress: Callable[[Any], None] | None = None,
                               **options: Any) -> Any:
        seconds("timeout", timeout, allow_zero=False)
        prod.check_waitable(options)
        job_id = options.pop("job_id", None) or prod.new_job_id()
        if self._waiters is None:
            self._waiters = AsyncWaiters(self.client, self.keys)
        waiters = self._waiters
        await waiters.start()
        event = waiters.register(job_id)
        try:
            if options or tel.tracing() or self.config.require_handler:
                r = await self.enqueue(job_type, payload, job_id=job_id,
                                       notify=waiters.channel, **options)
            else:  # enqueue's common case, without its option checks (a lone call's latency)
                r = prod.single(self.name, _answered(await self._batcher.submit(
                    prod.prepare_plain(self.keys, self.config, job_type, payload,
                                       tel.carrier(), check_job_id(job_id), waiters.channel))))
            if r.status == "duplicate" and r.state in TERMINAL:
                return prod.outcome(await self._info(job_id))
            return await self._wait(job_id, timeout, event, on_progress, waiters.inline)
        finally:
            waiters.unregister(job_id, event)

    async def _wait(self, job_id: str, timeout: float, event: asyncio.Event | None,
                    on_progress: Callable[[Any], None] | None = None,
                    inline: dict[str, bytes] | None = None) -> Any:
        end = time.monotonic() + timeout
        poll = 0.01
        seen: list[Any] = [None]
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(job_id, timeout)
            if event is not None:  # woken by the shared subscriber, or a poll at the latest
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), min(remaining, POLL_MAX_S))
                event.clear()
                raw = inline.get(job_id) if inline is not None else None
                if raw is not None:  # completed, its result in the message
                    return prod.inline_result(raw, self.config.serde)
            else:
                await asyncio.sleep(min(remaining, poll))
                poll = min(poll * 2, POLL_MAX_S)
            info = await self._info(job_id)
            try:
                return prod.outcome(info)
            except ResultNotReady:
                _progressed(info, seen, on_progress)
                continue
