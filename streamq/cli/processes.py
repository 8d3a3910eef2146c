"""``streamq worker --processes N``: a supervisor that runs N worker processes.

Each child is the same command line run again as ``python -m streamq worker ...`` in a fresh
interpreter (the environment marks it a child, so it runs one worker and no supervisor): a
full worker with its own consumer name, leases, connections and lifecycle hooks. A fresh
interpreter rather than a fork: the parent holds no Redis connection, event loop or thread a
fork would copy half-alive, the child is exactly what ``streamq worker`` runs alone (what the
tests and the docs describe), and a child started again after a crash is the same as the first.
The cost is each child importing the app itself (a fork would share those pages): a few MB and
a fraction of a second per child, once.

The supervisor restarts a child that exits on its own (exit code or signal logged) after a
backoff that doubles per quick death of that slot (0.5 s up to 30 s; a child that ran a minute
starts the count again). SIGTERM/SIGINT are passed on to every child (each stops gracefully:
running jobs finish within the grace period or are handed back); a second signal is passed on
too (the children hurry). While stopping, nothing is restarted; the supervisor exits when every
child has, with status 0 when all stopped cleanly. A child that exits with an error code within
30 s of the very first start (a registry that does not import, a wrong option) ends
the whole set with that code: restarting cannot fix a configuration error.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import FrameType

import attrs

log = logging.getLogger("streamq.processes")
CHILD_ENV = "STREAMQ_WORKER_PROCESS"
"""Set in a child's environment (to its slot number): it runs one worker, never a supervisor."""
METRICS_DIR_ENV = "STREAMQ_METRICS_PORT_DIR"
"""Set with ``--metrics-port``: the directory a child writes its metrics port into."""
BACKOFF_S = 0.5
BACKOFF_CAP_S = 30.0
STABLE_S = 60.0
"""A child that ran this long dies for a new reason: its slot's backoff starts again."""
STARTUP_S = 30.0
"""An error exit this soon after the first start is a configuration error: the set stops.
(Generous: on a busy machine a child takes seconds to import the app and connect.)"""


def processes_count(text: str) -> int:
    """``--processes``: a count from 1 up, or ``auto`` (the number of CPUs)."""
    if text == "auto":
        return os.cpu_count() or 1
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"a count of processes (1 or more) or auto, got"
                                         f" {text!r}")
    return n


def child_slot() -> int | None:
    """This process's slot when a supervisor started it, else None."""
    text = os.environ.get(CHILD_ENV)
    return int(text) if text and text.isdigit() else None


def exit_cause(rc: int) -> str:
    """'exit code 3' or 'signal SIGKILL' for a ``Popen.returncode``."""
    if rc >= 0:
        return f"exit code {rc}"
    try:
        return f"signal {signal.Signals(-rc).name}"
    except ValueError:
        return f"signal {-rc}"


def shell_status(rc: int) -> int:
    """A child's status as a shell reports it (128 + N when killed by signal N)."""
    return 128 - rc if rc < 0 else rc


@attrs.define
class Slot:
    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    deaths: int = 0
    """Quick deaths in a row (the backoff doubles with each)."""
    due: float | None = None
    """Monotonic time of a scheduled restart."""
    restarts: int = 0
    signalled: int = 0
    """Signals passed on to the current child (one that started as a signal came is caught
    up by the loop)."""


