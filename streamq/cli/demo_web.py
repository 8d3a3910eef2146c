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
import os
import random
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs

from .._core.config import RetryPolicy
from .._core.errors import InvalidArgument
from .._core.model import Job
from .._worker.registry import Registry

QUEUE = "demo"
KINDS = ("email.send", "webhook.post", "thumbnail.render", "invoice.create")
VISIBILITY_S = 4.0
ENV = "STREAMQ_DEMO_BEHAVIOUR"
"""latency_ms,failure,hang: read by the handlers in the worker processes."""

registry = Registry()


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


def _stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


class Pool:
    """Worker processes of the demo queue, kept at the asked size."""

    def __init__(self, url: str, prefix: str = "streamq") -> None:
        self.url = url
        self.prefix = prefix
        self.settings = PoolSettings(size=0)
        self.procs: list[subprocess.Popen[bytes]] = []
        self.frozen_since: dict[int, float] = {}
        self.killed_hung = 0
        self._task: asyncio.Task[None] | None = None

    def _spawn(self) -> subprocess.Popen[bytes]:
        s = self.settings
        env = {**os.environ, ENV: f"{s.latency_ms},{s.failure},{s.hang}"}
        return subprocess.Popen(
            [sys.executable, "-m", "streamq", "worker", "streamq.cli.demo_web:registry",
             "--queue", QUEUE, "--url", self.url, "--prefix", self.prefix,
             "--concurrency", "4", "--visibility-timeout", str(VISIBILITY_S),
             "--grace-period", "2", "--log-level", "ERROR", "--events", "all"],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def status(self) -> list[tuple[int, str]]:
        return [(p.pid, "hung" if _stopped(p.pid) else
                 ("running" if p.poll() is None else "exited")) for p in self.procs]

    async def apply(self, settings: PoolSettings) -> None:
        """Resize; new behaviour settings replace every process (a rolling restart)."""
        behaviour_changed = attrs.evolve(settings, size=0) != attrs.evolve(self.settings, size=0)
        self.settings = settings
        if behaviour_changed:
            await self._stop(self.procs)
            self.procs = []
        while len(self.procs) > settings.size:
            await self._stop([self.procs.pop()])
        while len(self.procs) < settings.size:
            self.procs.append(self._spawn())
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._supervise())

    async def _stop(self, procs: list[subprocess.Popen[bytes]]) -> None:
        for p in procs:
            if _stopped(p.pid):
                p.kill()
            elif p.poll() is None:
                p.terminate()
        for p in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                await asyncio.to_thread(p.wait, 10)
            if p.poll() is None:
                p.kill()

    async def _supervise(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(0.5)
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    self.procs[i] = self._spawn()
                elif _stopped(p.pid):
                    since = self.frozen_since.setdefault(p.pid, loop.time())
                    if loop.time() - since > 2 * VISIBILITY_S:  # the liveness probe gives up
                        p.kill()
                        self.killed_hung += 1
                        self.frozen_since.pop(p.pid, None)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._stop(self.procs)
        self.procs = []
