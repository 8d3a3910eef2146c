"""The children: starting workers, schedulers and the proxy, replacing a process that exits
on its own, and stopping them all (each must exit 0 on SIGTERM)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from streamq._core.keys import GROUP

from . import liveness
from .common import HERE, MAX_ATTEMPTS, ChaosBase, Child
from .proxy import ProxyControl

STARTUP_ERRORS = ("ConnectionError", "BusyLoadingError", "ReadOnlyError", "OutOfMemoryError",
                  "TimeoutError", "BUSY", "read only replica", "used memory > 'maxmemory'")
"""Errors that end a start-up (Redis down, loading, read-only, out of memory or busy for
longer than the start-up's retries; a worker's traceback runs through ``Worker.start``, the
CLI says "Redis answered with an error"): by design the process exits 1 and is started
again."""


class Children(ChaosBase):
    """Starting, watching and stopping the processes of a run."""

    def worker_config(self) -> dict[str, Any]:
        return {"worker": {"concurrency": self.o.concurrency,
                           "visibility_timeout_s": self.o.visibility_s, "promote": False,
                           "heartbeat_interval_s": 0.5, "consumer_dead_after_s": 6.0,
                           "prune_interval_s": 2.0, "block_ms": 1000, "grace_period_s": 3.0,
                           "default_max_attempts": MAX_ATTEMPTS},
                "events_maxlen": self.qcfg.events_maxlen}

    def _spawn(self, name: str, role: str, argv: list[str], grace_file: Path | None = None,
               reload_file: Path | None = None) -> Child:
        """Start ``argv`` (a script or ``-m module`` with its arguments) under a fake host
        clock whose offset file the harness writes (``fakeclock.py``), starting at 0."""
        log = self.dir / f"{role}-{name}.log"
        clock = self.dir / f"clock-{role}-{name}-{len(self.children)}"
        clock.write_text("0\n")
        with open(log, "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, str(HERE / "fakeclock.py"), str(clock), *argv],
                stdout=subprocess.DEVNULL, stderr=err, cwd=HERE,
                env={**os.environ, "PYTHONUNBUFFERED": "1", "STREAMQ_CHAOS_QUEUE": self.queue})
        child = Child(name, role, proc, log, clock=clock, grace_file=grace_file,
                      reload_file=reload_file)
        self.children.append(child)
        return child

    def start_worker(self, slot: str, same_name: bool | None = None) -> None:
        """Start the worker of ``slot`` (``e*`` slots run the embedded worker, ``embedded.py``).
        A replacement takes over its predecessor's name half the time (it then restarts the
        entries pending under that name at once), or comes up under a new name; ``same_name``
        decides instead when given (a name is reused only once its last process exited)."""
        self.generation[slot] += 1
        prev = [c.name for c in self.children if c.role == "worker" and
                c.name.split(".")[0] == slot]
        if prev and (self.rng.random() < 0.5 if same_name is None else same_name):
            name = prev[-1]
        else:
            name = slot if self.generation[slot] == 1 else f"{slot}.{self.generation[slot]}"
        n = len(self.children)
        grace, reloads = self.dir / f"grace-{name}-{n}", self.dir / f"reloads-{name}-{n}"
        config = {**self.worker_config(), "grace_file": str(grace), "reload_file": str(reloads)}
        script = "embedded.py" if slot.startswith("e") else "worker.py"
        self.wslots[slot] = self._spawn(name, "worker", [
            str(HERE / script), self.proxy_url, self.queue,
            str(self.ledger), name, json.dumps(config)], grace, reloads)

    def start_scheduler(self, slot: str) -> None:
        self.sslots[slot] = self._spawn(slot, "scheduler", [
            "-m", "streamq", "--log-level", "WARNING", "scheduler",
            "--queue", self.queue, "--poll-interval", "1",
            "--cron", "cron_entries:ENTRIES",
            "--visibility-timeout", str(self.o.visibility_s),
            "--events-maxlen", str(self.qcfg.events_maxlen), "--url", self.proxy_url])

    def start_proxy(self, target_port: int) -> None:
        with open(self.dir / "proxy.log", "ab") as err:
            self.proxy = subprocess.Popen(
                [sys.executable, str(HERE / "proxy.py"), str(target_port)],
                stdout=subprocess.PIPE, stderr=err)
        assert self.proxy.stdout is not None
        line = self.proxy.stdout.readline().decode().split()
        if len(line) != 2:
            raise RuntimeError(f"proxy did not start; see {self.dir / 'proxy.log'}")
        self.proxy_url = f"redis://127.0.0.1:{line[0]}/0"
        self.ctl = ProxyControl(int(line[1]))

    def watch_draining(self) -> None:
        """Workers stopped gracefully: each must exit 0 within its grace period and 15 s;
        its exit ends the fault's window, and starts its replacement when one waits."""
        for c in list(self.draining):
            ev = c.stopping
            assert ev is not None
            if c.alive():
                if time.time() - ev["t"] > ev["grace_s"] + 15 and not ev.get("late"):
                    ev["late"] = True
                    self.unclean.append(f"{c.name}: graceful stop ({ev['kind']}, grace"
                                        f" {ev['grace_s']} s) still running after 15 s more")
                continue
            self.draining.remove(c)
            c.died = ev["t1"] = time.time()
            ev["exit_s"] = round(c.died - ev["t"], 2)
            ev["rc"] = c.proc.returncode
            if c.proc.returncode != 0:
                self.unclean.append(f"{c.name}: exit {c.proc.returncode} after a graceful stop"
                                    f" (see {c.log})")
            if ev.get("replace_on_exit"):
                self.start_worker(ev["slot"], same_name=True)

    def watch_reloads(self) -> None:
        """An in-process reload ends when the embedded worker wrote its count."""
        for c, ev in list(self.reloading):
            done = 0
            if c.reload_file is not None:
                with contextlib.suppress(OSError, ValueError):
                    done = int(c.reload_file.read_text().strip() or 0)
            if done >= ev["n"] or not c.alive():
                self.reloading.remove((c, ev))
                ev["t1"] = time.time()
                ev["reload_s"] = round(ev["t1"] - ev["t"], 2)
            elif time.time() - ev["t"] > ev["grace_s"] + 15 and not ev.get("late"):
                ev["late"] = True
                self.unclean.append(f"{c.name}: reload (grace {ev['grace_s']} s) not done"
                                    " after 15 s more")

    def watch_children(self) -> None:
        """A process that exits on its own is a finding: record it, and replace it."""
        self.watch_draining()
        self.watch_reloads()
        for slots, start in ((self.wslots, self.start_worker),
                             (self.sslots, self.start_scheduler)):
            for slot, c in slots.items():
                if c is not None and not c.alive():
                    died = time.time()
                    ev = {"name": c.name, "pid": c.pid, "t": died,
                          "rc": c.proc.returncode, "log": str(c.log)}
                    c.died = died
                    tail = c.log.read_text(errors="replace")[-10000:] if c.log.exists() else ""
                    # its start-up gave up on Redis (the CLI says so; a worker's traceback
                    # runs through Worker.start): on a busy machine, a restart LOADING a
                    # large AOF can take longer than the start-up's retries
                    at_startup = time.time() - c.spawned < 120 and (
                        "cannot reach Redis" in tail or (
                            (", in start\n" in tail or "Redis answered with an error" in tail)
                            and any(m in tail for m in STARTUP_ERRORS)))
                    (self.tl.startup_exits if at_startup else self.tl.exits).append(ev)
                    self.say(f"{c.role} {c.name} (pid {c.pid}) exited with"
                             f" {c.proc.returncode}; replacing it")
                    slots[slot] = None
                    start(slot)
        if self.proxy is not None and self.proxy.poll() is not None:
            raise RuntimeError(f"the proxy exited with {self.proxy.returncode}")

    def running_workers(self) -> list[str]:
        return sorted(s for s, c in self.wslots.items()
                      if c is not None and c.alive() and c.stopped_since is None)

    def running_schedulers(self) -> list[str]:
        """Schedulers alive, not frozen and past their start-up."""
        return sorted(s for s, c in self.sslots.items()
                      if c is not None and c.alive() and c.stopped_since is None
                      and time.time() - c.spawned > liveness.STARTUP_S)

    def heartbeat_names(self) -> list[str]:
        assert self.direct is not None
        members: Any = self.direct.zrange(self.keys.workers, 0, -1)
        return [m.decode() for m in members]

    def consumer_names(self) -> list[str]:
        assert self.direct is not None
        raw: Any = self.direct.xinfo_consumers(self.keys.stream, GROUP)
        return [c["name"].decode() if isinstance(c["name"], bytes) else str(c["name"])
                for c in raw]

    def stop_children(self, children: list[Child]) -> list[str]:
        """SIGTERM each live one; each must exit 0 within 30 s. Returns what went wrong."""
        unclean: list[str] = []
        live = [c for c in children if c.alive()]
        for c in live:
            if c.grace_file is not None:  # the configured grace period
                c.grace_file.unlink(missing_ok=True)
            if c.stopped_since is not None:
                os.kill(c.pid, signal.SIGCONT)
                c.stopped_since = None
            c.proc.send_signal(signal.SIGTERM)
        for c in live:
            try:
                rc = c.proc.wait(30)
            except subprocess.TimeoutExpired:
                c.proc.send_signal(signal.SIGUSR1)
                time.sleep(0.5)
                c.proc.kill()
                rc = c.proc.wait()
                unclean.append(f"{c.name}: hung (stacks in {c.log})")
                continue
            if rc != 0:
                unclean.append(f"{c.name}: exit {rc} (see {c.log})")
        return unclean

    def teardown(self) -> dict[str, Any]:
        out: dict[str, Any] = {"unclean": self.unclean + self.stop_children(self.children)}
        if self.proxy is not None:
            self.proxy.kill()
            self.proxy.wait()
            if self.proxy.stdout is not None:
                self.proxy.stdout.close()
        if self.direct is not None:
            self.direct.close()
        if self.server is not None:
            self.server.close()
        return out
