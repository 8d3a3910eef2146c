"""Queue (blocking) and AsyncQueue (asyncio): the producer and query API of one queue."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

import redis
import redis.asyncio as aredis

from . import _producer as prod
from . import _telemetry as tel
from ._config import QueueConfig
from ._conn import async_client, sync_client
from ._errors import JobNotFound, ResultNotReady, WaitTimeout
from ._keys import Keys, check_job_id
from ._model import TERMINAL, CancelResult, EnqueueResult, JobInfo
from ._retry import acall, call
from ._scripts import SCRIPTS

_POLL_MAX_S = 0.5


class _Base:
    def __init__(self, name: str, config: QueueConfig | None = None) -> None:
        self.config = config or QueueConfig()
        self.keys = Keys(name, self.config.key_prefix)
        self.name = name


class Queue(_Base):
    """A queue, used from blocking code. All methods are thread-safe (redis-py pool)."""

    def __init__(self, client: redis.Redis, name: str, config: QueueConfig | None = None) -> None:
        super().__init__(name, config)
        self.client = client

    @classmethod
    def from_url(cls, url: str, name: str, config: QueueConfig | None = None,
                 **client_kwargs: Any) -> Queue:
        return cls(sync_client(url, **client_kwargs), name, config)

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Queue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _enqueue(self, prepared: list[prod.Prepared]) -> list[EnqueueResult]:
        out: list[EnqueueResult] = []
        for batch in prod.chunks(prepared):
            keys, args = prod.enqueue_call(self.keys, self.config, batch)

            def once(retried: bool, b: Any = batch, k: Any = keys, a: Any = args) -> Any:
                reply = SCRIPTS["enqueue"](self.client, k, a)
                return prod.parse_enqueue(self.config, b, reply, retried=retried)

            out.extend(call(once))
        return out

    def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> EnqueueResult:
        """Enqueue one job now or later. Options: see ``docs/getting-started.md``."""
        with tel.publish(self.name, 1, options.get("job_id")) as carrier:
            return prod.single(self.name, self._enqueue([prod.prepare(
                self.keys, self.config, job_type, payload, trace=carrier, **options)]))

    def enqueue_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[EnqueueResult]:
        """Enqueue many jobs in pipelined batches; each dict takes enqueue's argument names.

        A job the queue has no room for comes back with status 'rejected' (no exception),
        so one full queue never hides which jobs were accepted.
        """
        jobs = list(jobs)
        with tel.publish(self.name, len(jobs), None) as carrier:
            return prod.count(self.name, self._enqueue_many(
                prod.prepare_many(self.keys, self.config, jobs, carrier)))

    def _enqueue_many(self, prepared: list[prod.Prepared]) -> list[EnqueueResult]:
        batches = prod.chunks(prepared)
        calls = [prod.enqueue_call(self.keys, self.config, b) for b in batches]

        def once(retried: bool) -> list[EnqueueResult]:
            replies = SCRIPTS["enqueue"].run_many(self.client, calls)
            out: list[EnqueueResult] = []
            for b, reply in zip(batches, replies, strict=True):
                out.extend(prod.parse_enqueue(self.config, b, reply, retried=retried))
            return out

        return call(once)

    def get(self, job_id: str) -> JobInfo | None:
        """The job's record, or None when there is none (never enqueued, or expired)."""
        check_job_id(job_id)
        try:
            h: Any = call(lambda _retried: self.client.hgetall(self.keys.job(job_id)))
        except redis.exceptions.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            return None  # the key holds something else than a job record
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

    def cancel(self, job_id: str) -> CancelResult:
        keys, args = prod.cancel_call(self.keys, self.config, job_id)
        return call(lambda retried: prod.parse_cancel(
            job_id, SCRIPTS["cancel"](self.client, keys, args), retried=retried))

    def enqueue_and_wait(self, job_type: str, payload: Any = None, *, timeout: float,
                         **options: Any) -> Any:
        """Enqueue, then wait for the result; raises JobFailed or WaitTimeout (job goes on)."""
        prod._seconds("timeout", timeout, allow_zero=False)
        job_id = options.pop("job_id", None) or prod.new_job_id()
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            channel = self.keys.done_channel(job_id)
            pubsub.subscribe(channel)
            r = self.enqueue(job_type, payload, job_id=job_id, notify=channel, **options)
            if r.status == "duplicate" and r.state in TERMINAL:
                return prod.outcome(self._info(job_id))
            return self._wait(job_id, timeout, pubsub)
        finally:
            pubsub.close()

    def _wait(self, job_id: str, timeout: float, pubsub: Any) -> Any:
        end = time.monotonic() + timeout
        poll = 0.01
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(job_id, timeout)
            if pubsub is not None:
                pubsub.get_message(timeout=min(remaining, _POLL_MAX_S))
            else:
                time.sleep(min(remaining, poll))
                poll = min(poll * 2, _POLL_MAX_S)
            try:
                return prod.outcome(self._info(job_id))
            except ResultNotReady:
                continue


