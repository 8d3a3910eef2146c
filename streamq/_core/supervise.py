"""The one supervised-loop helper: every background loop of a worker or scheduler runs in it.

A loop is a ``step`` called again and again; the step does one round of work and returns how
long to pause before the next. Whatever a step raises (a dropped connection, OOM, READONLY,
BUSY, LOADING, NOGROUP, a script error, a bug of ours) is logged, rate-limited, and the loop
backs off with jitter and goes on: only its owner's ``stop()`` ends it (the ``running``
predicate turns false, or the task is cancelled).

Logging: the first failure of a streak is a WARNING (transient errors) or an ERROR with the
traceback (anything else); while it goes on, one reminder every ``remind_every_s``; when a step
succeeds again, one INFO line says so. ``last_progress`` (monotonic seconds) tells a health
check when the loop last completed a step.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from redis.exceptions import AuthenticationError, AuthorizationError

from .retry import transient


class LoopHealth(NamedTuple):
    failures: int
    """Consecutive failed rounds (0 while healthy)."""
    since_ok_s: float
    """Seconds since the last good round."""


class Outage:
    """One voice for a process's loops during a Redis outage: the first transient failure of
    any loop logs one WARNING, then one reminder every ``remind_every_s``, and the first good
    round of a loop after that one INFO line; the loops' own logs stay quiet meanwhile."""

    def __init__(self, log: logging.Logger, what: str, remind_every_s: float = 30.0) -> None:
        self.log = log
        self.what = what
        self.remind_every_s = remind_every_s
        self.since: float | None = None
        self._last_log = 0.0
        self.recoveries = 0
        """How many outages ended: a loop backing off tries again at once when it grows."""

    def failed(self, loop: str, exc: BaseException) -> None:
        now = time.monotonic()
        if self.since is None:
            self.since = self._last_log = now
            self.log.warning("%s: Redis unavailable (%s in %s: %s); retrying with backoff",
                             self.what, type(exc).__name__, loop, exc)
        elif now - self._last_log >= self.remind_every_s:
            self._last_log = now
            self.log.warning("%s: Redis still unavailable after %.0f s (%s: %s)", self.what,
                             now - self.since, type(exc).__name__, exc)

    def ok(self) -> None:
        if self.since is not None:
            self.log.info("%s: Redis available again after %.1f s", self.what,
                          time.monotonic() - self.since)
            self.since = None
            self.recoveries += 1  # every loop of the process cuts its back-off short


