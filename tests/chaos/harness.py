"""The chaos harness: load, random (seeded) faults, quiesce, then check every accepted job.

Processes (all on 127.0.0.1, nothing touches port 6379):

- one redis-server with AOF, ``appendfsync always`` (the Redis under test), restarted from its
  AOF on the same port and directory after each SIGKILL;
- ``proxy.py`` between every client and that server: it cuts all connections or delays them
  on command;
- worker processes (``worker.py``) and scheduler processes (``streamq scheduler``, the CLI,
  with the cron entries of ``cron_entries.py``), all connected through the proxy and each run
  under a host clock the harness can step (``fakeclock.py``); workers leave promotion to the
  schedulers;
- in this process: a producer thread (through the proxy, retrying a batch with the same job
  ids until it is acknowledged), a probe thread (straight to Redis) that notes stalls, and the
  liveness monitor (``liveness.py``, straight to Redis) that samples every loop's progress.

Every handler execution is recorded by the worker that ran it in an append-only ledger file
(``worker.py`` documents its format). After the fault phase the harness quiesces (no more
faults, frozen workers continued, dead ones replaced), waits (bounded) for the queue to
drain, and checks the invariants listed in ``docs/reliability.md`` against the job records,
the stream, the consumer group, the counters and the ledger.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.exceptions import ResponseError

import schedulers
import streamq
from streamq import ALL_EVENTS, Keys, Queue, QueueConfig
from streamq._core.keys import GROUP
from streamq._core.model import V1_FIELDS, normalize_record, record_state
from streamq._core.retry import TRANSIENT
from streamq._core.server import RedisServer
from streamq.admin import Admin

from . import liveness
from .cron_entries import ENTRIES as CRON_ENTRIES
from .proxy import ProxyControl

HERE = Path(__file__).resolve().parent
KINDS = ("instant", "delayed", "retry", "slow", "slow_sync", "fail")
MIX = (55, 15, 12, 6, 4, 8)
"""Relative share of each kind in KINDS."""
REPORT_KINDS = (*KINDS, "cron")
"""Job kinds in the report: the producer's, and the jobs fired by the cron entries."""
FAULTS = ("kill_worker", "stop_worker", "kill_scheduler", "kill_redis", "cut", "delay",
          "oom", "readonly", "busy", "loading", "drop_replies", "clock_worker",
          "clock_scheduler", "stop_scheduler", "pause")
FAULT_WEIGHTS = (3, 2, 2, 1, 3, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1)
SERVER_ERROR_FAULTS = ("oom", "readonly", "busy")
"""Faults after which the server answers errors for a while (t .. t1), one at a time."""
MAX_ATTEMPTS = 25
"""Generous, so that a job that should complete is never dead-lettered by lapses alone."""
EXPLANATIONS = ("worker_killed", "worker_stopped", "redis_crash", "connection_cut",
                "proxy_delay", "server_error", "stall", "unexplained")
"""Causes of a lapsed lease. Deliberately none: a clock step (leases and due times run on the
server's clock, so a step of a host's clock must not make a lease lapse), and a dropped reply
(the command ran; a repeated start returns the same lease, a dropped renewal renewed)."""
_SERVER_CODES = ("OOM", "READONLY", "BUSY", "LOADING", "UNBLOCKED", "MASTERDOWN", "TRYAGAIN")


def transient(exc: BaseException) -> bool:
    """The harness's own view (independent of the engine's): may the same call succeed later?
    Follows ``__cause__`` (the engine wraps a script's server error in a ScriptError)."""
    cur: BaseException | None = exc
    for _ in range(4):
        if cur is None:
            break
        if isinstance(cur, (*TRANSIENT, redis.exceptions.ReadOnlyError,
                            redis.exceptions.OutOfMemoryError)):
            return True
        if isinstance(cur, ResponseError) and str(cur).split(" ", 1)[0] in _SERVER_CODES:
            return True
        cur = cur.__cause__
    return False
_EXEC_RE = re.compile(r"\[([^\]]+)\]")


@dataclass
class Options:
    minutes: float = 2.0
    """Length of the fault phase (load and faults); quiescing and checks come after it."""
    seed: int = 1
    out: Path | None = None
    workdir: Path | None = None
    """Where the Redis directory, ledger and logs go (default: a temporary directory, removed
    after a passing run)."""
    rate: float = 170.0
    """Jobs per second offered by the producer."""
    workers: int = 3
    schedulers: int = 2
    concurrency: int = 32
    visibility_s: float = 2.0
    fault_every_s: float = 4.0
    """Mean time between two faults."""
    redis_kill_gap_s: float = 15.0
    """Least time between two Redis kills (so that the queue makes progress in between)."""
    drain_timeout_s: float = 120.0
    filler_keys: int = 800_000
    """Keys of 50 bytes in database 1, so that a restart spends about a second LOADING."""
    verbose: bool = True


@dataclass
class Child:
    name: str
    role: str
    proc: subprocess.Popen[bytes]
    log: Path
    stopped_since: float | None = None
    spawned: float = field(default_factory=time.time)
    clock: Path | None = None
    """The offset file of its fake host clock (``fakeclock.py``)."""
    clock_offset_s: float = 0.0
    died: float | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None


@dataclass
class Timeline:
    """What the harness did and saw, in wall-clock seconds (the ledger's clock: one host)."""

    faults: list[dict[str, Any]] = field(default_factory=list)
    stalls: list[tuple[float, float]] = field(default_factory=list)
    """Stalls seen by the probe thread (this process or Redis did not answer in time)."""
    exits: list[dict[str, Any]] = field(default_factory=list)
    """Processes that exited without being told to."""
    startup_exits: list[dict[str, Any]] = field(default_factory=list)
    """Processes that exited at startup because Redis could not be reached (a connection cut
    or a restarting server at that instant): by design they fail fast, and are restarted."""

    def add(self, kind: str, **info: Any) -> dict[str, Any]:
        ev = {"kind": kind, "t": time.time(), **info}
        self.faults.append(ev)
        return ev


