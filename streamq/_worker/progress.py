"""Progress reports and log lines from handlers: ``job.progress(value)`` and ``job.log(text)``.

Both only record in memory (from the event loop or a sync handler's thread) and return at once;
one supervised loop per worker writes what was recorded with progress.lua, batched, about every
``FLUSH_S``, fenced by the lease token. ``await job.progress(v)`` waits until that write is
done (or found pointless: the lease is gone). Bounded: a progress value is at most
``MAX_PROGRESS_BYTES`` of JSON, a log line at most ``MAX_LINE_CHARS`` characters, and a record
keeps the last ``MAX_LINES`` lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Generator
from typing import Any

import attrs
import redis.asyncio as aredis

from .._core.config import QueueConfig
from .._core.errors import InvalidArgument
from .._core.scripts import SCRIPTS
from .._core.supervise import Outage, Supervised
from .lease import Lease

log = logging.getLogger("streamq.worker")
MAX_PROGRESS_BYTES = 2048
MAX_LINE_CHARS = 1000
MAX_LINES = 100
FLUSH_S = 0.1
WAIT_MAX_S = 2.0
_BATCH = 500


@attrs.define
class _Pending:
    lease: Lease
    progress: str | None = None
    lines: list[dict[str, Any]] = attrs.field(factory=list)
    seq: int = 0
    """The report's sequence number (every progress or line raises it)."""


class Sent:
    """What ``job.progress`` returns: awaiting it waits until the report is written."""

    def __init__(self, reporter: Progress, seq: int) -> None:
        self._reporter, self._seq = reporter, seq

    def __await__(self) -> Generator[Any, None, None]:
        return self._reporter.wait_written(self._seq).__await__()


class Progress:
    """One worker's progress writer."""

    def __init__(self, client: aredis.Redis, config: QueueConfig,
                 outage: Outage | None = None) -> None:
        self.client = client
        self.config = config
        self.loop_state = Supervised("progress reports", log, outage=outage)
        self._lock = threading.Lock()
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._line_seq: dict[tuple[str, str], int] = {}
        self._seq = 0
        self._written = 0
        self._wake = asyncio.Event()
        self._writing = asyncio.Lock()
        """Held while reports are written: a job's last reports (settle_first) go out after
        any write already under way, so an older report never lands after a newer one."""
        self._written_cond = asyncio.Condition()
        self._loop = asyncio.get_running_loop()

    # ------------------------------------------------------------------ handler side

    def record(self, lease: Lease, kind: str, value: Any) -> Sent:
        if kind == "progress":
            try:
                text = json.dumps(value, separators=(",", ":"), allow_nan=False)
            except (TypeError, ValueError) as exc:
                raise InvalidArgument(f"progress must be plain JSON data (a number, a string,"
                                      f" a dict or a list): {exc}") from exc
            if len(text.encode()) > MAX_PROGRESS_BYTES:
                raise InvalidArgument(f"progress is {len(text.encode())} bytes of JSON, over"
                                      f" {MAX_PROGRESS_BYTES}: report less")
        else:
            text = str(value)[:MAX_LINE_CHARS]
        key = (lease.keys.tag, lease.job_id)
        with self._lock:
            self._seq += 1
            seq = self._seq
            p = self._pending.get(key)
            if p is None or p.lease.token != lease.token:
                p = self._pending[key] = _Pending(lease)
            p.seq = seq
            if kind == "progress":
                p.progress = text
            else:
                n = self._line_seq.get(key, 0) + 1
                self._line_seq[key] = n
                p.lines.append({"n": n, "t": int(time.time() * 1000), "m": text})
                del p.lines[:-MAX_LINES]
        with contextlib.suppress(RuntimeError):  # a closed loop: the worker stopped
            self._loop.call_soon_threadsafe(self._wake.set)
        return Sent(self, seq)

    async def wait_written(self, seq: int) -> None:
        """Wait until report ``seq`` is written, at most ``WAIT_MAX_S`` (reports are best
        effort: a handler is never held up by Redis being away)."""
        async with self._written_cond:
            try:
                async with asyncio.timeout(WAIT_MAX_S):
                    await self._written_cond.wait_for(lambda: self._written >= seq)
            except TimeoutError:
                pass

    # ------------------------------------------------------------------ writer side

    async def run(self, running: Callable[[], bool]) -> None:
        await self.loop_state.run(self._step, running)

    async def _step(self) -> float:
        await self._wake.wait()
        self._wake.clear()
        async with self._writing:
            with self._lock:  # copies: a handler's thread goes on reporting meanwhile
                batch = [attrs.evolve(p, lines=list(p.lines)) for p in self._pending.values()]
                top = self._seq
            if batch:
                await self.write(batch)
                with self._lock:  # drop what was written, unless more came meanwhile
                    for p in batch:
                        key = (p.lease.keys.tag, p.lease.job_id)
                        cur = self._pending.get(key)
                        if (cur is not None and cur.lease.token == p.lease.token
                                and cur.seq == p.seq):
                            del self._pending[key]
        async with self._written_cond:
            self._written = max(self._written, top)
            self._written_cond.notify_all()
        return FLUSH_S

    async def write(self, batch: list[_Pending]) -> None:
        by_queue: dict[str, list[_Pending]] = {}
        for p in batch:
            by_queue.setdefault(p.lease.keys.tag, []).append(p)
        for items in by_queue.values():
            for i in range(0, len(items), _BATCH):
                part = items[i:i + _BATCH]
                k = part[0].lease.keys
                args: list[Any] = [self.config.events_arg, MAX_LINES, len(part)]
                for p in part:
                    args += [p.lease.job_id, p.lease.token, p.progress or "",
                             json.dumps(p.lines) if p.lines else ""]
                await SCRIPTS["progress"].run_async(
                    self.client, [k.events, *(k.job(p.lease.job_id) for p in part)], args)

    def waiting(self) -> tuple[dict[tuple[str, str], Any], dict[tuple[str, str], int]]:
        """The reports not written yet and the line numbering kept, by (queue, job id): both
        empty, no job has reports (``has_reports`` is False for every job). The same dicts
        for the worker's life (read them once, test them per job)."""
        return self._pending, self._line_seq

    def has_reports(self, queue: str, job_id: str) -> bool:
        """True when the job has reports not written yet (``settle_first`` must run before
        its outcome is settled). A report being written is still pending until its write is
        done, so False also means no write of this job's reports is under way. Cheap: asked
        once per job, on the event loop."""
        key = (queue, job_id)
        if key in self._pending:
            return True
        if key in self._line_seq:  # its lines were all written: forget their numbering
            with self._lock:
                if key not in self._pending:
                    self._line_seq.pop(key, None)
                    return False
            return True
        return False

    async def settle_first(self, queue: str, job_id: str) -> None:
        """Write the job's pending reports now, before its outcome is settled (after that the
        record is no longer 'active' and would refuse them). Best effort: an error is logged."""
        key = (queue, job_id)
        async with self._writing:
            with self._lock:
                p = self._pending.pop(key, None)
                self._line_seq.pop(key, None)
            if p is None:
                return
            try:
                await self.write([p])
            except Exception as exc:  # noqa: BLE001 - reports are best effort
                log.warning("progress of job %s not written: %s: %s", job_id,
                            type(exc).__name__, exc)
