"""The event-loop watchdog: a thread that notices when the worker's event loop stops answering
(an async handler calling ``time.sleep``, blocking I/O or long CPU work) and says which job
blocks it, with that thread's stack.

Nothing can interrupt code that blocks the loop: while it runs, no other job, no timeout and
no settling of this worker makes progress (leases are still renewed by their own thread). The
watchdog only makes it visible: one WARNING when the stall passes the threshold, one INFO line
when the loop answers again.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from types import CodeType, FrameType


class LoopWatchdog:
    """Pings ``loop`` every ``threshold_s / 2``; a ping unanswered for ``threshold_s`` is a
    stall. ``handlers()`` gives the code objects of registered handlers, to name the job."""

    def __init__(self, loop: asyncio.AbstractEventLoop, threshold_s: float,
                 handlers: Callable[[], dict[CodeType, str]], log: logging.Logger) -> None:
        self.loop = loop
        self.threshold_s = threshold_s
        self.handlers = handlers
        self.log = log
        self.stalls = 0
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="streamq-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(self.threshold_s / 2):
            answered = threading.Event()
            sent = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(answered.set)
            except RuntimeError:  # the loop is closed
                return
            if answered.wait(self.threshold_s):
                continue
            self.stalls += 1
            self._report(time.monotonic() - sent)
            while not answered.wait(1.0):
                if self._stop.is_set():
                    return
            self.log.info("event loop answers again after %.1f s", time.monotonic() - sent)

    def _report(self, stalled_s: float) -> None:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return
        job, jtype = self._blocking_job(frame)
        stack = "".join(traceback.format_stack(frame, limit=12))
        self.log.warning(
            "event loop blocked for %.1f s by job %s (%s): a handler blocks the loop"
            " (time.sleep, blocking I/O or CPU work in an async def); no other job of this"
            " worker runs, and its timeout cannot fire, until it returns. Use await"
            " asyncio.sleep / async I/O, or a sync handler (run in a thread). Stack:\n%s",
            stalled_s, job, jtype, stack, extra={"job_id": job, "job_type": jtype})

    def _blocking_job(self, frame: FrameType) -> tuple[str, str]:
        codes = self.handlers()
        f: FrameType | None = frame
        while f is not None:
            name = codes.get(f.f_code)
            if name is not None:
                arg = f.f_locals.get(f.f_code.co_varnames[0]) if f.f_code.co_argcount else None
                return str(getattr(arg, "id", "?")), name
            f = f.f_back
        return "?", "unknown handler"