class ChaosServer(RedisServer):
    """RedisServer with a longer readiness wait: loading a large AOF takes a while."""

    def _wait_ready(self) -> bool:
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5, protocol=2)
        try:
            end = time.monotonic() + 120
            while time.monotonic() < end:
                assert self.proc is not None
                if self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.exceptions.ConnectionError:  # BusyLoadingError included
                    pass
                time.sleep(0.05)
            return False
        finally:
            client.close()


# --------------------------------------------------------------------------- producer


def job_spec(i: int, rng: random.Random) -> dict[str, Any]:
    kind = rng.choices(KINDS, MIX)[0]
    spec: dict[str, Any] = {"type": f"chaos.{kind}", "job_id": f"{kind}-{i:07d}",
                            "max_attempts": MAX_ATTEMPTS, "payload": {}}
    if kind == "delayed":
        spec["delay"] = round(rng.uniform(1.0, 5.0), 3)
    elif kind == "retry":
        spec["payload"] = {"fails": rng.choice((1, 2)), "d": round(rng.uniform(0.2, 1.0), 2)}
    elif kind in ("slow", "slow_sync"):
        spec["payload"] = {"s": round(rng.uniform(0.5, 3.0), 2)}
    return spec


def kind_of(job_id: str) -> str:
    return "cron" if job_id.startswith("cron:") else job_id.rsplit("-", 1)[0]


class Producer(threading.Thread):
    """Offers ``rate`` jobs per second until told to stop; a batch whose reply is lost is sent
    again with the same ids until acknowledged (a duplicate then means: ours, accepted)."""

    def __init__(self, url: str, queue: str, qcfg: QueueConfig, rate: float, seed: int) -> None:
        super().__init__(name="chaos-producer", daemon=True)
        self.url, self.queue, self.qcfg, self.rate = url, queue, qcfg, rate
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.accepted: dict[str, str] = {}
        self.fails: dict[str, int] = {}
        """Planned failures of each retrying job."""
        self.resent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        q = Queue.from_url(self.url, self.queue, self.qcfg)
        try:
            t0 = time.monotonic()
            i = 0
            while not self.stop.is_set():
                due = int((time.monotonic() - t0) * self.rate)
                if due <= i:
                    time.sleep(0.05)
                    continue
                n = min(due - i, 500)
                self._send(q, [job_spec(i + k, self.rng) for k in range(n)])
                i += n
        except BaseException as exc:  # noqa: BLE001 - reported by the harness
            self.error = exc
        finally:
            q.close()

    def _send(self, q: Queue, batch: list[dict[str, Any]]) -> None:
        give_up = time.monotonic() + 180
        while True:
            try:
                results = q.enqueue_many(batch)
                break
            except Exception as exc:
                if time.monotonic() > give_up or not transient(exc):
                    raise
                self.resent += 1
                time.sleep(0.2)
        for spec, res in zip(batch, results, strict=True):
            if res.status not in ("queued", "scheduled", "duplicate"):
                raise RuntimeError(f"job {res.job_id} not accepted: {res}")
            self.accepted[spec["job_id"]] = kind = kind_of(spec["job_id"])
            if kind == "retry":
                self.fails[spec["job_id"]] = spec["payload"]["fails"]


# --------------------------------------------------------------------------- the run


