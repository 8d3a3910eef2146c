"""Eager start of jobs: a job's first step runs at once in the fetch step, with no task of its
own unless it has to wait (Python 3.11 has no ``eager_task_factory``).

A job that ends without waiting for anything (a no-op or CPU-only handler) never costs an
asyncio Task: no task object, no scheduled first step, no entry in the loop's task registry.
A job that waits keeps running where it waits, in a task that is already the current task
while its first step runs, so ``asyncio.current_task()`` inside a handler is always the job's
own task: an ``asyncio.timeout``, a ``TaskGroup`` or an anyio cancel scope entered before the
first ``await`` binds to the job, never to the worker's fetch loop.

That task is a *carrier*: a real Task made ahead of the job it will carry, parked on a future
of its own. The first step of each job runs inside ``ctx.run`` (a copy of the context, as a
Task would take) with the carrier entered as the loop's current task. Then:

- the job ended (StopIteration): nothing more; the carrier waits for the next job;
- the job waits on a future: the carrier *adopts* it (wakes, and from then on yields what the
  job waits for and sends or throws into the job what the loop hands back, each step inside
  the job's context); a new carrier is made for the next job.

A cancel of the carrier during the job's first step (the job cancelling its own task, or a
timeout that fires later) reaches the job where it waits, as it would in a task of its own;
a carrier cancelled by a job that then ended without waiting is dropped for a fresh one.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
from collections.abc import Callable, Coroutine, Generator
from typing import Any


def _missing(loop: asyncio.AbstractEventLoop, task: asyncio.Task[Any]) -> None:
    raise RuntimeError("asyncio has no _enter_task/_leave_task here")  # (AVAILABLE is False)


enter_task: Callable[[asyncio.AbstractEventLoop, asyncio.Task[Any]], None] = getattr(
    asyncio.tasks, "_enter_task", _missing)
"""Make a task the loop's current task (none may be current)."""
leave_task: Callable[[asyncio.AbstractEventLoop, asyncio.Task[Any]], None] = getattr(
    asyncio.tasks, "_leave_task", _missing)
"""The loop's current task is current no longer."""
AVAILABLE = enter_task is not _missing and leave_task is not _missing
"""The interpreter lets a task be entered as the current one (CPython 3.11-3.13 do)."""

_DONE: Any = object()


class _Carry(collections.abc.Coroutine[Any, None, None]):
    """The carrier's coroutine: waits on ``slot`` until it adopts a job, then drives it."""

    __slots__ = ("_coro", "_ctx", "_first", "_slot", "_started")

    def __init__(self, slot: asyncio.Future[None]) -> None:
        self._slot = slot
        self._coro: Coroutine[Any, Any, Any] | None = None
        self._ctx: contextvars.Context | None = None
        self._first: Any = _DONE
        self._started = False

    def adopt(self, coro: Coroutine[Any, Any, Any], ctx: contextvars.Context,
              waiting: Any) -> None:
        """Carry ``coro`` from here on: it waits on ``waiting`` (what its last step yielded)."""
        self._coro, self._ctx, self._first = coro, ctx, waiting
        if not self._slot.done():
            self._slot.set_result(None)

    def send(self, value: None) -> Any:
        coro = self._coro
        if coro is None:  # parked: wait on the slot, as ``await slot`` would
            if self._started:
                raise RuntimeError("carrier woken without a job")  # (never: adopt wakes it)
            self._started = True
            slot = self._slot
            slot._asyncio_future_blocking = True
            return slot
        first = self._first
        if first is not _DONE:  # the job's first wait (its step ran in the fetch step)
            self._first = _DONE
            return first
        assert self._ctx is not None
        return self._ctx.run(coro.send, value)  # StopIteration ends the task

    def throw(self, typ: Any, val: Any = None, tb: Any = None) -> Any:
        coro = self._coro
        exc = typ if isinstance(typ, BaseException) else typ() if val is None else val
        if coro is None:  # cancelled while parked (the worker stops; a job that cancelled
            raise exc  # its own task and ended): the carrier ends
        self._first = _DONE  # (the cancel reaches the job where it waits)
        assert self._ctx is not None
        return self._ctx.run(coro.throw, exc)

    def close(self) -> None:
        if self._coro is not None:
            self._coro.close()

    def __await__(self) -> Generator[Any, None, None]:
        raise TypeError("a carrier is run by its task only")


class Carrier:
    """A parked task that will carry one job that has to wait (see the module's doc)."""

    __slots__ = ("_carry", "task")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._carry = _Carry(loop.create_future())
        self.task: asyncio.Task[None] = loop.create_task(self._carry)

    def run_first_step(self, loop: asyncio.AbstractEventLoop,
                       coro: Coroutine[Any, Any, None], ctx: contextvars.Context) -> bool:
        """Run the first step of ``coro`` as this carrier's task, in ``ctx`` (the job's own
        context: a copy, as a task would take); True when the job waits (this carrier
        adopted it: it is the job's task now), False when it ended. An error raised out of
        the coroutine is the caller's. No task may be current (the caller leaves its own for
        the batch: worker.py)."""
        task = self.task
        enter_task(loop, task)
        try:
            waiting = ctx.run(coro.send, None)
        except StopIteration:
            return False
        finally:
            leave_task(loop, task)
        self._carry.adopt(coro, ctx, waiting)
        return True

    def first_step(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                   ctx: contextvars.Context) -> tuple[bool, Any]:
        """Run the first step of ``coro`` as this carrier's task, in ``ctx``: (False, what it
        returned) when it ended there; (True, what it waits on) when it waits, and then the
        caller hands it, or a coroutine that carries it on (``Resumed``), to ``carry``. An
        error raised out of the coroutine is the caller's. No task may be current."""
        task = self.task
        enter_task(loop, task)
        try:
            return True, ctx.run(coro.send, None)
        except StopIteration as stop:
            return False, stop.value
        finally:
            leave_task(loop, task)

    def carry(self, coro: Coroutine[Any, Any, None], ctx: contextvars.Context) -> None:
        """This carrier is ``coro``'s task from here on: its first step runs now, in ``ctx``
        (it must wait there: a coroutine that awaits a ``Resumed`` first); the carrier wakes
        and drives it from what it waits on."""
        self._carry.adopt(coro, ctx, ctx.run(coro.send, None))

    @property
    def spoilt(self) -> bool:
        """Cancelled (by a job that ended without waiting, or by whoever kept a reference
        to it) or over: it cannot carry a job."""
        task = self.task
        return task.cancelling() > 0 or task.done()

    def drop(self) -> None:
        """The worker stops: the parked carrier ends (it carries nothing)."""
        self.task.cancel()


class Resumed:
    """Awaits a coroutine whose first step ran elsewhere (``Carrier.first_step``) and that
    waits on ``waiting``: what it waits on goes to the awaiting task, and what the task sends
    or throws in goes on to it, as ``await coro`` would (which refuses a started
    coroutine); its return value is the await's."""

    __slots__ = ("_coro", "_waiting")

    def __init__(self, coro: Coroutine[Any, Any, Any], waiting: Any) -> None:
        self._coro = coro
        self._waiting = waiting

    def __await__(self) -> Generator[Any, Any, Any]:
        coro, pending = self._coro, self._waiting
        self._waiting = None
        while True:
            try:
                sent = yield pending
            except GeneratorExit:
                coro.close()
                raise
            except BaseException as exc:  # noqa: BLE001 - a cancel reaches it where it waits
                try:
                    pending = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    pending = coro.send(sent)
                except StopIteration as stop:
                    return stop.value
