"""Liveness of the chaos run: after every fault, every loop of every live process makes
progress again within a bound.

A ``Monitor`` thread samples the Redis under test directly (not through the proxy) every
``SAMPLE_S``: the server's time, the workers' heartbeats (the ``workers`` ZSET), the oldest due
entry of the delayed set, and every pending entry with its job's state and owner. After the run
``analyse`` turns the samples, the ledger and the fault log into one verdict per check:

- ``heartbeat`` (``HEARTBEAT_BOUND_S``): each worker process's score in the ``workers``
  ZSET moves;
- ``fetch`` (``FETCH_BOUND_S``): each worker process starts jobs (ledger start records of its
  pid) during the fault phase, while the producer keeps work ready;
- ``promotion`` (``PROMOTE_BOUND_S``): the schedulers keep the oldest due delayed job from
  waiting longer than ``PROMOTE_LAG_S``;
- ``cron`` (``CRON_BOUND_S``): each tick of each cron entry fires exactly once (one job: its id
  is per tick), never before the tick (server time), within the bound after it, and no job is
  fired for a time that is not a tick; a tick followed by its next one before the bound's worth
  of healthy time passed may collapse into it (``catch_up='once'`` fires the latest due tick):
  reported under ``collapsed``, not a violation;
- ``dead_owner`` (visibility timeout + reclaim interval + ``SAMPLE_S``): no job is ``active``,
  and no entry pending, under a dead owner for longer.

Time is counted in *healthy seconds*: wall time minus the time a disruption covered (Redis
down or loading, OOM, READONLY, BUSY, a slow network, replies being dropped; for one
process, its own SIGSTOP or graceful stop (``GRACEFUL``); for the schedulers' loops, moments
when no scheduler was running; for starting jobs, the queue being paused; for the sample-based
checks, moments the monitor could not sample).
So a loop gets the bound's worth of usable time after the end of each fault, whatever faults
came before. A clock step is not a disruption: the engine takes its time from the server, so a
step of a host's clock must not stop any loop. A new process gets ``STARTUP_S`` more for its
first progress (interpreter start and imports on a busy machine).
"""

from __future__ import annotations

import collections
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from streamq import Keys
from streamq._core.keys import GROUP
from streamq._core.model import record_state

SAMPLE_S = 0.5
HEARTBEAT_BOUND_S = 5.0
"""Heartbeats every 0.5 s; 5 s of usable time covers a reconnect and the longest backoff."""
FETCH_BOUND_S = 10.0
"""A slow job holds a slot up to 3 s; 10 s without any start while work waits is a stuck loop."""
PROMOTE_LAG_S = 2.0
PROMOTE_BOUND_S = 6.0
CRON_BOUND_S = 5.0
STARTUP_S = 8.0
SERVER_FAULTS = ("kill_redis", "loading", "oom", "readonly", "busy", "delay", "drop_replies",
                 "cut")
"""Faults that disrupt every client (windows from ``t`` to ``t1``; a cut is a moment)."""
GRACEFUL = ("term_short", "term_long", "reload", "reload_proc")
"""A graceful stop or reload of one worker process, from the signal until it exited or its new
worker was up: its loops stop on purpose (not a disruption of any other process)."""


# --------------------------------------------------------------------------- time arithmetic


def covered(windows: Iterable[tuple[float, float]], a: float, b: float) -> float:
    """Seconds of [a, b] covered by the union of ``windows``."""
    spans = sorted((max(a, x), min(b, y)) for x, y in windows if y > a and x < b)
    total, end = 0.0, a
    for x, y in spans:
        if y <= end:
            continue
        total += y - max(x, end)
        end = y
    return total


def healthy(windows: list[tuple[float, float]], a: float, b: float) -> float:
    return max(0.0, (b - a) - covered(windows, a, b))


# --------------------------------------------------------------------------- sampling


@dataclass
class Sample:
    t: float
    """Harness wall clock (the same host clock as Redis's TIME and the ledger)."""
    server_ms: int
    heartbeats: dict[str, float]
    overdue_s: float
    """How long the oldest due delayed job has waited (0 when none is due)."""
    pending: list[tuple[str, str, str, str]]
    """(entry consumer, job id, job state, job owner) of every pending entry."""