class Supervisor:
    """Runs ``argv`` (a ``python -m streamq worker`` command line) in ``n`` child processes."""

    def __init__(self, argv: Sequence[str], n: int, env: Mapping[str, str] | None = None
                 ) -> None:
        self.argv = list(argv)
        self.slots = [Slot(i) for i in range(n)]
        self.env = dict(env or {})
        self._signals: list[int] = []
        self._wake = threading.Event()
        self._first_start = 0.0
        self._failed: int | None = None
        """The exit status of a child that could not start (the set's exit status)."""

    def state(self) -> list[tuple[int, int | None, int]]:
        """(slot, pid of its running child or None, restarts) of each slot."""
        return [(s.index, s.proc.pid if s.proc is not None else None, s.restarts)
                for s in self.slots]

    # ----------------------------------------------------------------- signals

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        first = not self._signals
        self._signals.append(signum)
        if first:
            log.info("processes: %s received; stopping %d worker processes gracefully"
                     " (another one hurries them)", signal.Signals(signum).name,
                     sum(s.proc is not None and s.proc.poll() is None for s in self.slots))
        self._forward(signum)
        self._wake.set()

    def _on_child(self, _signum: int, _frame: FrameType | None) -> None:
        self._wake.set()

    def _forward(self, signum: int) -> None:
        for slot in self.slots:
            if slot.proc is not None and slot.proc.poll() is None:
                slot.signalled = len(self._signals)
                with contextlib.suppress(ProcessLookupError):  # it just exited: reaped later
                    slot.proc.send_signal(signum)

    # ----------------------------------------------------------------- children

    def _start(self, slot: Slot) -> None:
        env = {**os.environ, **self.env, CHILD_ENV: str(slot.index)}
        # its own process group: a Ctrl-C reaches the supervisor only, which passes it on once
        slot.proc = subprocess.Popen(self.argv, env=env, process_group=0)
        slot.started = time.monotonic()
        slot.due = None
        slot.signalled = 0
        log.info("processes: worker process %d started (pid %d)", slot.index, slot.proc.pid)

    def _reap(self, slot: Slot, now: float) -> int | None:
        """The exit status of the slot's child when it has exited (and schedule a restart
        unless stopping), else None."""
        proc = slot.proc
        if proc is None or (rc := proc.poll()) is None:
            return None
        slot.proc = None
        if self._signals:
            return rc
        ran = now - slot.started
        cause = exit_cause(rc)
        if rc > 0 and slot.restarts == 0 and now - self._first_start < STARTUP_S:
            log.error("processes: worker process %d (pid %d) exited with %s %.1f s after the"
                      " start; not restarting (a configuration error?): stopping the others",
                      slot.index, proc.pid, cause, ran)
            self._failed = shell_status(rc)
            self._signals.append(signal.SIGTERM)
            self._forward(signal.SIGTERM)
            return rc
        slot.deaths = 1 if ran >= STABLE_S else slot.deaths + 1
        delay = min(BACKOFF_CAP_S, BACKOFF_S * 2 ** (slot.deaths - 1))
        slot.due = now + delay
        log.warning("processes: worker process %d (pid %d) died with %s after %.1f s;"
                    " restarting it in %.1f s", slot.index, proc.pid, cause, ran, delay)
        return rc

    def run(self) -> int:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._on_signal)
        signal.signal(signal.SIGCHLD, self._on_child)
        log.info("processes: starting %d worker processes", len(self.slots))
        self._first_start = time.monotonic()
        worst = 0
        for slot in self.slots:
            if self._signals:
                break
            self._start(slot)
        while True:
            now = time.monotonic()
            for slot in self.slots:
                rc = self._reap(slot, now)
                if rc is not None and self._signals:
                    worst = max(worst, shell_status(rc))
            if self._signals:
                for slot in self.slots:  # a child started while the signal came
                    if (slot.proc is not None and slot.signalled < len(self._signals)
                            and slot.proc.poll() is None):
                        slot.signalled = len(self._signals)
                        with contextlib.suppress(ProcessLookupError):
                            slot.proc.send_signal(self._signals[-1])
                if all(s.proc is None for s in self.slots):
                    log.info("processes: every worker process stopped")
                    return worst if self._failed is None else self._failed
            else:
                for slot in self.slots:
                    if slot.proc is None and slot.due is not None and slot.due <= now:
                        slot.restarts += 1
                        self._start(slot)
            dues = [s.due for s in self.slots if s.proc is None and s.due is not None]
            wait = 1.0 if self._signals or not dues else max(0.0, min(1.0, min(dues) - now))
            self._wake.wait(wait)  # (SIGCHLD or a signal wakes it at once)
            self._wake.clear()


def child_argv(argv: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "streamq", *argv]


def report_metrics_port(serve: Callable[[int], int]) -> bool:
    """In a child of a supervisor with ``--metrics-port``: serve this process's metrics on a
    free loopback port (``serve(0)`` returns it) and write it where the supervisor reads it.
    Returns False elsewhere (the caller serves the port it was given)."""
    where, slot = os.environ.get(METRICS_DIR_ENV), child_slot()
    if not where or slot is None:
        return False
    port = serve(0)
    tmp = os.path.join(where, f".{slot}.{os.getpid()}")
    with open(tmp, "w", encoding="ascii") as f:
        f.write(f"{os.getpid()} {port}\n")
    os.replace(tmp, os.path.join(where, str(slot)))  # the reader sees a whole file or none
    return True


def run_processes(argv: Sequence[str], n: int, metrics_host: str, metrics_port: int | None
                  ) -> int:
    """``streamq worker --processes N``: the supervisor (and, with ``--metrics-port``, the
    one endpoint that serves every child's metrics)."""
    import tempfile

    if metrics_port is None:
        return Supervisor(child_argv(argv), n).run()
    from .merged_metrics import serve_merged

    with tempfile.TemporaryDirectory(prefix="streamq-metrics-") as where:
        sup = Supervisor(child_argv(argv), n, {METRICS_DIR_ENV: where})
        server = serve_merged(metrics_host, metrics_port, where, sup.state)
        try:
            return sup.run()
        finally:
            server.shutdown()
            server.server_close()