class Chaos:
    def __init__(self, opts: Options) -> None:
        self.o = opts
        self.rng = random.Random(f"faults-{opts.seed}")
        self.queue = f"chaos-{opts.seed}"
        self.keys = Keys(self.queue)
        planned = int(opts.rate * opts.minutes * 60)
        self.qcfg = QueueConfig(events_maxlen=max(100_000, planned * 10), event_kinds=ALL_EVENTS)
        self._own_dir = opts.workdir is None
        self.dir = Path(opts.workdir or tempfile.mkdtemp(prefix="streamq-chaos-"))
        if self.dir.exists() and any(self.dir.iterdir()):
            # a reused working directory: an old ledger or AOF would mix with this run's
            if not (self.dir / "ledger.jsonl").exists():
                raise RuntimeError(f"{self.dir} is not empty and not a chaos working directory")
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ledger = self.dir / "ledger.jsonl"
        self.ledger.touch()
        self.tl = Timeline()
        self.server: ChaosServer | None = None
        self.proxy: subprocess.Popen[bytes] | None = None
        self.ctl: ProxyControl | None = None
        self.proxy_url = ""
        self.direct: redis.Redis | None = None
        self.wslots: dict[str, Child | None] = {}
        self.sslots: dict[str, Child | None] = {}
        self.children: list[Child] = []
        self.later: list[tuple[float, str, str, int]] = []
        self.generation: collections.Counter[str] = collections.Counter()
        self.delayed_until = 0.0
        self.last_redis_kill = -1e9
        self.redis_down = False
        self.probe_stop = threading.Event()
        self.timing: dict[str, float] = {}
        self.liveness: dict[str, str] = {}
        self.redis_version = ""
        self.server_fault_until = 0.0
        """Until then an OOM, READONLY or BUSY fault is on (one at a time)."""
        self.blackhole = socket.socket()
        """A port bound and never listened on: the master that READONLY's REPLICAOF names.
        Holding it means no other process can ever listen there and sync its data into ours."""
        self.busy_thread: threading.Thread | None = None
        self.busy_threshold = "5000"
        self.drop_seen = 0
        self.monitor: liveness.Monitor | None = None
        self.fault_window = (0.0, 0.0)
        self.monitor_until = 0.0
        self.engine = {"streamq": str(Path(streamq.__file__).parent),
                       "schedulers": str(Path(schedulers.__file__).parent),
                       "repo_head": _git("rev-parse", "--short", "HEAD"),
                       "uncommitted": _git("status", "--porcelain", "--", "streamq",
                                           "schedulers").splitlines()}
        """The code under test, as it was when the run began."""
        self.unclean: list[str] = []

    def say(self, msg: str) -> None:
        if self.o.verbose:
            print(f"[chaos {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # ----------------------------------------------------------------- processes

    def worker_config(self) -> dict[str, Any]:
        return {"worker": {"concurrency": self.o.concurrency,
                           "visibility_timeout_s": self.o.visibility_s, "promote": False,
                           "heartbeat_interval_s": 0.5, "consumer_dead_after_s": 6.0,
                           "prune_interval_s": 2.0, "block_ms": 1000, "grace_period_s": 3.0,
                           "default_max_attempts": MAX_ATTEMPTS},
                "events_maxlen": self.qcfg.events_maxlen}

    def _spawn(self, name: str, role: str, argv: list[str]) -> Child:
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
        child = Child(name, role, proc, log, clock=clock)
        self.children.append(child)
        return child

    def start_worker(self, slot: str) -> None:
        self.generation[slot] += 1
        prev = [c.name for c in self.children if c.role == "worker" and
                c.name.split(".")[0] == slot]
        # a replacement takes over its predecessor's name half the time (it then restarts the
        # entries pending under that name at once), or comes up under a new name
        if prev and self.rng.random() < 0.5:
            name = prev[-1]
        else:
            name = slot if self.generation[slot] == 1 else f"{slot}.{self.generation[slot]}"
        self.wslots[slot] = self._spawn(name, "worker", [
            str(HERE / "worker.py"), self.proxy_url, self.queue,
            str(self.ledger), name, json.dumps(self.worker_config())])

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

    def schedule(self, delay_s: float, action: str, slot: str = "", pid: int = 0) -> None:
        self.later.append((time.time() + delay_s, action, slot, pid))

    def run_due(self, everything: bool = False) -> None:
        now = time.time()
        due = sorted(a for a in self.later if everything or a[0] <= now)
        self.later = [a for a in self.later if a not in due]
        for _, action, slot, pid in due:
            if action == "start_worker":
                self.start_worker(slot)
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

    def watch_children(self) -> None:
        """A process that exits on its own is a finding: record it, and replace it."""
        for slots, start in ((self.wslots, self.start_worker),
                             (self.sslots, self.start_scheduler)):
            for slot, c in slots.items():
                if c is not None and not c.alive():
                    died = time.time()
                    ev = {"name": c.name, "pid": c.pid, "t": died,
                          "rc": c.proc.returncode, "log": str(c.log)}
                    c.died = died
                    tail = c.log.read_text(errors="replace")[-2000:] if c.log.exists() else ""
                    at_startup = time.time() - c.spawned < 20 and (
                        "ConnectionError" in tail or "cannot reach Redis" in tail)
                    (self.tl.startup_exits if at_startup else self.tl.exits).append(ev)
                    self.say(f"{c.role} {c.name} (pid {c.pid}) exited with"
                             f" {c.proc.returncode}; replacing it")
                    slots[slot] = None
                    start(slot)
        if self.proxy is not None and self.proxy.poll() is not None:
            raise RuntimeError(f"the proxy exited with {self.proxy.returncode}")

    # ----------------------------------------------------------------- faults

    def running_workers(self) -> list[str]:
        return sorted(s for s, c in self.wslots.items()
                      if c is not None and c.alive() and c.stopped_since is None)

    def running_schedulers(self) -> list[str]:
        """Schedulers alive, not frozen and past their start-up."""
        return sorted(s for s, c in self.sslots.items()
                      if c is not None and c.alive() and c.stopped_since is None
                      and time.time() - c.spawned > liveness.STARTUP_S)

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

    # ----------------------------------------------------------------- phases

    def run(self) -> dict[str, Any]:
        t_start = time.time()
        producer: Producer | None = None
        probe: threading.Thread | None = None
        try:
            self.server = ChaosServer(aof=True, directory=str(self.dir / "redis"))
            (self.dir / "redis").mkdir(exist_ok=True)
            self.server.start()
            self.direct = redis.Redis(port=self.server.port, protocol=2, socket_timeout=30)
            info: Any = self.direct.info("server")
            self.redis_version = f"{self.server.binary} {info.get('redis_version')}"
            self.blackhole.bind(("127.0.0.1", 0))
            self.fill()
            self.start_proxy(self.server.port)
            for k in range(self.o.workers):
                self.wslots[f"w{k + 1}"] = None
                self.start_worker(f"w{k + 1}")
            for k in range(self.o.schedulers):
                self.sslots[f"s{k + 1}"] = None
                self.start_scheduler(f"s{k + 1}")
            direct = self.direct
            self.wait_for(lambda: direct.zcard(self.keys.workers) >= self.o.workers, 60,
                          "the workers are up")
            self.timing["setup_s"] = time.time() - t_start
            self.say(f"seed {self.o.seed}, queue {self.queue}, dir {self.dir}, redis port"
                     f" {self.server.port}, proxy {self.proxy_url}")

            probe = threading.Thread(target=self.probe, name="chaos-probe", daemon=True)
            probe.start()
            self.monitor = liveness.Monitor(self.server.port, self.keys)
            self.monitor.start()
            producer = Producer(self.proxy_url, self.queue, self.qcfg, self.o.rate, self.o.seed)
            producer.start()
            self.fault_phase(producer)
            self.quiesce(producer)
            self.monitor.close()
            report = self.check(producer)
        finally:
            self.probe_stop.set()
            if self.monitor is not None:
                self.monitor.close()
            self.blackhole.close()
            if producer is not None:
                producer.stop.set()
            shutdown = self.teardown()
        report["shutdown"] = shutdown
        if report["shutdown"]["unclean"]:
            report["failures"].append(f"processes did not stop cleanly on SIGTERM:"
                                      f" {report['shutdown']['unclean']}")
        self.timing["total_s"] = time.time() - t_start
        report["timing"] = {k: round(v, 1) for k, v in self.timing.items()}
        report["ok"] = not report["failures"]
        if report["ok"] and self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            report["workdir"] = str(self.dir)
        return report

    def fill(self) -> None:
        """Make the AOF large (filler keys in database 1, rewritten into the AOF's RDB base) so
        that a restart spends a noticeable time LOADING, as a production restart does."""
        assert self.server is not None
        if self.o.filler_keys <= 0:
            return
        t0 = time.time()
        r = redis.Redis(port=self.server.port, protocol=2, db=1, socket_timeout=120)
        script = ("local v = string.rep('x', 50) for i = tonumber(ARGV[1]), tonumber(ARGV[2])"
                  " do redis.call('SET', 'filler:' .. i, v) end return 1")
        for lo in range(0, self.o.filler_keys, 100_000):
            r.eval(script, 0, lo, min(self.o.filler_keys, lo + 100_000) - 1)
        time.sleep(0.2)  # the server may start an automatic rewrite: then wait for it instead
        with contextlib.suppress(ResponseError):  # already in progress
            r.bgrewriteaof()
        while True:
            pers: Any = r.info("persistence")
            if not pers["aof_rewrite_in_progress"] and not pers["aof_rewrite_scheduled"]:
                break
            time.sleep(0.1)
        r.close()
        self.timing["fill_s"] = time.time() - t0

    def wait_for(self, pred: Callable[[], Any], timeout_s: float, what: str) -> bool:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                if pred():
                    return True
            except TRANSIENT:
                pass
            time.sleep(0.2)
        self.say(f"gave up after {timeout_s:g}s waiting until {what}")
        return False

    def fault_phase(self, producer: Producer) -> None:
        t0 = time.time()
        end = t0 + self.o.minutes * 60
        first = list(FAULTS)  # every kind once, in a seeded order, then at random
        self.rng.shuffle(first)
        next_fault = t0 + 3.0
        last_report = t0
        self.fault_window = (t0, end)
        while time.time() < end:
            self.run_due()
            self.watch_children()
            if producer.error is not None:
                raise RuntimeError("the producer failed") from producer.error
            now = time.time()
            if now >= next_fault:
                if first:
                    kind = first.pop(0)
                    if not self.inject(kind):  # not now: try the next kind, this one later
                        first.append(kind)
                else:
                    kind = self.rng.choices(FAULTS, FAULT_WEIGHTS)[0]
                    if not self.inject(kind):
                        self.inject("cut")
                next_fault = time.time() + self.rng.uniform(0.5, 1.5) * self.o.fault_every_s
            if now - last_report >= 15:
                last_report = now
                self.progress(producer)
            time.sleep(0.05)
        self.timing["fault_phase_s"] = time.time() - t0

    def progress(self, producer: Producer) -> None:
        assert self.direct is not None
        try:
            done: Any = self.direct.hmget(self.keys.stats, "completed", "failed")
            fin = sum(int(x or 0) for x in done)
        except redis.RedisError:  # down, LOADING, BUSY
            fin = -1
        kinds = collections.Counter(ev["kind"] for ev in self.tl.faults)
        self.say(f"accepted {len(producer.accepted)}, finished {fin}; faults {dict(kinds)}")

    def quiesce(self, producer: Producer) -> None:
        t0 = time.time()
        # undo every fault still in force first (replacements start, frozen workers go on,
        # READONLY/OOM/BUSY lifted): a producer retrying a batch through a fault whose undo
        # was still pending would otherwise retry until it gives up
        self.run_due(everything=True)
        producer.stop.set()
        producer.join(200)
        if producer.error is not None:
            raise RuntimeError("the producer failed") from producer.error
        assert self.ctl is not None and self.direct is not None
        self.ctl.send("delay", 0)
        self.ctl.send("drop", 0, 0)
        self.watch_children()
        self.say(f"quiescing: {len(producer.accepted)} jobs accepted; waiting for the queue"
                 " to drain")
        self.wait_for(lambda: self.drained(producer), self.o.drain_timeout_s,
                      "the queue drained")
        self.timing["drain_s"] = time.time() - t0
        self.probe_liveness(producer)
        self.wait_for(lambda: self.drained(producer), 30, "the probe jobs finished")
        # executions still running in live processes (a woken zombie) end by themselves
        self.wait_for(lambda: not self.running_executions(), 20, "no handler runs any more")
        live = {c.name for c in self.wslots.values() if c is not None}
        self.wait_for(lambda: set(self.consumer_names()) == live == set(self.heartbeat_names()),
                      6 + 3 * 2 + 10, "dead consumers and their heartbeats were pruned")
        # the schedulers stop here (SIGTERM, checked like the others) so that no cron tick
        # fires while the records and counters are read; the last fired job drains first
        self.monitor_until = time.time()
        scheds = [c for c in self.sslots.values() if c is not None]
        self.unclean += self.stop_children(scheds)
        for c in scheds:
            c.died = time.time()
        self.sslots = dict.fromkeys(self.sslots)
        self.wait_for(lambda: self.drained(producer), 30, "the last cron jobs finished")
        self.timing["quiesce_s"] = time.time() - t0

    def drained(self, producer: Producer) -> bool:
        assert self.direct is not None
        self.watch_children()
        r, k = self.direct, self.keys
        done: Any = r.hmget(k.stats, "completed", "failed")
        pending: Any = r.xpending(k.stream, GROUP)
        return (sum(int(x or 0) for x in done) >= len(producer.accepted)
                and r.xlen(k.stream) == 0 and r.zcard(k.delayed) == 0
                and int(pending["pending"]) == 0)

    def probe_liveness(self, producer: Producer) -> None:
        """Every scheduler and worker still alive must still do its job: each one in turn,
        alone (the others of its kind frozen), must promote (schedulers) or run (workers) a
        probe job. A process that lives on with a dead loop inside fails here."""
        assert self.direct is not None
        r = self.direct
        q = Queue(r, self.queue, self.qcfg)
        for role, slots in (("scheduler", self.sslots), ("worker", self.wslots)):
            for slot in sorted(slots):
                c = slots[slot]
                if c is None or not c.alive():
                    continue
                others = [o for o in slots.values() if o is not None and o is not c
                          and o.alive()]
                frozen = []
                for o in others:
                    o.proc.send_signal(signal.SIGSTOP)
                    # not a fault, but the liveness checks must not count it against o
                    frozen.append(self.tl.add("probe_freeze", name=o.name, pid=o.pid))
                try:
                    kind = "delayed" if role == "scheduler" else "instant"
                    jid = f"{kind}-p{len(self.liveness)}"
                    if role == "worker":
                        time.sleep(1.5)  # any XREADGROUP BLOCK of the frozen ones times out
                    offset = self.ledger.stat().st_size
                    q.enqueue(f"chaos.{kind}", {}, job_id=jid, max_attempts=MAX_ATTEMPTS,
                              delay=0.5 if role == "scheduler" else None)
                    producer.accepted[jid] = kind
                    key, pid = self.keys.job(jid), c.pid

                    def promoted(key: str = key) -> bool:
                        st: Any = r.hmget(key, "s", "state")
                        return record_state(st[0] or st[1]) not in ("", "scheduled")

                    def ran(jid: str = jid, pid: int = pid, offset: int = offset) -> bool:
                        starts = read_ledger(self.ledger, offset).starts.get(jid, [])
                        return any(e["pid"] == pid for e in starts)

                    ok = self.wait_for(promoted if role == "scheduler" else ran, 15,
                                       f"{role} {c.name} handled a probe job on its own")
                    self.liveness[f"{role} {c.name} (pid {c.pid})"] = "ok" if ok else "STUCK"
                finally:
                    for o in others:
                        o.proc.send_signal(signal.SIGCONT)
                    for ev in frozen:
                        ev["t1"] = time.time()

    def running_executions(self) -> list[str]:
        live = {c.pid for c in self.wslots.values() if c is not None and c.alive()}
        led = read_ledger(self.ledger)
        return [x for x, s in led.starts_by_x.items() if s["pid"] in live and x not in led.ends]

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

    # ----------------------------------------------------------------- checks

    def check(self, producer: Producer) -> dict[str, Any]:
        t0 = time.time()
        assert self.direct is not None
        r, k = self.direct, self.keys
        accepted = dict(producer.accepted)
        cron_ids = self.cron_job_ids()
        accepted.update(dict.fromkeys(cron_ids, "cron"))
        ids = sorted(accepted)
        records: dict[str, dict[bytes, bytes]] = {}
        for chunk in _chunks(ids, 1000):
            pipe = r.pipeline(transaction=False)
            for i in chunk:
                pipe.hgetall(k.job(i))
            records.update(zip(chunk, map(_long_names, pipe.execute()), strict=True))
        led = read_ledger(self.ledger)
        events = self.read_events()
        v = Verdict()
        kill_ev = [e for e in self.tl.faults if e["kind"] == "kill_worker"]
        stop_ev = [e for e in self.tl.faults if e["kind"] == "stop_worker"]
        crash_ev = [e for e in self.tl.faults if e["kind"] == "kill_redis"]
        crash_ev += [e for e in self.tl.faults if e["kind"] == "loading"]
        cut_ev = [e for e in self.tl.faults if e["kind"] == "cut"]
        delay_ev = [e for e in self.tl.faults if e["kind"] == "delay"]
        error_ev = [e for e in self.tl.faults if e["kind"] in SERVER_ERROR_FAULTS]
        vt = self.o.visibility_s

        def explain(e: dict[str, Any], execs: list[dict[str, Any]]) -> str:
            """Why the lease of execution ``e`` lapsed: a fault between the start of that lease
            (start.lua's 'started' event; the handler may begin much later) and the takeover
            (the next start of the job, executed or not)."""
            jid, a = e["job"], e["a"]
            starts = events.started.get(jid, {})
            later = [t for n, t in starts.items() if n > a]
            later += [s["t"] for s in execs if s["a"] > a]
            lo = min(e["t"], starts.get(a, e["t"])) - 0.05
            hi = min(later) + 0.5 if later else time.time()
            if any(x["pid"] == e["pid"] and lo <= x["t"] <= hi for x in kill_ev):
                return "worker_killed"
            if any(x["pid"] == e["pid"] and x["t"] <= hi and x["t1"] >= lo for x in stop_ev):
                return "worker_stopped"
            if any(x["t"] <= hi and x["t1"] >= lo for x in crash_ev):
                return "redis_crash"
            if any(lo - vt <= x["t"] <= hi for x in cut_ev):
                return "connection_cut"
            if any(x["t"] <= hi and x["t1"] >= lo - vt for x in delay_ev):
                return "proxy_delay"
            # renewals come every vt/3: when an error window opens a lease may be up to vt/3
            # old, and the first renewal after the window may come up to vt/3 after it; so a
            # window of vt/3 or more can cost a lease, a shorter blip must not (and neither
            # may a dropped reply: the command ran, a dropped renewal renewed)
            if any(x["t"] <= hi and x["t1"] >= lo - vt and x["t1"] - x["t"] >= vt / 3
                   for x in error_ev):
                return "server_error"
            stalls = [s for s in led.stalls if s[0] == e["pid"]]
            if any(a <= hi and b >= lo - 1 for _, a, b in stalls) or any(
                    a <= hi and b >= lo - 1 for a, b in self.tl.stalls):
                return "stall"
            return "unexplained"

        for jid in ids:
            kind = accepted[jid]
            v.jobs[kind] += 1
            h = records.get(jid) or {}
            state = h.get(b"state", b"").decode()
            if state not in ("completed", "failed", "cancelled"):
                v.lost.append(f"{jid}: {state or 'no record'}")
                continue
            expected = "failed" if kind == "fail" else "completed"
            if state != expected:
                v.wrong.append(f"{jid}: {state} ({h.get(b'reason', b'').decode()})")
                continue
            v.outcome[kind][state] += 1
            attempts = int(h.get(b"attempts", b"0"))
            execs = led.starts.get(jid, [])
            v.executions[kind] += len(execs)
            atts = [e["a"] for e in execs]
            if len(set(atts)) != len(atts):
                v.add("attempt number executed twice (a lease token reissued)", jid, atts)
            if len(execs) > attempts or any(a > attempts for a in atts):
                v.add("more executions than counted attempts", jid, (atts, attempts))
            v.skipped_attempts += attempts - len(set(atts))
            # the outcome in the record: written by the execution of the last attempt
            if state == "completed":
                result = json.loads(h[b"result"])
                end = led.ends.get(str(result.get("x")) if isinstance(result, dict) else "")
                if end is None or end["job"] != jid or end["o"] != "ok" or end["r"] != result:
                    v.add("completed result matches no recorded execution", jid, result)
                elif end["a"] != attempts:
                    v.add("result written by an execution that was not the last attempt",
                          jid, (end["a"], attempts))
                elif result.get("w") != h.get(b"owner", b"").decode():
                    v.add("result written by another worker than the lease owner", jid,
                          (result, h.get(b"owner")))
            else:
                m = _EXEC_RE.search(h.get(b"reason", b"").decode())
                end = led.ends.get(m.group(1)) if m else None
                if end is None or end["job"] != jid or end["o"] != "fail":
                    v.add("dead-letter reason matches no recorded execution", jid,
                          h.get(b"reason"))
                elif end["a"] != attempts:
                    v.add("dead-lettered by an execution that was not the last attempt", jid,
                          (end["a"], attempts))
            errors = json.loads(h.get(b"errors", b"[]"))
            retried = {int(x["attempt"]) for x in errors if x.get("type") == "Retry"}
            for a in retried:
                if not any(e["a"] == a and led.ends.get(e["x"], {}).get("o") == "retry"
                           for e in execs):
                    v.add("retry applied for an attempt that did not end in Retry", jid, a)
            if kind == "retry" and attempts <= producer.fails[jid]:
                v.add("retrying job completed before its planned failures", jid, attempts)
            if kind == "delayed" and int(h[b"started"]) < int(h[b"due"]):
                v.add("delayed job started before it was due", jid,
                      (int(h[b"started"]), int(h[b"due"])))
            # executions whose outcome was not applied: duplicates, each needing a lapse
            applied = retried | {attempts}
            for e in execs:
                if e["a"] in applied:
                    continue
                why = explain(e, execs)
                v.duplicates[kind] += 1
                v.explained[why] += 1
                if why == "unexplained":
                    v.unexplained.append({"job": jid, "execution": e, "attempts": atts,
                                          "end": led.ends.get(e["x"])})
        unknown = set(led.starts) - set(accepted)
        if unknown:
            v.add("executions of jobs never accepted", sorted(unknown)[0], len(unknown))

        # the keys of the queue: live work only, no orphans
        raw_stats: Any = r.hgetall(k.stats)
        stats = {key.decode(): int(val) for key, val in raw_stats.items()}
        pending: Any = r.xpending(k.stream, GROUP)
        keyspace: dict[str, int] = {"stream_len": r.xlen(k.stream),
                                    "pel": int(pending["pending"]),
                                    "delayed": r.zcard(k.delayed), "dead_len": r.xlen(k.dead)}
        n_fail = sum(1 for x in accepted.values() if x == "fail")
        dead_jobs = collections.Counter(kind_of(j) for j in self.dead_job_ids())
        if keyspace["stream_len"] or keyspace["pel"] or keyspace["delayed"]:
            v.add("orphans left in the stream, PEL or delayed set", "-", keyspace)
        if keyspace["dead_len"] != n_fail or set(dead_jobs) - {"fail"}:
            v.add("dead letters differ from the always-failing jobs", "-",
                  (keyspace["dead_len"], n_fail, dict(dead_jobs)))
        expect = {"enqueued": len(accepted), "completed": len(accepted) - n_fail,
                  "failed": n_fail, "retrying_now": 0,
                  "started": sum(int(h.get(b"attempts", b"0")) for h in records.values())}
        for name, want in expect.items():
            if stats.get(name, 0) != want:
                v.add("counter off", name, (stats.get(name, 0), want))

        # the lifecycle events: each job reached its terminal state exactly once
        if events.complete:
            for jid, kind in accepted.items():
                once = {"failed": 1} if kind == "fail" else {"completed": 1}
                got = events.terminal.get(jid, {})
                if got != once:
                    v.add("not exactly one terminal event", jid, got)

        # pause is atomic: once pause returned, nothing of the queue started until the resume
        # was sent (start.lua's 'started' events, server ms; a start within the same ms as
        # the resume is not counted)
        if events.complete:
            for ev in (e for e in self.tl.faults if e["kind"] == "pause"):
                inside = [j for t, j in events.starts if ev["t"] < t < ev["t1"] - 0.001]
                if inside:
                    v.add("jobs started while the queue was paused", inside[0],
                          {"pause": (ev["t"], ev["t1"]), "started": len(inside)})

        # consumers: only names this run started, and the dead ones pruned
        names = self.consumer_names()
        started_names = {c.name for c in self.children if c.role == "worker"}
        live = {c.name for c in self.wslots.values() if c is not None}
        consumers = {"final": sorted(names), "live": sorted(live),
                     "started": len(started_names)}
        if set(names) - started_names:
            v.add("consumers nobody started", "-", sorted(set(names) - started_names))
        if set(names) != live:
            v.add("consumers of dead workers not pruned", "-", sorted(set(names) - live))
        beats = self.heartbeat_names()
        consumers["heartbeats"] = sorted(beats)
        if set(beats) != live:  # the workers ZSET must not leak dead workers either
            v.add("workers ZSET differs from the live workers", "-",
                  {"dead": sorted(set(beats) - live), "missing": sorted(live - set(beats))})

        faults = collections.Counter(e["kind"] for e in self.tl.faults)
        failures = [f"{what}: {n} (e.g. {ex})" for what, (n, ex) in v.problems.items()]
        if v.lost:
            failures.append(f"lost: {len(v.lost)} (e.g. {v.lost[:5]})")
        if v.wrong:
            failures.append(f"wrong terminal state: {len(v.wrong)} (e.g. {v.wrong[:5]})")
        if v.unexplained:
            failures.append(f"duplicates without a lapse: {len(v.unexplained)}"
                            f" (e.g. {v.unexplained[:3]})")
        stuck = [name for name, state in self.liveness.items() if state != "ok"]
        if stuck:
            failures.append(f"alive but not working (liveness probe): {stuck}")
        if self.tl.exits:
            failures.append(f"processes exited on their own: {self.tl.exits}")
        missing = [f for f in FAULTS if not faults[f]]
        if missing:
            failures.append(f"fault kinds never injected: {missing}")
        loops = self.check_liveness(led, records, cron_ids)
        for name, c in loops.items():
            if not c["ok"]:
                failures.append(f"liveness {name} (bound {c['bound_s']:g} s):"
                                f" {c['violations']} of {c['checked']} over the bound, worst"
                                f" {c['worst_s']:g} s (e.g. {c['examples'][:2]})")
        self.timing["check_s"] = time.time() - t0
        return {
            "seed": self.o.seed, "minutes": self.o.minutes, "options": _plain(asdict(self.o)),
            "engine": {**self.engine, "redis": self.redis_version},
            "jobs": {kind: {"accepted": v.jobs[kind], **v.outcome[kind],
                            "executions": v.executions[kind],
                            "duplicates": v.duplicates[kind]} for kind in REPORT_KINDS},
            "accepted": len(accepted), "lost": len(v.lost), "wrong_state": len(v.wrong),
            "faults": {f: faults[f] for f in FAULTS},
            "duplicates": sum(v.duplicates.values()),
            "duplicates_by_cause": {w: v.explained[w] for w in EXPLANATIONS},
            "skipped_attempts": v.skipped_attempts,
            "executions": sum(v.executions.values()),
            "producer_resends": producer.resent,
            "stalls_seen": {"harness": len(self.tl.stalls), "workers": len(led.stalls)},
            "harness_stalls": self.tl.stalls,
            "stats": stats, "keyspace": keyspace, "consumers": consumers,
            "liveness": self.liveness, "liveness_checks": loops,
            "fault_phase": self.fault_window,
            "monitor": {"samples": len(self.monitor.samples) if self.monitor else 0,
                        "failed_samples": dict(self.monitor.errors) if self.monitor else {}},
            "worker_processes": sum(1 for c in self.children if c.role == "worker"),
            "log_errors": self.log_errors(),
            "fault_log": self.tl.faults, "unexpected_exits": self.tl.exits,
            "startup_exits": self.tl.startup_exits,
            "unexplained": v.unexplained[:50], "failures": failures,
        }

    def cron_job_ids(self) -> list[str]:
        """Every job the cron entries fired (a SCAN: this is a test, not a user path)."""
        assert self.direct is not None
        prefix = self.keys.job("cron:")
        return sorted(key.decode()[len(prefix) - len("cron:"):]
                      for key in self.direct.scan_iter(match=prefix + "*", count=1000))

    def check_liveness(self, led: LedgerView, records: dict[str, dict[bytes, bytes]],
                       cron_ids: list[str]) -> dict[str, dict[str, Any]]:
        """The loops' progress after every fault (``liveness.py``), one verdict per check."""
        assert self.monitor is not None
        procs = [liveness.Proc(c.name, c.role, c.pid, c.spawned, c.died) for c in self.children]
        starts: dict[int, list[float]] = collections.defaultdict(list)
        for x in led.starts_by_x.values():
            starts[int(x["pid"])].append(float(x["t"]))
        cron_jobs = {}
        for jid in cron_ids:
            h = records.get(jid) or {}
            cron_jobs[jid] = {"tick_ms": int(jid.rsplit(":", 1)[1]) * 1000,
                              "created_ms": int(h.get(b"created", b"0"))}
        entries = [(e.name, e.next_after) for e in CRON_ENTRIES]
        checks = liveness.analyse(liveness.Inputs(
            samples=self.monitor.samples, faults=self.tl.faults, procs=procs,
            starts_by_pid=dict(starts), cron_jobs=cron_jobs, cron_entries=entries,
            fault_phase=self.fault_window, observed_until=self.monitor_until or time.time(),
            visibility_s=self.o.visibility_s,
            reclaim_every_s=self.o.visibility_s / 4))
        return {name: c.report() for name, c in checks.items()}

    def read_events(self) -> EventsView:
        """Terminal events per job and the time of every start, from the lifecycle events
        (when the stream was trimmed, ``complete`` is False and they are not used)."""
        assert self.direct is not None
        out = EventsView()
        info: Any = self.direct.xinfo_stream(self.keys.events)
        if info.get("entries-added") != info["length"]:
            self.say("the events stream was trimmed: terminal events not checked")
            return out
        out.complete = True
        start = "-"
        while True:
            page: Any = self.direct.xrange(self.keys.events, start, "+", count=10_000)
            for eid, f in page:
                ev = f[b"ev"]
                if ev == b"started":
                    t = int(eid.split(b"-")[0]) / 1000
                    out.started.setdefault(f[b"job"].decode(), {})[int(f[b"d"])] = t
                    out.starts.append((t, f[b"job"].decode()))
                elif ev in (b"completed", b"failed"):
                    counts = out.terminal[f[b"job"].decode()]
                    counts[ev.decode()] = counts.get(ev.decode(), 0) + 1
            if len(page) < 10_000:
                return out
            start = "(" + page[-1][0].decode()

    def dead_job_ids(self) -> Iterator[str]:
        assert self.direct is not None
        start = "-"
        while True:
            page: Any = self.direct.xrange(self.keys.dead, start, "+", count=1000)
            for _eid, fields in page:
                yield fields.get(b"job", b"").decode()
            if len(page) < 1000:
                return
            start = "(" + page[-1][0].decode()

    def log_errors(self) -> dict[str, Any]:
        """ERROR lines in the processes' logs (first few), and how many there were; the
        dead-lettering of the always-failing jobs is logged as an error too, and left out."""
        count = 0
        first: list[str] = []
        for log in sorted({c.log for c in self.children}):  # a reused name shares its log
            if not log.exists():
                continue
            for line in log.read_text(errors="replace").splitlines():
                if " ERROR " in line and "(chaos.fail)" not in line:  # not the planned Fail
                    count += 1
                    if len(first) < 10:
                        first.append(line[:300])
        return {"count": count, "first": first}


@dataclass
class Verdict:
    jobs: collections.Counter[str] = field(default_factory=collections.Counter)
    outcome: dict[str, collections.Counter[str]] = field(
        default_factory=lambda: collections.defaultdict(collections.Counter))
    executions: collections.Counter[str] = field(default_factory=collections.Counter)
    duplicates: collections.Counter[str] = field(default_factory=collections.Counter)
    explained: collections.Counter[str] = field(default_factory=collections.Counter)
    unexplained: list[dict[str, Any]] = field(default_factory=list)
    lost: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)
    skipped_attempts: int = 0
    problems: dict[str, tuple[int, Any]] = field(default_factory=dict)

    def add(self, what: str, jid: str, detail: Any) -> None:
        n, ex = self.problems.get(what, (0, None))
        self.problems[what] = (n + 1, ex if ex is not None else (jid, detail))


