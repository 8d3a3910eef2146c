"""Calling a handler: sync ones in a pool thread, async ones in a task of their own with a
timeout; exceptions come back as values, and a handler that ignores its cancellation is
abandoned (the job times out anyway)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import logging
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._core.model import Job


class Expired(Exception):
    """An async handler outlived its timeout (it is abandoned, the job is not)."""


_ABANDONED: set[asyncio.Task[Any]] = set()
"""Handlers that ignored the cancellation at their timeout: kept referenced until they end."""


def capture(fn: Any, job: Job) -> tuple[bool, Any]:
    """Run a sync handler (in a pool thread), handing any exception back as a value: a
    GeneratorExit or CancelledError thrown into the awaiting coroutine would escape it."""
    try:
        return False, fn(job)
    except BaseException as exc:  # noqa: BLE001 - the job's failure, judged on the loop
        return True, exc


async def guarded(coro: Any) -> tuple[bool, Any]:
    """Await an async handler in a task of its own, handing its exceptions back as values
    (SystemExit must not reach the Task machinery, which re-raises it into the loop)."""
    try:
        return False, await coro
    except asyncio.CancelledError as exc:
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            raise  # cancelled by bounded() (timeout or worker stop)
        return True, exc
    except BaseException as exc:  # noqa: BLE001
        return True, exc


def retrieve(task: asyncio.Task[Any]) -> None:
    _ABANDONED.discard(task)
    if not task.cancelled():
        task.exception()


def error_info(exc: BaseException) -> dict[str, str]:
    tb = "".join(traceback.format_exception(exc, limit=8))
    return {"type": type(exc).__name__, "message": str(exc)[:2000], "traceback": tb[-4000:]}


async def bounded(coro: Any, timeout: float) -> Any:
    """Await an async handler at most ``timeout`` seconds. One that ignores the
    cancellation is abandoned (left to end on its own) and the job times out anyway."""
    inner = asyncio.ensure_future(guarded(coro))
    try:
        done, _ = await asyncio.wait({inner}, timeout=timeout)
    except asyncio.CancelledError:
        inner.cancel()
        _ABANDONED.add(inner)
        inner.add_done_callback(retrieve)
        raise
    if not done:
        inner.cancel()
        _ABANDONED.add(inner)
        inner.add_done_callback(retrieve)
        raise Expired()
    raised, value = inner.result()
    if raised:
        raise value
    return value


class SyncRunner:
    """Runs sync handlers in a thread pool; a handler's timeout counts from the moment its
    thread starts it, never while it waits for a thread.

    A thread cannot be interrupted: a sync handler that outlives its timeout is abandoned (the
    job times out and its slot is freed) and keeps its thread until it returns. The pool holds
    ``threads`` threads for live handlers plus ``max_abandoned`` for abandoned ones, so hung
    handlers do not starve the jobs after them; past that bound new sync jobs wait for a
    thread (their timeout not yet running, their lease renewed) and a warning names the stuck
    jobs. ``stuck()`` lists the abandoned handlers still running (a gauge)."""

    def __init__(self, threads: int, max_abandoned: int, log: logging.Logger) -> None:
        self._pool = ThreadPoolExecutor(threads + max_abandoned,
                                        thread_name_prefix="streamq-job")
        self._max_abandoned = max_abandoned
        self._log = log
        self._lock = threading.Lock()
        self._abandoned: dict[int, tuple[str, float]] = {}
        self._warned = 0.0

    def stuck(self) -> list[tuple[str, float]]:
        """(job id, seconds since it was abandoned) of abandoned handlers still running."""
        now = time.monotonic()
        with self._lock:
            return [(jid, now - t) for jid, t in self._abandoned.values()]

    async def run(self, fn: Any, job: Job, timeout_s: float | None) -> Any:
        loop = asyncio.get_running_loop()
        began: asyncio.Future[None] = loop.create_future()

        def mark() -> None:
            if not began.done():
                began.set_result(None)

        def body() -> tuple[bool, Any]:
            loop.call_soon_threadsafe(mark)
            return capture(fn, job)

        ctx = contextvars.copy_context()  # logs and spans see the job in the thread
        cfut = self._pool.submit(ctx.run, body)
        waiting = not began.done()
        if waiting and self._full():
            self._warn_full()
        try:
            await began
        except asyncio.CancelledError:
            cfut.cancel()
            raise
        fut = asyncio.wrap_future(cfut)
        if timeout_s is None:
            raised, result = await fut
        else:
            try:
                raised, result = await asyncio.wait_for(asyncio.shield(fut), timeout_s)
            except TimeoutError:
                self._abandon(cfut, job.id)
                raise Expired() from None
        if raised:
            raise result
        return result

    def _full(self) -> bool:
        with self._lock:
            return len(self._abandoned) >= self._max_abandoned

    def _warn_full(self) -> None:
        now = time.monotonic()
        if now - self._warned < 30:
            return
        self._warned = now
        stuck = ", ".join(f"{j} ({s:.0f} s)" for j, s in self.stuck()[:10])
        self._log.warning("%d sync handlers outlived their timeout and still hold their threads"
                          " (the bound is %d): new sync jobs wait for a thread. Stuck: %s",
                          len(self.stuck()), self._max_abandoned, stuck)

    def _abandon(self, cfut: concurrent.futures.Future[Any], job_id: str) -> None:
        key = id(cfut)
        with self._lock:
            self._abandoned[key] = (job_id, time.monotonic())
            n = len(self._abandoned)
        self._log.warning("sync handler of job %s outlived its timeout; its thread is"
                          " abandoned until it returns (%d abandoned)", job_id, n)

        def done(_f: concurrent.futures.Future[Any]) -> None:
            with self._lock:
                since = self._abandoned.pop(key, (job_id, time.monotonic()))[1]
            self._log.info("abandoned sync handler of job %s returned after %.1f s more",
                           job_id, time.monotonic() - since)

        cfut.add_done_callback(done)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
