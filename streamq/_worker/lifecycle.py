"""Startup and shutdown hooks (``@registry.on_startup`` / ``@registry.on_shutdown``): they run
once per process, however many workers of that process share the registry. The first worker
to start runs the startup hooks, which fill the shared :class:`Context` that handlers read as
``job.ctx``; the last one to stop runs the shutdown hooks, after its last job was settled or
handed back. A forked child starts afresh (its own context, its own hooks run)."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

from .._core.context import Context
from .._core.errors import RegistryError, StartupFailed

Hook: TypeAlias = Callable[[Context], Awaitable[None] | None]
log = logging.getLogger("streamq.worker")


def hook_name(fn: Any) -> str:
    return str(getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or fn)


def check_hook(kind: str, fn: Any) -> None:
    """Refuse, at registration, a hook that cannot be called with the context."""
    if not callable(fn):
        raise RegistryError(f"@registry.{kind} decorates a function taking the worker context,"
                            f" got {type(fn).__name__} {fn!r}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(None)
    except TypeError:
        name = getattr(fn, "__name__", "hook")
        raise RegistryError(f"the {kind} hook {name} cannot be called with the worker"
                            f" context: write def {name}(ctx: Context) -> None") from None


async def _call(fn: Hook, ctx: Context) -> None:
    """A sync hook runs on the event loop's thread (once, before any job); an async one is
    awaited."""
    result = fn(ctx)
    if inspect.isawaitable(result):
        await result


class Lifecycle:
    """The hooks of one registry and the context they build, with a per-process count of the
    workers using them."""

    def __init__(self) -> None:
        self.startup: list[Hook] = []
        self.shutdown: list[Hook] = []
        self.ctx = Context()
        self._users = 0
        self._pid = os.getpid()
        self._lock: tuple[asyncio.AbstractEventLoop, asyncio.Lock] | None = None

    @property
    def users(self) -> int:
        """Workers of this process between ``start()`` and ``stop()``."""
        return self._users if self._pid == os.getpid() else 0

    def _guard(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        if self._lock is None or self._lock[0] is not loop:
            self._lock = (loop, asyncio.Lock())
        return self._lock[1]

    async def start(self) -> Context:
        """Run the startup hooks unless a worker of this process already did. Raises
        :class:`StartupFailed` (the context is emptied, no shutdown hook runs)."""
        if self._pid != os.getpid():  # a forked child: its own resources, its own hooks
            self._pid, self._users, self.ctx = os.getpid(), 0, Context()
        async with self._guard():
            if self._users == 0:
                for fn in self.startup:
                    try:
                        await _call(fn, self.ctx)
                    except Exception as exc:
                        self.ctx.clear()
                        raise StartupFailed(hook_name(fn), exc) from exc
                    except BaseException:
                        self.ctx.clear()
                        raise
                if self.startup:
                    log.info("startup hooks done: %s", ", ".join(map(hook_name, self.startup)))
            self._users += 1
        return self.ctx

    async def stop(self) -> None:
        """The last worker of this process runs the shutdown hooks: each one, even when an
        earlier one raised (that is logged); then the context is emptied."""
        if self._pid != os.getpid():
            return
        async with self._guard():
            if self._users == 0:
                return
            self._users -= 1
            if self._users:
                return
            for fn in self.shutdown:
                try:
                    await _call(fn, self.ctx)
                except Exception:
                    log.exception("shutdown hook %s failed", hook_name(fn))
            self.ctx.clear()