@dataclass
class EventsView:
    complete: bool = False
    terminal: dict[str, dict[str, int]] = field(
        default_factory=lambda: collections.defaultdict(dict))
    started: dict[str, dict[int, float]] = field(default_factory=dict)
    """job -> attempt -> when start.lua started it (server clock, seconds)."""
    starts: list[tuple[float, str]] = field(default_factory=list)
    """(when, job) of every start, in order."""


@dataclass
class LedgerView:
    starts: dict[str, list[dict[str, Any]]]
    starts_by_x: dict[str, dict[str, Any]]
    ends: dict[str, dict[str, Any]]
    stalls: list[tuple[int, float, float]]


def read_ledger(path: Path, offset: int = 0) -> LedgerView:
    """The ledger's records (from byte ``offset`` on: a line boundary)."""
    starts: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    by_x: dict[str, dict[str, Any]] = {}
    ends: dict[str, dict[str, Any]] = {}
    stalls: list[tuple[int, float, float]] = []
    with open(path, encoding="utf-8") as f:
        f.seek(offset)
        for line in f:
            rec = json.loads(line)
            if rec["ev"] == "s":
                starts[rec["job"]].append(rec)
                by_x[rec["x"]] = rec
            elif rec["ev"] == "e":
                ends[rec["x"]] = rec
            elif rec["ev"] == "stall":
                stalls.append((rec["pid"], rec["t0"], rec["t1"]))
    return LedgerView(dict(starts), by_x, ends, stalls)


