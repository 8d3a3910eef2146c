"""The demos' child processes (workers, a scheduler): started so that stopping a demo leaves
none behind, frozen ones included.

- Each child runs in a process group of its own: a terminal's Ctrl-C reaches the demo only,
  which stops its children in order, and a stop signals the child's whole group.
- A stop sends SIGTERM (the worker drains within its grace period), SIGKILLs a child that is
  frozen (SIGSTOP: a frozen process keeps a SIGTERM pending until it is continued, and the web
  demo's simulated hangs freeze workers on purpose), waits, then SIGKILLs and SIGCONTs every
  group still there.
- A child asks the kernel for SIGKILL when the demo process dies (``PR_SET_PDEATHSIG``, Linux;
  ``streamq.cli.main`` calls :func:`die_with_parent`), so even a demo that is SIGKILLed, or
  interrupted again while it stops, does not leave workers running against a gone Redis.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import FrameType

PARENT_ENV = "STREAMQ_DEMO_PARENT"
"""The demo's pid, in its children's environment (see :func:`die_with_parent`)."""
_PR_SET_PDEATHSIG = 1


def spawn(args: Sequence[str], env: Mapping[str, str] | None = None,
          stderr: int | None = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    """``python -m streamq ARGS`` in a process group of its own, tied to this process."""
    full = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1",
            PARENT_ENV: str(os.getpid())}
    return subprocess.Popen([sys.executable, "-m", "streamq", *args], env=full,
                            stdout=subprocess.DEVNULL, stderr=stderr, process_group=0)


def die_with_parent() -> None:
    """In a demo's child (``$STREAMQ_DEMO_PARENT`` set): be SIGKILLed when the demo dies, and
    exit now if it died already. Nothing elsewhere, or where ``prctl`` is missing."""
    parent = os.environ.pop(PARENT_ENV, "")  # not inherited further down
    if not parent.isdigit() or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != int(parent):  # the demo ended before the request was made
        os._exit(1)


def frozen(pid: int) -> bool:
    """Whether process ``pid`` is stopped (SIGSTOP, or traced)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


def _signal_group(p: subprocess.Popen[bytes], sig: int) -> None:
    if p.poll() is None:  # not reaped: its pid (and group id) is still its own
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(p.pid, sig)


def stop(procs: Sequence[subprocess.Popen[bytes]], grace_s: float = 8.0) -> None:
    """Stop ``procs`` and their process groups: SIGTERM (SIGKILL for a frozen one), up to
    ``grace_s`` seconds for them to drain, then SIGKILL. Returns when every one is reaped."""
    for p in procs:
        _signal_group(p, signal.SIGKILL if frozen(p.pid) else signal.SIGTERM)
    end = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, end - time.monotonic()))
    for p in procs:  # still there: a worker that froze itself while draining, or stuck
        _signal_group(p, signal.SIGKILL)
        _signal_group(p, signal.SIGCONT)
    for p in procs:
        p.wait()


@contextlib.contextmanager
def interrupt_on_sigterm() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt here (as Ctrl-C does), so ``finally`` blocks run and
    the demo stops its children and its private Redis (Python's default ends at once)."""

    def interrupt(_signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
