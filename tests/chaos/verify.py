"""Verification: every accepted job's record checked against the ledger, the lifecycle
events and the fault timeline; the keyspace, counters, consumers and loops' liveness;
all of it gathered into the report (``Verdict`` collects the problems)."""

from __future__ import annotations

import collections
import json
import re
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamq._core.keys import GROUP
from streamq._core.model import V1_FIELDS, normalize_record

from . import liveness
from .children import Children
from .common import (
    EXPLANATIONS,
    GRACEFUL_FAULTS,
    LAPSED,
    REPORT_KINDS,
    SERVER_ERROR_FAULTS,
    max_attempts_of,
)
from .cron_entries import ENTRIES as CRON_ENTRIES
from .producer import Producer, kind_of

_EXEC_RE = re.compile(r"\[([^\]]+)\]")


class Verification(Children):
    """Reading what the run left behind and checking it: the report."""

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

        grace_ev = [e for e in self.tl.faults if e["kind"] in GRACEFUL_FAULTS]

        def lapse(pid: int, lo: float, hi: float) -> str:
            """Why a lease of process ``pid`` held from ``lo`` lapsed by ``hi`` (a fault in that
            window; a graceful stop is none: it hands its jobs back)."""
            if any(x["pid"] == pid and lo <= x["t"] <= hi for x in kill_ev):
                return "worker_killed"
            if any(x["pid"] == pid and x["t"] <= hi and x["t1"] >= lo for x in stop_ev):
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
            stalls = [s for s in led.stalls if s[0] == pid]
            if any(a <= hi and b >= lo - 1 for _, a, b in stalls) or any(
                    a <= hi and b >= lo - 1 for a, b in self.tl.stalls):
                return "stall"
            return "unexplained"

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
            return lapse(e["pid"], lo, hi)

        def handed_back(e: dict[str, Any], execs: list[dict[str, Any]]) -> bool:
            """Was execution ``e`` still running when a graceful stop of its process began
            (before the job's next execution)? Then it was handed back, its attempt refunded."""
            nxt = [o["t"] for o in execs if o["t"] > e["t"]]
            hi = min(nxt) if nxt else time.time()
            return any(g["pid"] == e["pid"] and g["t"] <= hi and g.get("t1", hi) >= e["t"]
                       for g in grace_ev)

        def owner_pid(name: str, t: float) -> int:
            """The pid of the worker process named ``name`` alive at ``t`` (-1: none known)."""
            procs = [c for c in self.children if c.role == "worker" and c.name == name
                     and c.spawned <= t and (c.died is None or c.died >= t - 0.05)]
            # a replacement under the same name spawned after t is not it (the latest
            # spawned before t is)
            return max(procs, key=lambda c: c.spawned).pid if procs else -1

        def dead_letter(jid: str, kind: str, h: dict[bytes, bytes], runs: int,
                        execs: list[dict[str, Any]]) -> str | None:
            """Why job ``jid`` was dead-lettered, or None when nothing explains it. Every dead
            letter's job either ran ``max_attempts`` times (the ledger: ``Retry`` raised by the
            last one) or has a reason that is not an attempt count: ``Fail`` raised by its
            handler, or a lapse of its last lease explained by a fault (a SIGKILL, a SIGSTOP,
            an outage...; never by a graceful stop, which hands its jobs back). A lapse needs
            its fault also when the job ran ``max_attempts`` times: a run cut short by a stop is
            refunded, so only a lapse may consume the last attempt."""
            reason = h.get(b"reason", b"").decode()
            if _EXEC_RE.search(reason) and kind == "fail":
                return "Fail raised by the handler"
            if reason == "attempts exhausted":  # Retry raised on the last attempt
                ok = runs >= max_attempts_of(kind) and any(
                    led.ends.get(e["x"], {}).get("o") == "retry" and e["a"] == runs
                    for e in execs)
                return "retries exhausted (ran max_attempts times)" if ok else None
            if reason != LAPSED:
                return None
            started = int(h.get(b"started", b"0")) / 1000
            finished = int(h.get(b"finished", b"0")) / 1000 or time.time()
            why = lapse(owner_pid(h.get(b"owner", b"").decode(), started), started - 0.05,
                        finished + 0.5)
            if why == "unexplained":  # a graceful stop alone: its hand-back cost the attempt
                return None
            return f"lease lapsed: {why}" + (" (ran max_attempts times)"
                                             if runs >= max_attempts_of(kind) else "")

        for jid in ids:
            kind = accepted[jid]
            v.jobs[kind] += 1
            h = records.get(jid) or {}
            state = h.get(b"state", b"").decode()
            if state not in ("completed", "failed", "cancelled"):
                v.lost.append(f"{jid}: {state or 'no record'}")
                continue
            attempts = int(h.get(b"attempts", b"0"))
            execs = sorted(led.starts.get(jid, []), key=lambda e: e["t"])
            atts = [e["a"] for e in execs]
            runs = len(set(atts))
            why_dead = dead_letter(jid, kind, h, runs, execs) if state == "failed" else None
            if kind == "fail":
                wrong = state != "failed"
            else:
                wrong = state == "cancelled" or (state == "failed" and why_dead is None)
            if wrong:
                v.wrong.append(f"{jid}: {state} ({h.get(b'reason', b'').decode()};"
                               f" ran {runs} of {max_attempts_of(kind)} attempts)")
                continue
            if why_dead is not None:
                v.dead[why_dead] += 1
            v.outcome[kind][state] += 1
            v.executions[kind] += len(execs)
            if runs > attempts or any(a > attempts for a in atts):
                v.add("more executions than counted attempts", jid, (atts, attempts))
            v.skipped_attempts += attempts - runs
            applied: set[str] = set()  # the executions whose outcome the record shows
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
                    applied.add(end["x"])
            elif kind == "fail":
                m = _EXEC_RE.search(h.get(b"reason", b"").decode())
                end = led.ends.get(m.group(1)) if m else None
                if end is None or end["job"] != jid or end["o"] != "fail":
                    v.add("dead-letter reason matches no recorded execution", jid,
                          h.get(b"reason"))
                elif end["a"] != attempts:
                    v.add("dead-lettered by an execution that was not the last attempt", jid,
                          (end["a"], attempts))
                else:
                    applied.add(end["x"])
            errors = json.loads(h.get(b"errors", b"[]"))
            retried = {int(x["attempt"]) for x in errors if x.get("type") == "Retry"}
            for a in retried:
                tried = [e for e in execs
                         if e["a"] == a and led.ends.get(e["x"], {}).get("o") == "retry"]
                if not tried:
                    v.add("retry applied for an attempt that did not end in Retry", jid, a)
                else:
                    applied.add(tried[-1]["x"])
            if kind in ("retry", "last") and state == "completed" and \
                    attempts <= producer.fails[jid]:
                v.add("retrying job completed before its planned failures", jid, attempts)
            if kind == "delayed" and int(h[b"started"]) < int(h[b"due"]):
                v.add("delayed job started before it was due", jid,
                      (int(h[b"started"]), int(h[b"due"])))
            # executions whose outcome was not applied: duplicates, each needing a lapse of
            # its lease, or a graceful stop that handed it back (then its attempt number ran
            # again: refunded, invariant 15)
            for e in execs:
                if e["x"] in applied:
                    continue
                # its number ran again later: it was handed back (refunded) by a graceful stop;
                # the last run of a number is judged like any other (a lapse explains it)
                reused = any(o["a"] == e["a"] and o["t"] > e["t"] for o in execs)
                if reused and not handed_back(e, execs):
                    v.add("attempt number executed twice (a lease token reissued, no graceful"
                          " stop handed it back)", jid, atts)
                why = "handed_back" if reused else explain(e, execs)
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
        n_fail = sum(v.outcome[kind]["failed"] for kind in REPORT_KINDS)
        n_done = sum(v.outcome[kind]["completed"] for kind in REPORT_KINDS)
        dead_jobs = collections.Counter(kind_of(j) for j in self.dead_job_ids())
        if keyspace["stream_len"] or keyspace["pel"] or keyspace["delayed"]:
            v.add("orphans left in the stream, PEL or delayed set", "-", keyspace)
        if keyspace["dead_len"] != n_fail or sum(dead_jobs.values()) != n_fail:
            v.add("dead letters differ from the failed jobs", "-",
                  (keyspace["dead_len"], n_fail, dict(dead_jobs)))
        expect = {"enqueued": len(accepted), "completed": n_done, "failed": n_fail,
                  "retrying_now": 0}
        for name, want in expect.items():
            if stats.get(name, 0) != want:
                v.add("counter off", name, (stats.get(name, 0), want))
        # 'started' counts every start; a graceful stop's refund gives an attempt back
        # without taking the start back, so it may exceed the attempts by the hand-backs
        counted = sum(int(h.get(b"attempts", b"0")) for h in records.values())
        if not counted <= stats.get("started", 0) <= counted + stats.get("released", 0):
            v.add("counter off", "started", (stats.get("started", 0), counted,
                                             stats.get("released", 0)))

        # the lifecycle events: each job reached its terminal state exactly once
        if events.complete:
            for jid in accepted:
                end_state = (records.get(jid) or {}).get(b"state", b"").decode()
                once = {end_state: 1}
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
        missing = [f for f in self.o.faults if not faults[f]]
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
            "faults": {f: faults[f] for f in self.o.faults},
            "dead_letters": {"total": sum(v.dead.values()), "by_reason": dict(v.dead)},
            "graceful": self.graceful_report(),
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

    def graceful_report(self) -> dict[str, Any]:
        """How long the graceful stops and reloads took (signal to exit, or to the new worker)."""
        out: dict[str, Any] = {}
        for kind in GRACEFUL_FAULTS:
            evs = [e for e in self.tl.faults if e["kind"] == kind]
            took = [float(e.get("t1", e["t"])) - e["t"] for e in evs]
            out[kind] = {"count": len(evs), "max_s": round(max(took), 2) if took else 0.0,
                         "grace_s": sorted({e["grace_s"] for e in evs})[:3]}
        return out

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
    dead: collections.Counter[str] = field(default_factory=collections.Counter)
    """Dead letters by their explanation (``dead_letter`` in ``check``)."""
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


def _plain(d: dict[str, Any]) -> dict[str, Any]:
    return {k: str(val) if isinstance(val, Path) else val for k, val in d.items()}


_LONG = {v: k for k, v in V1_FIELDS.items()}


def _long_names(h: dict[bytes, bytes]) -> dict[bytes, bytes]:
    """A job record in either layout by its long names (state, attempts, owner, result,
    started, ...: the checks below read those), state and entry decoded."""
    if not h:
        return {}
    return {_LONG.get(k, k): v for k, v in normalize_record(h).items()}
