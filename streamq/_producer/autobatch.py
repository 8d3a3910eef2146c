"""Concurrent single enqueues batch themselves (like ioredis' auto-pipelining).

One enqueue.lua call is in flight per queue shard at a time. A lone call goes out at once (no
added latency); calls that arrive while one is in flight for their shard wait for it and then
go out together, as one script call of up to ``MAX_BATCH`` jobs. Each caller gets its own
job's result (or its own exception: a refusal of one job never fails another). A batch holds
the jobs of one shard only (``ShardedSync``/``ShardedAsync``: one batcher per shard), so a
caller's answer comes from its own shard's call alone: a shard whose node is down or stalled
fails (or delays) only its own callers, and the shards' calls run at the same time, each on
its own node (DESIGN.md invariant 16). A batch that meets an error fails every caller in it
with that error, exactly as their single calls would have (the retries of idempotent calls
happen inside ``send``).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

P = TypeVar("P")
R = TypeVar("R")
MAX_BATCH = 500
"""Jobs per gathered call (a lone call is always a batch of one)."""


class AsyncBatcher(Generic[P, R]):
    def __init__(self, send: Callable[[list[P]], Awaitable[list[R]]]) -> None:
        self._send = send
        self._busy = False
        self._pending: list[tuple[P, asyncio.Future[R]]] = []
        self._task: asyncio.Task[None] | None = None

    async def submit(self, item: P) -> R:
        if not self._busy:  # nothing in flight: go now
            self._busy = True
            try:
                return (await self._send([item]))[0]
            finally:
                self._next()
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        return await fut

    def _next(self) -> None:
        if self._pending:  # what gathered meanwhile goes out next, in a task of its own
            self._task = asyncio.create_task(self._drain())
        else:
            self._busy = False

    async def _drain(self) -> None:
        batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
        try:
            results = await self._send([item for item, _ in batch])
        except BaseException as exc:  # every caller in the batch gets what it would have got
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, fut), result in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result(result)
        finally:
            self._next()


class _Slot(Generic[P, R]):
    __slots__ = ("done", "error", "item", "lead", "result")

    def __init__(self, item: P) -> None:
        self.item = item
        self.done = False
        self.lead = False
        self.result: Any = None
        self.error: BaseException | None = None


class SyncBatcher(Generic[P, R]):
    """The same for threads: a caller that finds a call in flight waits; when that call
    returns, the first waiter leads: it sends everything gathered, one batch, and hands on."""

    def __init__(self, send: Callable[[list[P]], list[R]]) -> None:
        self._send = send
        self._cond = threading.Condition()
        self._busy = False
        self._pending: list[_Slot[P, R]] = []

    def submit(self, item: P) -> R:
        slot: _Slot[P, R] = _Slot(item)
        with self._cond:
            if self._busy:
                self._pending.append(slot)
                while not slot.done and not slot.lead:
                    self._cond.wait()
                if slot.done:
                    if slot.error is not None:
                        raise slot.error
                    result: R = slot.result
                    return result
                batch = self._pending[:MAX_BATCH]  # we lead: our slot is the first
                del self._pending[:MAX_BATCH]
            else:
                self._busy = True
                batch = [slot]
        try:
            results = self._send([s.item for s in batch])
        except BaseException as exc:
            with self._cond:
                for s in batch:
                    s.error, s.done = exc, True
                self._hand_on()
            raise
        with self._cond:
            for s, r in zip(batch, results, strict=True):
                s.result, s.done = r, True
            self._hand_on()
        out: R = slot.result
        return out

    def _hand_on(self) -> None:
        if self._pending:
            self._pending[0].lead = True
        else:
            self._busy = False
        self._cond.notify_all()


class ShardedSync(Generic[P, R]):
    """A :class:`SyncBatcher` per shard (``shard(item)``), made on first use."""

    def __init__(self, send: Callable[[list[P]], list[R]], shard: Callable[[P], int]) -> None:
        self._send, self._shard = send, shard
        self._by: dict[int, SyncBatcher[P, R]] = {}
        self._lock = threading.Lock()

    def submit(self, item: P) -> R:
        k = self._shard(item)
        b = self._by.get(k)
        if b is None:
            with self._lock:
                b = self._by.setdefault(k, SyncBatcher(self._send))
        return b.submit(item)


class ShardedAsync(Generic[P, R]):
    """An :class:`AsyncBatcher` per shard (``shard(item)``), made on first use."""

    def __init__(self, send: Callable[[list[P]], Awaitable[list[R]]],
                 shard: Callable[[P], int]) -> None:
        self._send, self._shard = send, shard
        self._by: dict[int, AsyncBatcher[P, R]] = {}

    async def submit(self, item: P) -> R:
        k = self._shard(item)
        b = self._by.get(k)
        if b is None:
            b = self._by[k] = AsyncBatcher(self._send)
        return await b.submit(item)