@dataclass
class Monitor:
    port: int
    keys: Keys
    samples: list[Sample] = field(default_factory=list)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    """Samples that failed, by error (the server was down, busy, loading...)."""
    stop: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="chaos-liveness", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(30)

    def _run(self) -> None:
        client = redis.Redis(port=self.port, protocol=2, socket_timeout=5,
                             socket_connect_timeout=1)
        try:
            while not self.stop.wait(SAMPLE_S):
                try:
                    self.samples.append(self.sample(client))
                except redis.RedisError as exc:
                    self.errors[type(exc).__name__ + ": " + str(exc)[:40]] += 1
        finally:
            client.close()

    def sample(self, r: redis.Redis) -> Sample:
        k = self.keys
        t = time.time()
        sec, usec = r.time()
        now_ms = sec * 1000 + usec // 1000
        hb: Any = r.zrange(k.workers, 0, -1, withscores=True)
        due: Any = r.zrangebyscore(k.delayed, "-inf", now_ms, start=0, num=1, withscores=True)
        overdue = max(0.0, (now_ms - float(due[0][1])) / 1000) if due else 0.0
        pel: Any = r.xpending_range(k.stream, GROUP, "-", "+", 1000)
        pending: list[tuple[str, str, str, str]] = []
        if pel:
            pipe = r.pipeline(transaction=False)
            for p in pel:
                eid = p["message_id"]
                pipe.xrange(k.stream, eid, eid)
            entries = pipe.execute()
            jids = []
            for p, e in zip(pel, entries, strict=True):
                fields = e[0][1] if e else {}
                jids.append((_s(p["consumer"]), _s(fields.get(b"id", b""))))
            pipe = r.pipeline(transaction=False)
            for _c, j in jids:
                pipe.hmget(k.job(j or "-"), "s", "o", "state", "owner")
            for (c, j), (state, owner, state1, owner1) in zip(jids, pipe.execute(), strict=True):
                pending.append((c, j, record_state(state or state1), _s(owner or owner1 or b"")))
        return Sample(t, now_ms, {_s(m): float(s) for m, s in hb}, overdue, pending)


def _s(v: Any) -> str:
    return v.decode(errors="replace") if isinstance(v, bytes) else str(v)


# --------------------------------------------------------------------------- verdicts


@dataclass
class Proc:
    """One process the harness started (a worker or a scheduler), as the analysis sees it."""

    name: str
    role: str
    pid: int
    spawned: float
    died: float | None


@dataclass
class Check:
    what: str
    bound_s: float
    faults: list[dict[str, Any]] = field(default_factory=list, repr=False)
    checked: int = 0
    violations: int = 0
    worst_s: float = 0.0
    examples: list[dict[str, Any]] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def observe(self, value: float, **detail: Any) -> None:
        self.checked += 1
        if value >= self.worst_s:
            self.worst_s = round(value, 2)
            self.extra["worst"] = {"value": round(value, 2), **detail}
        if value > self.bound_s:
            self.fail(value=round(value, 2), **detail)

    def fail(self, **detail: Any) -> None:
        self.violations += 1
        if len(self.examples) < 8:
            self.examples.append(detail)

    def report(self) -> dict[str, Any]:
        return {"what": self.what, "bound_s": self.bound_s, "checked": self.checked,
                "violations": self.violations, "worst_s": self.worst_s, "ok": not self.violations,
                **self.extra, "examples": self.examples}

    def near(self, a: float, b: float) -> list[str]:
        """The faults active in [a - 5 s, b]: context for an example."""
        return [f"{f['kind']}@{f['t']:.1f}" for f in self.faults
                if f["t"] <= b and float(f.get("t1", f["t"])) >= a - 5][:8]


@dataclass
class Inputs:
    samples: list[Sample]
    faults: list[dict[str, Any]]
    procs: list[Proc]
    starts_by_pid: dict[int, list[float]]
    """Ledger start times (handler began) per worker pid."""
    cron_jobs: dict[str, dict[str, int]]
    """Cron job id -> {"tick_ms", "created_ms"} of every cron job in Redis."""
    cron_entries: Sequence[tuple[str, Callable[[int], int]]]
    """(entry name, next tick strictly after t_ms) of every cron entry."""
    fault_phase: tuple[float, float]
    observed_until: float
    visibility_s: float
    reclaim_every_s: float


