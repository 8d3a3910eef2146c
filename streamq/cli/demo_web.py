"""``streamq demo --web``: the dashboard with a demo panel over a private redis-server.

The panel enqueues batches of four job kinds and runs a pool of worker *processes* whose
handlers take a configurable time, fail at a configurable rate (retried, then dead-lettered)
and hang at a configurable rate: a hang freezes the whole worker process (SIGSTOP), as a stuck
or partitioned host would, so its jobs come back only when another worker takes them over
after the visibility timeout (or at once with "reclaim now"). The pool kills processes that
stay frozen and starts new ones, as an orchestrator's liveness probe would. This module is the
pool and its handlers; ``demo_panel.py`` is the panel, ``main.py`` serves both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import subprocess
from typing import Any

import attrs

from .._core.config import RetryPolicy
from .._core.errors import Fail, InvalidArgument
from .._core.model import Job
from .._worker.registry import Registry
from . import demo_procs

QUEUE = "demo"
KINDS = ("email.send", "webhook.post", "thumbnail.render", "invoice.create")
VISIBILITY_S = 4.0
GRACE_S = 2.0
"""The workers' --grace-period: a stop waits this long plus 3 s before SIGKILL."""
ENV = "STREAMQ_DEMO_BEHAVIOUR"
"""latency_ms,failure,hang: read by the handlers in the worker processes."""

registry = Registry()
log = logging.getLogger("streamq.demo")


def _behaviour() -> tuple[float, float, float]:
    try:
        latency_ms, failure, hang = (float(x) for x in os.environ.get(ENV, "200,0,0").split(","))
    except ValueError:
        return 0.2, 0.0, 0.0
    return latency_ms / 1000, failure, hang


async def _work(job: Job) -> dict[str, Any]:
    latency_s, failure, hang = _behaviour()
    await asyncio.sleep(latency_s * random.uniform(0.5, 1.5))
    if random.random() < hang:
        os.kill(os.getpid(), signal.SIGSTOP)  # the whole worker freezes, leases and all
    reason = job.payload.get("fail") if isinstance(job.payload, dict) else None
    if reason:  # a job the demo seeds to fail: dead-lettered at once
        raise Fail(str(reason))
    if random.random() < failure:
        raise RuntimeError(f"{job.type} failed (demo failure rate {failure:.0%})")
    return {"kind": job.type, "attempt": job.attempt}


for _kind in KINDS:
    registry.handler(_kind, max_attempts=3, retry=RetryPolicy(base_s=0.5, cap_s=2.0))(_work)


@attrs.frozen
class PoolSettings:
    size: int = 2
    latency_ms: int = 200
    failure: float = 0.0
    hang: float = 0.0

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.size <= 16:
            raise InvalidArgument("pool size must be 0-16")
        if not 0 <= self.latency_ms <= 60_000:
            raise InvalidArgument("latency must be 0-60,000 ms")
        if not (0 <= self.failure <= 1 and 0 <= self.hang <= 1):
            raise InvalidArgument("rates must be 0-100 %")


class Pool:
    """Worker processes of the demo queue, kept at the asked size.

    Every change of the process list (resize, restart, the supervisor's replacements, close)
    holds one lock, and nothing starts once :meth:`close` began: a replacement started while
    a resize or close waits for processes to exit would be dropped from the list and outlive
    the demo."""

    def __init__(self, url: str, prefix: str = "streamq") -> None:
        self.url = url
        self.prefix = prefix
        self.settings = PoolSettings(size=0)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.frozen_since: dict[int, float] = {}
        self.killed_hung = 0
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()
        self._closing = False

    def _spawn(self) -> subprocess.Popen[bytes]:
        if self._closing:
            raise RuntimeError("the demo's worker pool is closing")
        s = self.settings
        return demo_procs.spawn(
            ["worker", "streamq.cli.demo_web:registry",
             "--queue", QUEUE, "--url", self.url, "--prefix", self.prefix,
             "--concurrency", "4", "--visibility-timeout", str(VISIBILITY_S),
             "--grace-period", str(GRACE_S), "--log-level", "ERROR", "--events", "all"],
            env={ENV: f"{s.latency_ms},{s.failure},{s.hang}"})

    def status(self) -> list[tuple[int, str]]:
        return [(p.pid, "hung" if demo_procs.frozen(p.pid) else
                 ("running" if p.poll() is None else "exited")) for p in self.procs]

    async def apply(self, settings: PoolSettings) -> None:
        """Resize; new behaviour settings replace every process (a rolling restart)."""
        async with self._lock:
            if self._closing:
                raise RuntimeError("the demo's worker pool is closing")
            behaviour_changed = (attrs.evolve(settings, size=0)
                                 != attrs.evolve(self.settings, size=0))
            self.settings = settings
            if behaviour_changed:
                old, self.procs = self.procs, []
                await self._stop(old)
            while len(self.procs) > settings.size:
                await self._stop([self.procs.pop()])
            while len(self.procs) < settings.size:
                self.procs.append(self._spawn())
            if self._task is None or self._task.done():
                self._task = asyncio.create_task(self._supervise())

    @staticmethod
    async def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
        if procs:
            await asyncio.to_thread(demo_procs.stop, procs, GRACE_S + 3)

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            await asyncio.sleep(0.5)
            try:
                async with self._lock:
                    if not self._closing:
                        self._check(loop.time())
            except Exception:  # a failed spawn (resources): tried again next round
                log.exception("demo pool: supervising the worker processes failed")

    def _check(self, now: float) -> None:
        for i, p in enumerate(self.procs):
            if p.poll() is not None:
                self.procs[i] = self._spawn()
            elif demo_procs.frozen(p.pid):
                since = self.frozen_since.setdefault(p.pid, now)
                if now - since > 2 * VISIBILITY_S:  # the liveness probe gives up
                    p.kill()
                    self.killed_hung += 1
                    self.frozen_since.pop(p.pid, None)

    async def close(self) -> None:
        self._closing = True  # from here on nothing starts
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        async with self._lock:
            procs, self.procs = self.procs, []
            await self._stop(procs)