def _chunks(items: list[str], n: int) -> Iterator[list[str]]:
    for i in range(0, len(items), n):
        yield items[i:i + n]


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(HERE.parents[1]), *args], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: str(val) if isinstance(val, Path) else val for k, val in d.items()}


# --------------------------------------------------------------------------- report


def render(rep: dict[str, Any]) -> str:
    """The summary table (plain text, also valid Markdown)."""
    lines = [f"streamq chaos run: seed {rep['seed']}, {rep['minutes']:g} min of faults,"
             f" wall time {rep['timing'].get('total_s', 0):.0f} s"
             f" (drain {rep['timing'].get('drain_s', 0):.0f} s)", ""]
    lines += ["| kind | accepted | completed | failed | executions | duplicates |",
              "|---|---:|---:|---:|---:|---:|"]
    tot = collections.Counter[str]()
    for kind, row in rep["jobs"].items():
        cells = [row.get("accepted", 0), row.get("completed", 0), row.get("failed", 0),
                 row.get("executions", 0), row.get("duplicates", 0)]
        tot.update(dict(zip(("a", "c", "f", "e", "d"), cells, strict=True)))
        lines.append(f"| {kind} | " + " | ".join(f"{c:,}" for c in cells) + " |")
    lines.append(f"| **all** | {tot['a']:,} | {tot['c']:,} | {tot['f']:,} | {tot['e']:,} |"
                 f" {tot['d']:,} |")
    lines += ["", "| fault injected | count |", "|---|---:|"]
    lines += [f"| {f} | {n} |" for f, n in rep["faults"].items()]
    lines += ["", "| liveness check | bound (healthy s) | checked | over the bound | worst (s) |",
              "|---|---:|---:|---:|---:|"]
    lines += [f"| {name} | {c['bound_s']:g} | {c['checked']:,} | {c['violations']:,} |"
              f" {c['worst_s']:g} |" for name, c in rep.get("liveness_checks", {}).items()]
    cause = ", ".join(f"{w} {n}" for w, n in rep["duplicates_by_cause"].items() if n)
    st = rep["stats"]
    lines += ["", f"- duplicates (executions whose outcome was discarded or never settled):"
              f" {rep['duplicates']:,} ({cause or 'none'})",
              f"- attempts counted but never executed (lost start replies, deaths before the"
              f" handler began): {rep['skipped_attempts']:,}",
              f"- lease_lost {st.get('lease_lost', 0):,}, reclaimed {st.get('reclaimed', 0):,},"
              f" producer re-sends {rep['producer_resends']}, stalls seen"
              f" {rep['stalls_seen']}",
              f"- final consumers {rep['consumers']['final']} ({rep['consumers']['started']}"
              f" worker names started); liveness probes:"
              f" {sum(1 for x in rep['liveness'].values() if x == 'ok')} of"
              f" {len(rep['liveness'])} processes ok",
              f"- stream {rep['keyspace']['stream_len']}, PEL {rep['keyspace']['pel']},"
              f" delayed {rep['keyspace']['delayed']}, dead {rep['keyspace']['dead_len']}",
              f"- **lost = {rep['lost']}**, wrong terminal state = {rep['wrong_state']}",
              f"- checks: {'all passed' if rep.get('ok') else 'FAILED'}"]
    lines += [f"  - {f}" for f in rep["failures"]]
    return "\n".join(lines)


def run(opts: Options) -> dict[str, Any]:
    rep = Chaos(opts).run()
    if opts.out is not None:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(rep, indent=2, default=str) + "\n")
    return rep


_LONG = {v: k for k, v in V1_FIELDS.items()}


def _long_names(h: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """A job record in either layout by its long names (state, attempts, owner, result,
    started, ...: the checks below read those), state and entry decoded."""
    if not h:
        return {}
    return {_LONG.get(k, k): v for k, v in normalize_record(h).items()}