def analyse(x: Inputs) -> dict[str, Check]:
    server = [(float(f["t"]), float(f.get("t1", f["t"]))) for f in x.faults
              if f["kind"] in SERVER_FAULTS]
    stops: dict[int, list[tuple[float, float]]] = collections.defaultdict(list)
    for f in x.faults:
        if f["kind"] in ("stop_worker", "stop_scheduler", "probe_freeze", *GRACEFUL):
            stops[int(f["pid"])].append((float(f["t"]), float(f.get("t1", x.observed_until))))
    scheds = [p for p in x.procs if p.role == "scheduler"]
    no_scheduler = _nobody(scheds, stops, x.fault_phase[0], x.observed_until)
    # the sample-based checks cannot judge what the monitor did not see: a gap between two
    # samples (the harness process starved, or Redis not answering) is blind time for them
    blind = blind_windows(x.samples)
    workers = [p for p in x.procs if p.role == "worker"]
    t0, t_end = x.fault_phase
    # while the queue is paused nothing starts, not even a dead owner's entries
    paused = [(float(f["t"]), float(f.get("t1", x.observed_until))) for f in x.faults
              if f["kind"] == "pause"]
    checks = {
        "heartbeat": _heartbeats(x, workers, server + blind, stops),
        "fetch": _fetch(x, workers, server + paused, stops),
        "promotion": _promotion(x, server + no_scheduler + blind, t0, t_end),
        "cron": _cron(x, server + no_scheduler, t0, t_end),
        "dead_owner": _dead_owner(x, workers, server + blind + paused),
    }
    blind_s = covered(blind, t0, x.observed_until)
    for name in ("heartbeat", "promotion", "dead_owner"):
        checks[name].extra["monitor_blind_s"] = round(blind_s, 1)
    return checks


def blind_windows(samples: list[Sample]) -> list[tuple[float, float]]:
    """Stretches longer than two sample periods without a sample (the first period of each
    is a normal wait)."""
    return [(a.t + SAMPLE_S, b.t) for a, b in itertools.pairwise(samples)
            if b.t - a.t > 2 * SAMPLE_S]


def _nobody(procs: list[Proc], stops: dict[int, list[tuple[float, float]]], a: float,
            b: float) -> list[tuple[float, float]]:
    """Windows in [a, b] when none of ``procs`` was running (dead, frozen or starting)."""
    points = sorted({a, b, *(p.spawned for p in procs), *(p.spawned + STARTUP_S for p in procs),
                     *(p.died for p in procs if p.died is not None),
                     *(t for p in procs for w in stops[p.pid] for t in w)})
    out: list[tuple[float, float]] = []
    for lo, hi in itertools.pairwise(points):
        if hi <= a or lo >= b:
            continue
        mid = (lo + hi) / 2
        up = any(p.spawned + STARTUP_S <= mid and (p.died is None or mid < p.died)
                 and not any(s <= mid < e for s, e in stops[p.pid]) for p in procs)
        if not up:
            out.append((lo, hi))
    return out


def _gaps(check: Check, proc: Proc, progress: list[float], windows: list[tuple[float, float]],
          a: float, b: float) -> None:
    """Healthy time between consecutive progress moments of one process's loop within [a, b]
    (from the process's start, with STARTUP_S more for the first one, to its end)."""
    lo = max(a, proc.spawned)
    hi = min(b, proc.died if proc.died is not None else b)
    if hi <= lo:
        return
    prev, first = lo, proc.spawned >= a
    for t in [*sorted(p for p in progress if lo <= p <= hi), hi]:
        gap = healthy(windows, prev, t) - (STARTUP_S if first else 0.0)
        if t == hi and t - prev < check.bound_s:
            break
        check.observe(gap, process=f"{proc.role} {proc.name} (pid {proc.pid})",
                      since=round(prev, 2), until=round(t, 2), wall_s=round(t - prev, 2),
                      faults=check.near(prev, t))
        prev, first = t, False


def _heartbeats(x: Inputs, workers: list[Proc], server: list[tuple[float, float]],
                stops: dict[int, list[tuple[float, float]]]) -> Check:
    c = Check("each live worker's heartbeat (workers ZSET score) moves", HEARTBEAT_BOUND_S,
              x.faults)
    for p in workers:
        prev: float | None = None
        moved: list[float] = []
        for s in x.samples:
            if s.t < p.spawned or (p.died is not None and s.t > p.died):
                continue
            score = s.heartbeats.get(p.name)
            if score is not None and score != prev and score / 1000 >= p.spawned - 1:
                moved.append(min(s.t, score / 1000))  # when the beat happened (server clock)
            prev = score if score is not None else prev
        _gaps(c, p, moved, server + stops[p.pid], x.fault_phase[0], x.observed_until)
    return c


def _fetch(x: Inputs, workers: list[Proc], server: list[tuple[float, float]],
           stops: dict[int, list[tuple[float, float]]]) -> Check:
    c = Check("each live worker starts jobs while work is ready (ledger starts of its pid)",
              FETCH_BOUND_S, x.faults)
    for p in workers:
        _gaps(c, p, x.starts_by_pid.get(p.pid, []), server + stops[p.pid], *x.fault_phase)
    return c


