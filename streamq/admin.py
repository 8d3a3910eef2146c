"""Admin API: stats, pending, job records, dead letters, re-drive, requeue, pause, purge.

``Admin`` (blocking) and ``AsyncAdmin`` (asyncio) run the same operations (``_ops.py``);
everything reads XINFO/XPENDING, counters and indexes, never the keyspace.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from typing import Any, TypeVar

import redis
import redis.asyncio as aredis
from redis.exceptions import NoScriptError

from . import _ops
from ._config import QueueConfig
from ._conn import async_client, sync_client
from ._errors import ServerTooOld
from ._keys import Keys, queues_key
from ._model import JobInfo
from ._ops import (
    ConsumerInfo,
    DeadEntry,
    DeadFilter,
    Page,
    PendingEntry,
    QueueStats,
)
from ._scripts import SCRIPTS

T = TypeVar("T")
MIN_VERSION = (6, 2)

__all__ = ["Admin", "AsyncAdmin", "ConsumerInfo", "DeadEntry", "DeadFilter", "Page",
           "PendingEntry", "QueueStats"]


def _who() -> str:
    return f"admin:{socket.gethostname()}:{os.getpid()}"


def _raw_pipe(client: Any) -> Any:
    """A pipeline without redis-py's reply callbacks: the operations parse raw RESP2."""
    return type(client.pipeline())(client.connection_pool, {}, False, None)


def _queue_pipe(pipe: Any, step: _ops.Step) -> None:
    for c in step:
        if isinstance(c, _ops.Call):
            s = SCRIPTS[c.script]
            pipe.evalsha(s.sha, len(c.keys), *c.keys, *c.args)
        else:
            pipe.execute_command(*c.args)


def _noscript(step: _ops.Step, replies: list[Any]) -> list[int]:
    return [i for i, (c, r) in enumerate(zip(step, replies, strict=True))
            if isinstance(c, _ops.Call) and isinstance(r, NoScriptError)]


def drive(client: redis.Redis, op: _ops.Op[T]) -> T:
    """Run an operation over a blocking client."""
    try:
        step = next(op)
        while True:
            pipe = _raw_pipe(client)
            _queue_pipe(pipe, step)
            replies = pipe.execute(raise_on_error=False)
            retry = _noscript(step, replies)
            if retry:  # a restarted server lost its script cache: load and resend those
                for name in {step[i].script for i in retry}:  # type: ignore[union-attr]
                    client.script_load(SCRIPTS[name].source)
                pipe = _raw_pipe(client)
                _queue_pipe(pipe, [step[i] for i in retry])
                for i, rep in zip(retry, pipe.execute(raise_on_error=False), strict=True):
                    replies[i] = rep
            step = op.send(replies)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def adrive(client: aredis.Redis, op: _ops.Op[T]) -> T:
    """Run an operation over an asyncio client."""
    try:
        step = next(op)
        while True:
            pipe = _raw_pipe(client)
            _queue_pipe(pipe, step)
            replies = await pipe.execute(raise_on_error=False)
            retry = _noscript(step, replies)
            if retry:
                for name in {step[i].script for i in retry}:  # type: ignore[union-attr]
                    await client.script_load(SCRIPTS[name].source)
                pipe = _raw_pipe(client)
                _queue_pipe(pipe, [step[i] for i in retry])
                for i, rep in zip(retry, await pipe.execute(raise_on_error=False),
                                  strict=True):
                    replies[i] = rep
            step = op.send(replies)
    except StopIteration as stop:
        result: T = stop.value
        return result


def _check_version(version: tuple[int, ...]) -> None:
    if version[:2] < MIN_VERSION:
        raise ServerTooOld(
            f"Redis {'.'.join(map(str, version))} is too old: streamq needs 6.2 or newer"
            " (XAUTOCLAIM, XPENDING IDLE)")