class AsyncQueue(_Base):
    """A queue, used from asyncio code. Same methods as Queue, awaitable."""

    def __init__(self, client: aredis.Redis, name: str, config: QueueConfig | None = None) -> None:
        super().__init__(name, config)
        self.client = client

    @classmethod
    def from_url(cls, url: str, name: str, config: QueueConfig | None = None,
                 **client_kwargs: Any) -> AsyncQueue:
        return cls(async_client(url, **client_kwargs), name, config)

    async def close(self) -> None:
        await self.client.aclose()

    async def __aenter__(self) -> AsyncQueue:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _enqueue(self, prepared: list[prod.Prepared]) -> list[EnqueueResult]:
        out: list[EnqueueResult] = []
        for batch in prod.chunks(prepared):
            keys, args = prod.enqueue_call(self.keys, self.config, batch)

            async def once(retried: bool, b: Any = batch, k: Any = keys, a: Any = args) -> Any:
                reply = await SCRIPTS["enqueue"].run_async(self.client, k, a)
                return prod.parse_enqueue(self.config, b, reply, retried=retried)

            out.extend(await acall(once))
        return out

    async def enqueue(self, job_type: str, payload: Any = None, **options: Any) -> EnqueueResult:
        with tel.publish(self.name, 1, options.get("job_id")) as carrier:
            return prod.single(self.name, await self._enqueue(
                [prod.prepare(self.keys, self.config, job_type, payload, trace=carrier,
                              **options)]))

    async def enqueue_many(self, jobs: Iterable[Mapping[str, Any]]) -> list[EnqueueResult]:
        jobs = list(jobs)
        with tel.publish(self.name, len(jobs), None) as carrier:
            return prod.count(self.name, await self._enqueue_many(
                prod.prepare_many(self.keys, self.config, jobs, carrier)))

    async def _enqueue_many(self, prepared: list[prod.Prepared]) -> list[EnqueueResult]:
        batches = prod.chunks(prepared)
        calls = [prod.enqueue_call(self.keys, self.config, b) for b in batches]

        async def once(retried: bool) -> list[EnqueueResult]:
            replies = await SCRIPTS["enqueue"].run_many_async(self.client, calls)
            out: list[EnqueueResult] = []
            for b, reply in zip(batches, replies, strict=True):
                out.extend(prod.parse_enqueue(self.config, b, reply, retried=retried))
            return out

        return await acall(once)

    async def get(self, job_id: str) -> JobInfo | None:
        check_job_id(job_id)

        async def once(_retried: bool) -> Any:
            return await self.client.hgetall(self.keys.job(job_id))

        try:
            h = await acall(once)
        except redis.exceptions.ResponseError as exc:
            if "WRONGTYPE" not in str(exc):
                raise
            return None  # the key holds something else than a job record
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

    async def cancel(self, job_id: str) -> CancelResult:
        keys, args = prod.cancel_call(self.keys, self.config, job_id)

        async def once(retried: bool) -> CancelResult:
            reply = await SCRIPTS["cancel"].run_async(self.client, keys, args)
            return prod.parse_cancel(job_id, reply, retried=retried)

        return await acall(once)

    async def enqueue_and_wait(self, job_type: str, payload: Any = None, *, timeout: float,
                               **options: Any) -> Any:
        prod._seconds("timeout", timeout, allow_zero=False)
        job_id = options.pop("job_id", None) or prod.new_job_id()
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        try:
            channel = self.keys.done_channel(job_id)
            await pubsub.subscribe(channel)
            r = await self.enqueue(job_type, payload, job_id=job_id, notify=channel, **options)
            if r.status == "duplicate" and r.state in TERMINAL:
                return prod.outcome(await self._info(job_id))
            return await self._wait(job_id, timeout, pubsub)
        finally:
            await pubsub.aclose()  # type: ignore[no-untyped-call]

    async def _wait(self, job_id: str, timeout: float, pubsub: Any) -> Any:
        import asyncio

        end = time.monotonic() + timeout
        poll = 0.01
        while True:
            remaining = end - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(job_id, timeout)
            if pubsub is not None:
                await pubsub.get_message(timeout=min(remaining, _POLL_MAX_S))
            else:
                await asyncio.sleep(min(remaining, poll))
                poll = min(poll * 2, _POLL_MAX_S)
            try:
                return prod.outcome(await self._info(job_id))
            except ResultNotReady:
                continue
