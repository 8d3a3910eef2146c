"""What every part of the chaos harness shares: the job and fault kinds, the options, the
harness's view of a transient error, the children and the timeline as records, the Redis
server under test, and ``ChaosBase``: the state of one run, which the parts of ``Chaos``
(``children.py``, ``faults.py``, ``verify.py``, ``harness.py``) all work on."""

from __future__ import annotations

import collections
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from redis.exceptions import ResponseError

import schedulers
import streamq
from streamq import ALL_EVENTS, Keys, QueueConfig
from streamq._core.retry import TRANSIENT
from streamq._core.server import RedisServer

from . import liveness
from .proxy import ProxyControl

HERE = Path(__file__).resolve().parent
KINDS = ("instant", "delayed", "retry", "slow", "slow_sync", "fail", "once", "last")
MIX = (46, 13, 10, 6, 4, 7, 9, 5)
"""Relative share of each kind in KINDS (``Options.mix`` overrides it)."""
REPORT_KINDS = (*KINDS, "cron")
"""Job kinds in the report: the producer's, and the jobs fired by the cron entries."""
FAULTS = ("kill_worker", "stop_worker", "kill_scheduler", "kill_redis", "cut", "delay",
          "oom", "readonly", "busy", "loading", "drop_replies", "clock_worker",
          "clock_scheduler", "stop_scheduler", "pause", "term_short", "term_long", "reload",
          "reload_proc")
FAULT_WEIGHTS = (3, 2, 2, 1, 3, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 2, 2, 1, 1)
GRACEFUL_FAULTS = ("term_short", "term_long", "reload", "reload_proc")
"""Graceful stops, as deploys do them: SIGTERM to a worker process with a short grace period
(0.2-0.5 s: running jobs are handed back) or a long one (4-6 s: longer than most jobs); and
``uvicorn --reload``-style restarts of the embedded worker (``embedded.py``): its ``Worker``
stopped gracefully and a new one started in the same process (``reload``), or the process
stopped with SIGTERM and a replacement started under the same name once it exited
(``reload_proc``). None of them may make a lease lapse, or cost an attempt (invariant 15)."""
SERVER_ERROR_FAULTS = ("oom", "readonly", "busy")
"""Faults after which the server answers errors for a while (t .. t1), one at a time."""
MAX_ATTEMPTS = 25
"""Generous, so that a job that should complete is never dead-lettered by lapses alone."""
KIND_MAX_ATTEMPTS = {"once": 1, "last": 2}
"""Kinds with few attempts: ``once`` jobs have ``max_attempts=1``; ``last`` jobs
``max_attempts=2`` and a first attempt that fails by design (``Retry``), so their second run
is their last. A lapsed lease (SIGKILL, SIGSTOP, an outage) may dead-letter them; a graceful
stop must not."""
LAPSED = "attempts exhausted (lease lapsed)"
"""The dead-letter reason of a job whose last attempt's lease lapsed."""


def max_attempts_of(kind: str) -> int:
    return KIND_MAX_ATTEMPTS.get(kind, MAX_ATTEMPTS)


EXPLANATIONS = ("worker_killed", "worker_stopped", "redis_crash", "connection_cut",
                "proxy_delay", "server_error", "stall", "handed_back", "unexplained")
"""Causes of a duplicate execution: a lapsed lease's, or ``handed_back`` (no lapse: a handler
still running when a graceful stop's grace period ended; the job was handed back with its
attempt refunded, and that attempt ran again). Causes of a lapsed lease. Deliberately none: a
clock step (leases and due times run on the server's clock, so a step of a host's clock must
not make a lease lapse), a dropped reply (the command ran; a repeated start returns the same
lease, a dropped renewal renewed), and a graceful stop (it hands its jobs back)."""
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
    faults: tuple[str, ...] = FAULTS
    """The fault menu (a subset of ``FAULTS``: the graceful-stop test uses only those)."""
    embedded: int = 1
    """Worker slots running the embedded worker (``embedded.py``), besides ``workers``."""
    mix: tuple[int, ...] = MIX
    """Relative share of each kind in KINDS."""


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
    stopping: dict[str, Any] | None = None
    """A graceful stop under way: its timeline event (exit time and status go there)."""
    reloads: int = 0
    """In-process reloads asked of it (``embedded.py``)."""
    grace_file: Path | None = None
    """Where the harness writes the grace period of its next graceful stop (``worker.py``)."""
    reload_file: Path | None = None
    """Where it writes how many reloads it finished (``embedded.py``)."""

    @property
    def embedded(self) -> bool:
        return self.name.startswith("e")

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


class ChaosBase:
    """The state of one chaos run; its behaviour is in the mixins ``Chaos`` is made of."""

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
        self.draining: list[Child] = []
        """Workers stopped gracefully and not yet exited (no longer in a slot)."""
        self.reloading: list[tuple[Child, dict[str, Any]]] = []
        """In-process reloads asked and not yet done: (the embedded worker, its event)."""
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


def _git(*args: str) -> str:
    try:
        out = subprocess.run(["git", "-C", str(HERE.parents[1]), *args], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return out.stdout.strip()
