"""Calling a handler: sync ones in a pool thread, async ones in a task of their own with a
timeout; exceptions come back as values, and a handler that ignores its cancellation is
abandoned (the job times out anyway)."""

from __future__ import annotations

import asyncio
import traceback
from typing import Any

from ._model import Job


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
