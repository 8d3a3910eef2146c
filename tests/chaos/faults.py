"""Fault injection: each fault kind of ``FAULTS``, its undo (scheduled, run from the fault
phase's loop) and its entry in the timeline; and the probe thread that notes stalls."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Any

import redis
from redis.exceptions import ResponseError

from streamq._core.retry import TRANSIENT
from streamq.admin import Admin

from . import liveness
from .children import Children
from .common import SERVER_ERROR_FAULTS, Child, transient


class FaultInjection(Children):
    """Injecting faults into the processes, the proxy and the server, and undoing them."""

    def schedule(self, delay_s: float, action: str, slot: str = "", pid: int = 0) -> None:
        self.later.append((time.time() + delay_s, action, slot, pid))

    def run_due(self, everything: bool = False) -> None:
        now = time.time()
        due = sorted(a for a in self.later if everything or a[0] <= now)
        self.later = [a for a in self.later if a not in due]
        for _, action, slot, pid in due:
            if action == "start_worker":
                self.start_worker(slot)
            elif action == "start_worker_new":  # its predecessor may still be stopping
                self.start_worker(slot, same_name=False)
            elif action == "start_scheduler":
                self.start_scheduler(slot)
            elif action == "cont":
                self.cont(self.wslots, "stop_worker", slot, pid)
            elif action == "cont_scheduler":
                self.cont(self.sslots, "stop_scheduler", slot, pid)
            elif action == "undelay":
                assert self.ctl is not None
                self.ctl.send("delay", 0)
            elif action == "undrop":
                self.end_fault("drop_replies", dropped=self.dropped_since_last())
            elif action == "unoom":
                self.server_call("CONFIG", "SET", "maxmemory", "0")
                self.end_fault("oom")
            elif action == "unreadonly":
                self.server_call("REPLICAOF", "NO", "ONE")
                self.end_fault("readonly")
            elif action == "unbusy":
                self.end_busy()
            elif action == "clock_back":
                self.step_clock(pid, 0.0)
            elif action == "resume":
                self.set_paused(False)

    def set_paused(self, paused: bool) -> None:
        """Pause or resume the queue (the ops API, straight to Redis), retried while the
        server is busy, read-only or restarting. The fault's window is from the moment the
        pause returned to the moment the resume was called: nothing may start in it."""
        assert self.direct is not None
        admin = Admin(self.direct, self.qcfg)
        if not paused:
            self.end_fault("pause")  # t1: before the resume is sent
        end = time.monotonic() + 60
        while True:
            try:
                (admin.pause if paused else admin.resume)(self.queue)
                break
            except Exception as exc:
                if time.monotonic() > end or not transient(exc):
                    raise
                time.sleep(0.05)

    def end_fault(self, kind: str, pid: int | None = None, **info: Any) -> None:
        for ev in reversed(self.tl.faults):
            if ev["kind"] == kind and (pid is None or ev.get("pid") == pid):
                ev["t1"] = time.time()
                ev.update(info)
                return

    def dropped_since_last(self) -> int:
        assert self.ctl is not None
        total = int(self.ctl.send("stats")["dropped"])
        n, self.drop_seen = total - self.drop_seen, total
        return n

    def server_call(self, *args: str) -> Any:
        """A command on a direct connection that must get through (a fault's undo): retried
        while the server is busy or restarting."""
        assert self.direct is not None
        end = time.monotonic() + 60
        while True:
            try:
                return self.direct.execute_command(*args)  # type: ignore[no-untyped-call]
            except (*TRANSIENT, ResponseError) as exc:
                if time.monotonic() > end or not transient(exc):
                    raise
                time.sleep(0.1)

    def end_busy(self) -> None:
        """SCRIPT KILL the busy script (again until it is gone), then restore the threshold."""
        assert self.server is not None
        killer = redis.Redis(port=self.server.port, protocol=2, socket_timeout=10)
        try:
            while self.busy_thread is not None and self.busy_thread.is_alive():
                with contextlib.suppress(ResponseError):  # NOTBUSY: not running yet, or ended
                    killer.script_kill()
                self.busy_thread.join(0.2)
        finally:
            killer.close()
        self.busy_thread = None
        self.server_call("CONFIG", "SET", "busy-reply-threshold", self.busy_threshold)
        self.end_fault("busy")

    def step_clock(self, pid: int, offset_s: float) -> None:
        """Step the fake host clock of process ``pid`` to real time + ``offset_s``."""
        for c in self.children:
            if c.pid == pid and c.clock is not None:
                tmp = c.clock.with_suffix(".tmp")
                tmp.write_text(f"{offset_s}\n")
                tmp.replace(c.clock)
                c.clock_offset_s = offset_s
                if offset_s == 0.0:
                    self.end_fault("clock_worker" if c.role == "worker" else "clock_scheduler",
                                   pid)
                return

    def cont(self, slots: dict[str, Child | None], kind: str, slot: str, pid: int) -> None:
        c = slots.get(slot)
        if c is None or c.pid != pid or c.stopped_since is None:
            return
        os.kill(c.pid, signal.SIGCONT)
        for ev in reversed(self.tl.faults):
            if ev["kind"] == kind and ev["pid"] == pid:
                ev["t1"] = time.time()
                break
        c.stopped_since = None

    def server_error(self, kind: str) -> None:
        """Make the server answer OOM, READONLY or BUSY to its clients until undone."""
        assert self.server is not None
        if kind == "oom":
            # noeviction (the default): every write that may grow memory answers OOM
            self.server_call("CONFIG", "SET", "maxmemory", "1")
        elif kind == "readonly":
            # a replica of a master that cannot be reached: writes answer READONLY, blocked
            # clients get UNBLOCKED, nothing is synced (so nothing is flushed: checked with
            # AOF on, the data and the AOF stay as they are), then REPLICAOF NO ONE
            port = self.blackhole.getsockname()[1]
            self.server_call("REPLICAOF", "127.0.0.1", str(port))
        elif kind == "busy":
            # a script that loops until SCRIPT KILL; past the (lowered) busy-reply-threshold
            # every other client's command answers BUSY
            self.busy_threshold = str(self.server_call(
                "CONFIG", "GET", "busy-reply-threshold")[1].decode())
            self.server_call("CONFIG", "SET", "busy-reply-threshold", "100")
            port = self.server.port

            def spin() -> None:
                c = redis.Redis(port=port, protocol=2, socket_timeout=60)
                try:
                    c.eval("while true do end", 0)
                except redis.RedisError:
                    pass  # killed: ERR ... Script killed by user
                finally:
                    c.close()

            self.busy_thread = threading.Thread(target=spin, name="chaos-busy", daemon=True)
            self.busy_thread.start()
            time.sleep(0.05)

    def inject(self, kind: str) -> bool:
        """Inject one fault; False when it does not apply right now."""
        assert self.ctl is not None and self.server is not None
        running = self.running_workers()
        if kind == "kill_worker":
            if len(running) < 2:
                return False
            slot = self.rng.choice(running)
            c = self.wslots[slot]
            assert c is not None
            c.proc.send_signal(signal.SIGKILL)
            c.proc.wait()
            c.died = time.time()
            self.tl.add(kind, name=c.name, pid=c.pid)
            self.wslots[slot] = None
            self.schedule(self.rng.uniform(0.2, 2.0), "start_worker", slot)
        elif kind == "stop_worker":
            if len(running) < 2 or len(running) < len(self.wslots):
                return False  # one frozen worker at a time, the others all running
            slot = self.rng.choice(running)
            c = self.wslots[slot]
            assert c is not None
            c.proc.send_signal(signal.SIGSTOP)
            c.stopped_since = time.time()
            span = self.o.visibility_s + self.rng.uniform(0.5, 3.0)
            self.tl.add(kind, name=c.name, pid=c.pid, t1=c.stopped_since + span)
            self.schedule(span, "cont", slot, c.pid)
        elif kind in ("kill_scheduler", "stop_scheduler"):
            # one scheduler at a time: the others stay up, so promotion and cron must go on
            ready = self.running_schedulers()
            if len(ready) < len(self.sslots) or len(ready) < 2:
                return False
            slot = self.rng.choice(ready)
            c = self.sslots[slot]
            assert c is not None
            if kind == "kill_scheduler":
                c.proc.send_signal(signal.SIGKILL)
                c.proc.wait()
                c.died = time.time()
                self.tl.add(kind, name=c.name, pid=c.pid)
                self.sslots[slot] = None
                self.schedule(self.rng.uniform(0.2, 3.0), "start_scheduler", slot)
            else:
                c.proc.send_signal(signal.SIGSTOP)
                c.stopped_since = time.time()
                span = self.rng.uniform(3.0, 10.0)
                self.tl.add(kind, name=c.name, pid=c.pid, t1=c.stopped_since + span)
                self.schedule(span, "cont_scheduler", slot, c.pid)
        elif kind in ("kill_redis", "loading"):
            # loading: SIGKILL and restart at once; the outage is the restart itself, most of
            # it spent LOADING the large AOF (every client meets LOADING replies)
            if (time.time() - self.last_redis_kill < self.o.redis_kill_gap_s
                    or time.time() < self.server_fault_until):
                return False
            outage = self.rng.uniform(0.0, 3.0) if kind == "kill_redis" else 0.0
            ev = self.tl.add(kind, outage_s=round(outage, 3))
            self.redis_down = True
            self.server.kill()
            time.sleep(outage)
            port = self.server.port
            self.server.restart()
            if self.server.port != port:
                self.ctl.send("target", self.server.port)
            self.redis_down = False
            ev["t1"] = self.last_redis_kill = time.time()
            ev["down_s"] = round(ev["t1"] - ev["t"], 3)
        elif kind == "cut":
            n = self.ctl.send("cut")["cut"]
            self.tl.add(kind, connections=n)
        elif kind == "delay":
            if time.time() < self.delayed_until:
                return False
            ms = round(self.rng.uniform(20, 250))
            span = self.rng.uniform(1.0, 4.0)
            self.ctl.send("delay", ms)
            self.delayed_until = time.time() + span
            self.tl.add(kind, ms=ms, t1=self.delayed_until)
            self.schedule(span, "undelay")
        elif kind == "drop_replies":
            p = round(self.rng.uniform(0.1, 0.4), 2)
            span = self.rng.uniform(1.0, 3.0)
            self.ctl.send("drop", p, round(span * 1000))
            self.tl.add(kind, p=p, t1=time.time() + span)
            self.schedule(span + 0.2, "undrop")
        elif kind in SERVER_ERROR_FAULTS:
            if time.time() < self.server_fault_until:
                return False
            # a blip shorter than a third of the visibility timeout (no lease may lapse in
            # it) or an outage of 1-3 s (1-2 s of BUSY)
            span = (self.rng.uniform(0.2, 0.3) * self.o.visibility_s if self.rng.random() < 0.4
                    else self.rng.uniform(1.0, 2.0 if kind == "busy" else 3.0))
            self.server_fault_until = time.time() + span
            self.server_error(kind)
            self.tl.add(kind, t1=self.server_fault_until)
            self.schedule(span, f"un{kind}")
        elif kind == "pause":
            if time.time() < self.server_fault_until or any(
                    e["kind"] == "pause" and "t1" not in e for e in self.tl.faults):
                return False
            span = self.rng.uniform(1.0, 3.0)
            self.set_paused(True)
            self.tl.add(kind)  # t: once pause returned
            self.schedule(span, "resume")
        elif kind in ("term_short", "term_long", "reload", "reload_proc"):
            return self.graceful(kind)
        elif kind in ("clock_worker", "clock_scheduler"):
            slots = self.wslots if kind == "clock_worker" else self.sslots
            steady = [c for c in slots.values() if c is not None and c.alive()
                      and c.clock_offset_s == 0.0]
            if not steady:
                return False
            c = self.rng.choice(steady)
            offset = round(self.rng.choice((-1, 1)) * self.rng.uniform(5.0, 120.0), 3)
            span = self.rng.uniform(5.0, 20.0)
            self.step_clock(c.pid, offset)
            self.tl.add(kind, name=c.name, pid=c.pid, offset_s=offset, t1=time.time() + span)
            self.schedule(span, "clock_back", c.name, c.pid)
        else:
            raise ValueError(kind)
        return True

    def graceful(self, kind: str) -> bool:
        """A graceful stop, as a deploy or ``uvicorn --reload`` does it (``GRACEFUL_FAULTS``).
        The grace period goes into the child's grace file before the signal: short (0.2-0.5
        s), long (4-6 s) or, for reloads, either or the configured 3 s."""
        embedded = kind in ("reload", "reload_proc")
        ready = [s for s in self.running_workers() if s.startswith("e") == embedded
                 and self._child(s).reload_file is not None
                 and self._child(s).reload_file.exists()  # type: ignore[union-attr]
                 and time.time() - self._child(s).spawned > liveness.STARTUP_S
                 and not any(ev["pid"] == self._child(s).pid for _, ev in self.reloading)]
        if not ready or (not embedded and len(self.running_workers()) < 2):
            return False
        slot = self.rng.choice(ready)
        c = self._child(slot)
        assert c.grace_file is not None
        short, long = round(self.rng.uniform(0.2, 0.5), 2), round(self.rng.uniform(4.0, 6.0), 2)
        g = short if kind == "term_short" else long if kind == "term_long" else \
            self.rng.choice((short, long, 3.0))
        tmp = c.grace_file.with_suffix(".tmp")
        tmp.write_text(f"{g}\n")
        tmp.replace(c.grace_file)
        if kind == "reload":  # in the same process: SIGHUP, done when the file counts it
            c.reloads += 1
            ev = self.tl.add(kind, name=c.name, pid=c.pid, grace_s=g, n=c.reloads)
            c.proc.send_signal(signal.SIGHUP)
            self.reloading.append((c, ev))
            return True
        ev = self.tl.add(kind, name=c.name, pid=c.pid, grace_s=g, slot=slot)
        c.stopping = ev
        c.proc.send_signal(signal.SIGTERM)
        self.wslots[slot] = None
        self.draining.append(c)
        if kind == "reload_proc":  # the reloader starts the new server once the old exited
            ev["replace_on_exit"] = True
        else:  # a rolling deploy: the new pod (a new name) comes up while the old one stops
            self.schedule(self.rng.uniform(0.0, 1.0), "start_worker_new", slot)
        return True

    def _child(self, slot: str) -> Child:
        c = self.wslots[slot]
        assert c is not None
        return c

    def probe(self) -> None:
        """Note every time this process or Redis did not answer for over a second."""
        assert self.server is not None
        client = redis.Redis(port=self.server.port, protocol=2, socket_timeout=5,
                             socket_connect_timeout=1)
        last = time.time()
        while not self.probe_stop.wait(0.25):
            try:
                client.ping()
            except redis.RedisError:  # down, LOADING, BUSY: not a stall of this process
                last = time.time()
                continue
            now = time.time()
            if now - last > 1.0 and not self.redis_down:
                self.tl.stalls.append((last, now))
            last = now
        client.close()