class Admin:
    """Operations on queues, from blocking code (scripts, the CLI)."""

    def __init__(self, client: redis.Redis, config: QueueConfig | None = None) -> None:
        self.client = client
        self.config = config or QueueConfig()

    @classmethod
    def from_url(cls, url: str, config: QueueConfig | None = None, **kwargs: Any) -> Admin:
        return cls(sync_client(url, **kwargs), config)

    def close(self) -> None:
        self.client.close()

    def _k(self, queue: str) -> Keys:
        return Keys(queue, self.config.key_prefix)

    def check_server(self) -> tuple[int, ...]:
        """The server's version; raises ServerTooOld below 6.2."""
        version = drive(self.client, _ops.server_version())
        _check_version(version)
        return version

    def queues(self) -> list[str]:
        """Queues that workers or schedulers have served (a SET kept by them; no scan)."""
        names: Any = self.client.smembers(queues_key(self.config.key_prefix))
        return sorted(n.decode() for n in names)

    def stats(self, queue: str) -> QueueStats:
        return drive(self.client, _ops.stats(self._k(queue)))

    def pending(self, queue: str, *, min_idle_s: float = 0, consumer: str | None = None,
                count: int = 100, cursor: str | None = None) -> Page:
        return drive(self.client, _ops.pending(self._k(queue), min_idle_s=min_idle_s,
                                               consumer=consumer, count=count, cursor=cursor))

    def job(self, queue: str, job_id: str) -> JobInfo:
        return drive(self.client, _ops.job(self._k(queue), self.config, job_id))

    def requeue(self, queue: str, job_id: str) -> str:
        return drive(self.client, _ops.requeue(self._k(queue), self.config, job_id, _who()))

    def dead(self, queue: str, flt: DeadFilter | None = None, *, limit: int = 100,
             cursor: str | None = None, oldest_first: bool = False) -> Page:
        return drive(self.client, _ops.dead_list(self._k(queue), flt or DeadFilter(),
                                                 limit=limit, cursor=cursor,
                                                 oldest_first=oldest_first))

    def redrive(self, queue: str, entries: Sequence[DeadEntry]) -> dict[str, int]:
        """Re-drive these dead entries (from :meth:`dead`); safe to re-run."""
        return drive(self.client, _ops.redrive(self._k(queue), self.config, entries, _who()))

    def redrive_matching(self, queue: str, flt: DeadFilter | None = None,
                         max_jobs: int = 100_000) -> dict[str, int]:
        """Re-drive every dead job matching the filter, oldest first, page by page."""
        total: dict[str, int] = {}
        cursor: str | None = None
        while sum(total.values()) < max_jobs:
            page = self.dead(queue, flt, limit=min(1000, max_jobs - sum(total.values())),
                             cursor=cursor, oldest_first=True)
            if page.items:
                for k, v in self.redrive(queue, page.items).items():
                    total[k] = total.get(k, 0) + v
            if page.cursor is None:
                break
            cursor = page.cursor
        return total

    def purge(self, queue: str, state: str, max_jobs: int = 100_000) -> int:
        return drive(self.client, _ops.purge(self._k(queue), self.config, state,
                                             max_jobs=max_jobs))

    def pause(self, queue: str) -> None:
        drive(self.client, _ops.set_paused(self._k(queue), True))

    def resume(self, queue: str) -> None:
        drive(self.client, _ops.set_paused(self._k(queue), False))

    def consumers(self, queue: str) -> list[ConsumerInfo]:
        return drive(self.client, _ops.consumers(self._k(queue)))

    def prune(self, queue: str, dead_after_s: float = 600.0) -> list[str]:
        return drive(self.client, _ops.prune(self._k(queue), dead_after_s))


class AsyncAdmin:
    """The same operations as :class:`Admin`, awaitable."""

    def __init__(self, client: aredis.Redis, config: QueueConfig | None = None) -> None:
        self.client = client
        self.config = config or QueueConfig()

    @classmethod
    def from_url(cls, url: str, config: QueueConfig | None = None, **kwargs: Any
                 ) -> AsyncAdmin:
        return cls(async_client(url, **kwargs), config)

    async def close(self) -> None:
        await self.client.aclose()

    def _k(self, queue: str) -> Keys:
        return Keys(queue, self.config.key_prefix)

    async def check_server(self) -> tuple[int, ...]:
        version = await adrive(self.client, _ops.server_version())
        _check_version(version)
        return version

    async def stats(self, queue: str) -> QueueStats:
        return await adrive(self.client, _ops.stats(self._k(queue)))

    async def pending(self, queue: str, *, min_idle_s: float = 0, consumer: str | None = None,
                      count: int = 100, cursor: str | None = None) -> Page:
        return await adrive(self.client, _ops.pending(
            self._k(queue), min_idle_s=min_idle_s, consumer=consumer, count=count, cursor=cursor))

    async def job(self, queue: str, job_id: str) -> JobInfo:
        return await adrive(self.client, _ops.job(self._k(queue), self.config, job_id))

    async def requeue(self, queue: str, job_id: str) -> str:
        return await adrive(self.client, _ops.requeue(self._k(queue), self.config, job_id,
                                                      _who()))

    async def dead(self, queue: str, flt: DeadFilter | None = None, *, limit: int = 100,
                   cursor: str | None = None, oldest_first: bool = False) -> Page:
        return await adrive(self.client, _ops.dead_list(
            self._k(queue), flt or DeadFilter(), limit=limit, cursor=cursor,
            oldest_first=oldest_first))

    async def redrive(self, queue: str, entries: Sequence[DeadEntry]) -> dict[str, int]:
        return await adrive(self.client, _ops.redrive(self._k(queue), self.config, entries,
                                                      _who()))

    async def queues(self) -> list[str]:
        names: Any = await self.client.smembers(queues_key(self.config.key_prefix))
        return sorted(n.decode() for n in names)

    async def redrive_matching(self, queue: str, flt: DeadFilter | None = None,
                               max_jobs: int = 100_000) -> dict[str, int]:
        total: dict[str, int] = {}
        cursor: str | None = None
        while sum(total.values()) < max_jobs:
            page = await self.dead(queue, flt, limit=min(1000, max_jobs - sum(total.values())),
                                   cursor=cursor, oldest_first=True)
            if page.items:
                for k, v in (await self.redrive(queue, page.items)).items():
                    total[k] = total.get(k, 0) + v
            if page.cursor is None:
                break
            cursor = page.cursor
        return total

    async def purge(self, queue: str, state: str, max_jobs: int = 100_000) -> int:
        return await adrive(self.client, _ops.purge(self._k(queue), self.config, state,
                                                    max_jobs=max_jobs))

    async def pause(self, queue: str) -> None:
        await adrive(self.client, _ops.set_paused(self._k(queue), True))

    async def resume(self, queue: str) -> None:
        await adrive(self.client, _ops.set_paused(self._k(queue), False))

    async def consumers(self, queue: str) -> list[ConsumerInfo]:
        return await adrive(self.client, _ops.consumers(self._k(queue)))

    async def prune(self, queue: str, dead_after_s: float = 600.0) -> list[str]:
        return await adrive(self.client, _ops.prune(self._k(queue), dead_after_s))