def _promotion(x: Inputs, windows: list[tuple[float, float]], a: float, b: float) -> Check:
    c = Check(f"due delayed jobs are promoted (the oldest due one waits <= {PROMOTE_LAG_S:g} s)",
              PROMOTE_BOUND_S, x.faults)
    prev = a
    for s in x.samples:
        if not a <= s.t <= b or s.overdue_s > PROMOTE_LAG_S:
            continue
        c.observe(healthy(windows, prev, s.t), since=round(prev, 2), until=round(s.t, 2),
                  wall_s=round(s.t - prev, 2), faults=c.near(prev, s.t))
        prev = s.t
    c.observe(healthy(windows, prev, b), since=round(prev, 2), until=round(b, 2),
              wall_s=round(b - prev, 2), faults=c.near(prev, b))
    c.extra["worst_overdue_s"] = round(max((s.overdue_s for s in x.samples if a <= s.t <= b),
                                           default=0.0), 2)
    return c


def _cron(x: Inputs, windows: list[tuple[float, float]], a: float, b: float) -> Check:
    """Every tick of every entry in the checked span fired exactly once (one job, as the job
    id is per tick), not before the tick, and within the bound after it; no job for a tick
    that is not one of the entry's ticks."""
    c = Check("each cron tick fires exactly once, not early, within the bound", CRON_BOUND_S,
              x.faults)
    lo, hi = a + STARTUP_S, b - CRON_BOUND_S
    for name, next_after in x.cron_entries:
        ticks: list[int] = []
        t = next_after(int(lo * 1000))
        while t <= hi * 1000:
            ticks.append(t)
            t = next_after(t)
        fired = {int(j.rsplit(":", 1)[1]) * 1000: v for j, v in x.cron_jobs.items()
                 if j.startswith(f"cron:{name}:")}
        for tick in ticks:
            got = fired.get(tick)
            nxt = next_after(tick)
            if got is None and healthy(windows, tick / 1000, nxt / 1000) < CRON_BOUND_S:
                # catch_up='once' (the chaos entries' setting) fires only the latest due tick:
                # a tick with less than the bound's worth of usable time before the next one
                # collapses into it by design; the next tick is checked on its own
                c.extra.setdefault("collapsed", []).append(
                    {"entry": name, "tick_ms": tick,
                     "healthy_s": round(healthy(windows, tick / 1000, nxt / 1000), 2)})
                continue
            if got is None:
                c.fail(entry=name, tick_ms=tick, problem="never fired",
                       faults=c.near(tick / 1000, tick / 1000 + 60))
                c.checked += 1
                continue
            if got["created_ms"] < tick:
                c.fail(entry=name, tick_ms=tick, problem="fired before the tick (server time)",
                       early_ms=tick - got["created_ms"])
            c.observe(healthy(windows, tick / 1000, got["created_ms"] / 1000), entry=name,
                      tick_ms=tick, late_wall_s=round((got["created_ms"] - tick) / 1000, 2),
                      faults=c.near(tick / 1000, got["created_ms"] / 1000))
        grid = set(ticks)
        for tick, got in fired.items():
            if tick in grid:
                continue
            if next_after(tick - 1) != tick:
                c.fail(entry=name, tick_ms=tick, problem="a job for a time that is no tick")
            elif got["created_ms"] < tick:
                c.fail(entry=name, tick_ms=tick, problem="fired before the tick (server time)",
                       early_ms=tick - got["created_ms"])
    return c


def _dead_owner(x: Inputs, workers: list[Proc], server: list[tuple[float, float]]) -> Check:
    bound = x.visibility_s + x.reclaim_every_s + SAMPLE_S
    c = Check("no job active (no entry pending) under a dead owner past the bound", bound, x.faults)
    by_name: dict[str, list[Proc]] = collections.defaultdict(list)
    for p in workers:
        by_name[p.name].append(p)

    def dead_since(name: str, t: float) -> float | None:
        """When the process that had this name died, if it is dead at t and no later process
        of the name is up (a replacement under the same name restarts its entries itself)."""
        procs = [p for p in by_name.get(name, []) if p.spawned <= t]
        if not procs:
            return None
        last = max(procs, key=lambda p: p.spawned)
        return last.died if last.died is not None and last.died < t else None

    worst: dict[tuple[str, str, str], tuple[float, float, float]] = {}
    for s in x.samples:
        for consumer, jid, state, owner in s.pending:
            for who, why in ((consumer, "pending entry"), (owner, "active job")):
                if why == "active job" and state != "active":
                    continue
                d = dead_since(who, s.t)
                if d is None:
                    continue
                age = healthy(server, d, s.t)
                key = (jid, who, why)
                if age > worst.get(key, (0.0, 0.0, 0.0))[0]:
                    worst[key] = (age, d, s.t)
    for (jid, who, why), (age, d, t) in sorted(worst.items()):
        c.observe(age, job=jid, owner=who, what=why, owner_died=round(d, 2), seen=round(t, 2),
                  wall_s=round(t - d, 2))
    return c