class Supervised:
    """Bookkeeping and logging for one loop; ``run`` (async) or ``run_sync`` (a thread)."""

    def __init__(self, name: str, log: logging.Logger, *, min_backoff_s: float = 0.05,
                 max_backoff_s: float = 2.0, remind_every_s: float = 30.0,
                 outage: Outage | None = None) -> None:
        self.name = name
        self.log = log
        self.outage = outage
        self.min_backoff_s = min_backoff_s
        self.max_backoff_s = max_backoff_s
        self.remind_every_s = remind_every_s
        self.last_progress = time.monotonic()
        self.failures = 0
        """Consecutive failed steps (0 while healthy)."""
        self.total_failures = 0
        self._streak_start = 0.0
        self._last_log = 0.0
        self._quiet = False
        self._growth = 0
        """Failures the back-off has grown for (restarts when an outage ends)."""
        self._seen_recoveries = 0

    def health(self) -> LoopHealth:
        return LoopHealth(self.failures, time.monotonic() - self.last_progress)

    def ok(self) -> None:
        now = time.monotonic()
        if self.failures:
            if self.outage is not None:
                self.outage.ok()
            if not self._quiet:
                self.log.info("%s: recovered after %d failed tries over %.1f s", self.name,
                              self.failures, now - self._streak_start)
            self.failures = 0
            self._growth = 0
        self.last_progress = now

    def failed(self, exc: BaseException) -> float:
        """Log ``exc`` (rate-limited) and return how long to back off before the next try."""
        now = time.monotonic()
        self.total_failures += 1
        if self.outage is not None and transient(exc):
            self._quiet = True  # the process-wide outage log speaks for every loop
            self.outage.failed(self.name, exc)
        elif self.failures == 0 or self._quiet:
            self._quiet = False
            self._streak_start = now
            self._last_log = now
            if transient(exc):
                self.log.warning("%s: %s: %s (transient; retrying)", self.name,
                                 type(exc).__name__, exc)
            else:
                self.log.error("%s failed; retrying", self.name, exc_info=exc)
        elif not self._quiet and now - self._last_log >= self.remind_every_s:
            self._last_log = now
            self.log.warning("%s: still failing after %d tries over %.0f s: %s: %s", self.name,
                             self.failures + 1, now - self._streak_start, type(exc).__name__,
                             exc)
        self.failures += 1
        if self.outage is not None and self.outage.recoveries != self._seen_recoveries:
            self._seen_recoveries = self.outage.recoveries  # Redis answered someone since:
            self._growth = 0                                # a new fault starts small again
        self._growth += 1
        ceiling = min(self.max_backoff_s, self.min_backoff_s * 2.0 ** min(self._growth, 30))
        return random.uniform(ceiling / 2, ceiling)

    def _cut_short(self, start: int) -> bool:
        return self.outage is not None and self.outage.recoveries != start

    async def _back_off(self, delay_s: float) -> None:
        """Sleep ``delay_s``, or less: as soon as another loop of the process sees Redis
        answer again (so every loop resumes right after an outage, not a back-off later)."""
        start = self.outage.recoveries if self.outage is not None else 0
        end = time.monotonic() + delay_s
        while not self._cut_short(start):
            left = end - time.monotonic()
            if left <= 0:
                return
            await asyncio.sleep(min(left, 0.05))

    async def run(self, step: Callable[[], Awaitable[float]],
                  running: Callable[[], bool]) -> None:
        """Call ``step`` until ``running()`` is false or the task is cancelled by its owner."""
        while running():
            try:
                pause = await step()
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if task is None or task.cancelling():
                    raise  # our owner stops us
                pause = self.failed(asyncio.CancelledError(  # e.g. a timeout racing a read
                    "operation cancelled inside the step"))
                await self._back_off(pause)
                continue
            except Exception as exc:  # noqa: BLE001 - every error: log, back off, go on
                await self._back_off(self.failed(exc))
                continue
            self.ok()
            if pause > 0:
                await asyncio.sleep(pause)
            else:
                await asyncio.sleep(0)  # never starve the event loop

    def run_sync(self, step: Callable[[], float], stop: threading.Event) -> None:
        """The same for a thread: ``step`` until ``stop`` is set."""
        while not stop.is_set():
            try:
                pause = step()
            except Exception as exc:  # noqa: BLE001 - every error: log, back off, go on
                delay = self.failed(exc)
                start = self.outage.recoveries if self.outage is not None else 0
                end = time.monotonic() + delay
                while not self._cut_short(start) and not stop.wait(
                        min(0.05, max(0.0, end - time.monotonic()))):
                    if time.monotonic() >= end:
                        break
                continue
            self.ok()
            if pause > 0:
                stop.wait(pause)


_FIRST_WAIT_S = 0.5
_LONGEST_WAIT_S = 5.0


def worth_waiting(exc: BaseException) -> bool:
    """A start-up error that time may cure: transient (:func:`transient`), and not a refused
    login (a wrong password or ACL user: redis-py files those under ConnectionError, and no
    wait fixes them)."""
    return transient(exc) and not isinstance(exc, (AuthenticationError, AuthorizationError))


async def start_waiting(attempt: Callable[[], Awaitable[None]], wait_s: float,
                        log: logging.Logger, who: str) -> None:
    """Run ``attempt`` (a worker's or scheduler's start-up, which leaves nothing behind when
    it raises); while it fails with an error :func:`worth_waiting` (Redis not up yet,
    LOADING, READONLY in a failover, OOM), run it again, for up to ``wait_s`` seconds after
    the first try (0: one try), backing off from 0.5 s to 5 s. Each wait is one WARNING line.
    Any other error, or one still there when the time is up, is raised as it is."""
    deadline = time.monotonic() + wait_s
    pause = _FIRST_WAIT_S
    failed = 0
    while True:
        try:
            await attempt()
        except Exception as exc:
            left = deadline - time.monotonic()
            if left <= 0 or not worth_waiting(exc):
                raise
            failed += 1
            log.warning("%s: Redis is not usable yet (%s: %s); trying again, for up to %.0f s"
                        " more", who, type(exc).__name__, exc, left)
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, _LONGEST_WAIT_S)
            continue
        if failed:
            log.info("%s: started after %d failed tries", who, failed)
        return


async def start_unless_stopped(start: Awaitable[None], stop: asyncio.Event) -> bool:
    """Await ``start`` unless ``stop`` is set first (a signal while a start waits for Redis):
    then cancel it (a start leaves nothing behind when it ends early) and answer False.
    A start's own error is raised."""
    starting = asyncio.ensure_future(start)
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
        if not starting.done():
            starting.cancel()
    try:
        await starting
    except asyncio.CancelledError:
        if stop.is_set() and not _cancelling():
            return False
        raise
    return True


def _cancelling() -> bool:
    """True when the current task itself is being cancelled (not only what it awaited)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
