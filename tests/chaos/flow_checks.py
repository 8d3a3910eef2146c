"""The checks of the flow chaos run (``flows.py``): every node's record and the lifecycle events
read back once every node ended, checked against the execution ledger kept outside Redis and the
fault log; the workflow keys left on the primaries; the report and its summary."""

from __future__ import annotations

import collections
import contextlib
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from streamq import ALL_EVENTS, Keys, Queue, QueueConfig
from streamq._core.cluster_server import wait_for

from .cluster import ClusterChaos, ClusterOptions
from .verify import _EXEC_RE, LedgerView, read_ledger

SHARDS = 3
FLOW_FAULTS = ("kill_worker", "kill_primary", "term_worker")
EVENTS_MAXLEN = 2_000_000


@dataclass
class FlowOptions(ClusterOptions):
    minutes: float = 1.0
    """The fault phase; the drain (no faults) and the checks follow."""
    fan: int = 1_500
    chain: int = 40
    dag: int = 300
    batch: int = 200
    workers: int = 3
    concurrency: int = 8
    """Per worker: few, so that the flows are still running when the faults come."""
    visibility_s: float = 3.0
    fault_every_s: float = 8.0
    relay_every_s: float = 0.1
    """The workers' ``promote_interval_s``: how often each relays its shards' outboxes."""
    repair_every_s: float = 5.0
    repair_min_age_ms: int = 5_000
    """The repair sweep's interval and minimum age (30 s and 60 s in production)."""
    strand_slack_s: float = 1.0
    """How much later than one repair interval after its last dependency ended a parent may
    be released before it counts as left waiting (a loaded machine delays sweeps and relays)."""
    drain_timeout_s: float = 300.0


@dataclass
class Node:
    id: str
    queue: str
    flow: str
    kind: str = "instant"
    deps: list[tuple[str, str]] = field(default_factory=list)
    """(dependency id, policy)."""



class FlowChecks(ClusterChaos):
    """The state of one flow run and its checks (``FlowChaos`` adds the processes, the
    flows and the run)."""

    def __init__(self, o: FlowOptions) -> None:
        super().__init__(o)
        self.fo = o
        self.qa = self.qb = ""
        self.nodes: dict[str, Node] = {}
        self.batches: dict[str, dict[str, Any]] = {}

    def qconfig(self) -> QueueConfig:
        return QueueConfig(shards=SHARDS, min_replicas=1, min_replicas_timeout_ms=500,
                           event_kinds=ALL_EVENTS, events_maxlen=EVENTS_MAXLEN)

    # ------------------------------------------------------------------ checks

    def drain(self) -> dict[str, Any]:
        """Every node's record once every node is terminal (or the drain timed out)."""
        assert self.cluster is not None
        qs = {q: Queue.from_url(self.cluster.url, q, self.qconfig()) for q in (self.qa, self.qb)}
        infos: dict[str, Any] = {}
        try:
            def drained() -> bool:
                self.watch_workers()
                for jid in [j for j in self.nodes
                            if j not in infos or not infos[j].finished]:
                    infos[jid] = qs[self.nodes[jid].queue].get(jid)
                    if infos[jid] is None or not infos[jid].finished:
                        return False
                return True
            with contextlib.suppress(RuntimeError):
                wait_for(drained, self.fo.drain_timeout_s, "every node to end")
            for b in self.batches:  # the batch records (completed when closed)
                infos[b] = qs[self.qb].get(b)
        finally:
            for q in qs.values():
                q.close()
        return infos

    def releases(self) -> dict[str, float]:
        """When each waiting job was released (its first 'queued: dependencies ended'
        event), from every shard's lifecycle events."""
        assert self.cluster is not None
        out: dict[str, float] = {}
        for q in (self.qa, self.qb):
            for i in range(SHARDS):
                key = Keys(q, shard=i).events
                with self.cluster.node(self.cluster.owner(key)) as c:
                    start = "-"
                    while True:
                        page: Any = c.xrange(key, start, "+", count=10_000)
                        for eid, f in page:
                            if f.get(b"ev") == b"queued" and \
                                    f.get(b"d") == b"dependencies ended":
                                out.setdefault(f[b"job"].decode(),
                                               int(eid.split(b"-")[0]) / 1000)
                        if len(page) < 10_000:
                            break
                        start = "(" + page[-1][0].decode()
        return out

    def repairs(self) -> int:
        """Resolves the repair sweeps made (every shard's ``flow_repairs`` counter)."""
        assert self.cluster is not None
        n = 0
        for q in (self.qa, self.qb):
            for i in range(SHARDS):
                key = Keys(q, shard=i).stats
                with self.cluster.node(self.cluster.owner(key)) as c:
                    n += int(c.hget(key, "flow_repairs") or 0)
        return n

    def leftovers(self, infos: dict[str, Any]) -> dict[str, Any]:
        """Workflow keys left on the primaries: pending SETs, result copies and parents SETs
        of jobs that are not dead-lettered (those keep them for a re-drive), outbox entries,
        waiting index entries."""
        assert self.cluster is not None
        counts: collections.Counter[str] = collections.Counter()
        bad: list[str] = []
        for port in self.cluster.primary_ports():
            with self.cluster.node(port) as c:
                for q in (self.qa, self.qb):
                    for raw in c.scan_iter(match=f"streamq:{{{q}*", count=1000):
                        key = raw.decode()
                        kind = key.split("}:", 1)[1].split(":", 1)[0]
                        if kind in ("deps", "dres", "par"):
                            jid = key.split(f":{kind}:", 1)[1]
                            info = infos.get(jid)
                            kept = info is not None and info.state == "failed"
                            counts[f"{kind} kept (dead-lettered)" if kept else kind] += 1
                            if not kept:
                                bad.append(key)
                        elif kind == "outbox" and (n := int(c.xlen(key))):
                            counts["outbox entries"] += n
                            bad.append(f"{key} ({n})")
                        elif kind == "waiting" and (n := int(c.zcard(key))):
                            counts["waiting entries"] += n
                            bad.append(f"{key} ({n})")
        return {"counts": dict(counts), "unexpected": bad[:20], "n_unexpected": len(bad)}

    def expected(self, infos: dict[str, Any]) -> dict[str, str]:
        """Each node's expected final state: 'completed', 'failed:handler',
        'failed:dependency' (a fail edge to a dead job) or 'cancelled'."""
        exp: dict[str, str] = {}
        for n in self.nodes.values():  # insertion order is a topological order
            if n.flow.startswith("bat") and "." in n.flow:
                continue
            if any(pol == "fail" and exp[d].startswith("failed") for d, pol in n.deps):
                exp[n.id] = "failed:dependency"
            else:
                exp[n.id] = "failed:handler" if n.kind == "fail" else "completed"
        for info in self.batches.values():
            cb, bad = info["callbacks"], bool(info["bad"])
            exp[cb["on_success"]] = "failed:dependency" if bad else "completed"
            exp[cb["on_complete"]] = "completed"
            exp[cb["on_death"]] = "completed" if bad else "cancelled"
        return exp

    def verify_flows(self) -> dict[str, Any]:
        t0 = time.time()
        infos = self.drain()
        self.timing["drain_s"] = time.time() - t0
        led = read_ledger(self.dir / "ledger.jsonl")
        rel = self.releases()
        exp = self.expected(infos)
        vt = self.fo.visibility_s
        failover = [(f["t"] - vt, f["t1"] + vt + 2) for f in self.faults
                    if f["kind"] == "kill_primary"]
        problems: collections.Counter[str] = collections.Counter()
        examples: dict[str, Any] = {}
        dups: collections.Counter[str] = collections.Counter()
        states: dict[str, collections.Counter[str]] = collections.defaultdict(
            collections.Counter)
        latencies: list[float] = []

        def problem(what: str, jid: str, detail: Any) -> None:
            problems[what] += 1
            examples.setdefault(what, (jid, detail))

        def ended(jid: str) -> float | None:
            """When job ``jid`` became terminal: the end of the execution whose outcome its
            record holds, else its record's finish time."""
            info = infos.get(jid)
            if info is None or not info.finished:
                return None
            x = ""
            if info.state == "completed" and isinstance(info.result, dict):
                x = str(info.result.get("x"))
            elif info.state == "failed" and (m := _EXEC_RE.search(info.reason or "")):
                x = m.group(1)
            if x in led.ends:
                return float(led.ends[x]["t"])
            return info.finished_at.timestamp() if info.finished_at else None

        deps_of = self.dependencies()
        for jid, n in self.nodes.items():
            info, want = infos.get(jid), exp[jid]
            execs = sorted(led.starts.get(jid, []), key=lambda e: e["t"])
            flow = n.flow.split(".")[0] if n.flow.startswith("bat") else n.flow
            states[flow]["nodes"] += 1
            states[flow]["executions"] += len(execs)
            if info is None or not info.finished:
                problem("not terminal after the drain", jid, info.state if info else None)
                continue
            states[flow][info.state] += 1
            got = info.state
            if got == "failed":
                got = "failed:handler" if _EXEC_RE.search(info.reason or "") \
                    else "failed:dependency"
            if got != want:
                problem("final state not the documented one", jid,
                        {"want": want, "got": got, "reason": info.reason})
                continue
            runs = want in ("completed", "failed:handler")
            if runs and not execs:
                problem("a node that should run never ran", jid, want)
            if not runs and execs:
                problem("a node ran though it should not", jid, want)
            if want == "completed" and isinstance(info.result, dict):
                end = led.ends.get(str(info.result.get("x")))
                if end is None or end["job"] != jid:
                    problem("result matches no recorded execution", jid, info.result)
            if want == "failed:dependency":
                named = (info.reason or "").split()
                dead = {d for d, pol in deps_of[jid] if pol == "fail"
                        and infos.get(d) is not None and infos[d].state == "failed"}
                if not (len(named) >= 3 and named[0] == "dependency" and named[2] in dead):
                    problem("a fail edge's dead-letter names no dead dependency", jid,
                            info.reason)
            for e in execs[1:]:
                dups[self.duplicate(e, execs, led, failover)] += 1
            # never early, never stranded
            deps = deps_of[jid]
            if not deps:
                continue
            # when it was due: every dependency ended; a fail edge's dead dependency ended
            # (the parent dead-lettered), a batch's first dead job ended (its on_death)
            if want == "failed:dependency":
                deps = [(d, p) for d, p in deps if p == "fail" and _state(infos, d) == "failed"]
            elif n.flow.endswith("on_death"):
                deps = [(d, p) for d, p in deps if _state(infos, d) == "failed"]
            ends = [ended(d) for d, _ in deps]
            if not ends or any(t is None for t in ends):
                continue
            ts = [t for t in ends if t is not None]
            first = want == "failed:dependency" or n.flow.endswith("on_death")
            ready = min(ts) if first else max(ts)
            for e in execs:
                if e["t"] < ready - 0.005:
                    problem("started before its dependencies were terminal", jid,
                            {"start": e["t"], "last_dependency_end": ready})
                    break
            t_rel = rel.get(jid)
            if t_rel is None and want == "failed:dependency" and info.finished_at:
                t_rel = info.finished_at.timestamp()
            if t_rel is None and execs:
                t_rel = execs[0]["t"]
            if t_rel is None or want == "cancelled":
                continue
            created = info.created_at.timestamp() if info.created_at else 0.0
            lat = t_rel - max(ready, created)
            latencies.append(lat)
            outage = sum(max(0.0, min(b, t_rel) - max(a, ready)) for a, b in failover)
            if lat - outage > self.fo.repair_every_s + self.fo.strand_slack_s:
                problem("left waiting over one repair interval after its last dependency"
                        " ended", jid, {"waited_s": round(lat, 2),
                                        "failover_overlap_s": round(outage, 2)})
        if any(k.startswith("unexplained") for k in dups):
            problem("duplicate executions outside any fault window", "-", dict(dups))
        left = self.leftovers(infos)
        failures = [f"{what}: {n} (e.g. {examples[what]})" for what, n in problems.items()]
        if left["n_unexpected"]:
            failures.append(f"workflow keys left: {left}")
        if self.exits:
            failures.append(f"workers exited on their own: {self.exits}")
        missing = [k for k in FLOW_FAULTS if not any(f["kind"] == k for f in self.faults)]
        if missing:
            failures.append(f"fault kinds never injected: {missing}")
        self.timing["check_s"] = time.time() - t0
        lats = sorted(latencies)
        return {"mode": "flows", "seed": self.fo.seed, "minutes": self.fo.minutes,
                "options": {k: str(v) if isinstance(v, Path) else v
                            for k, v in asdict(self.fo).items()},
                "queues": [self.qa, self.qb], "nodes": len(self.nodes),
                "flows": {k: dict(v) for k, v in states.items()},
                "executions": sum(v["executions"] for v in states.values()),
                "duplicates": dict(dups),
                "release_latency_s": {
                    "n": len(lats), "p50": round(statistics.median(lats), 3) if lats else None,
                    "p99": round(lats[int(len(lats) * 0.99)], 3) if lats else None,
                    "max": round(lats[-1], 3) if lats else None},
                "faults": {k: sum(1 for f in self.faults if f["kind"] == k)
                           for k in FLOW_FAULTS},
                "keys_left": left, "repairs": self.repairs(), "problems": dict(problems),
                "startup_exits": self.startup_exits, "unexpected_exits": self.exits,
                "fault_log": self.faults, "failures": failures}

    def dependencies(self) -> dict[str, list[tuple[str, str]]]:
        """Each node's dependencies with their policies (a batch callback's: the batch
        record, which ends when the batch is closed, then the batch's jobs; ``on_success``
        fail, ``on_complete`` continue, ``on_death`` death)."""
        deps = {jid: list(n.deps) for jid, n in self.nodes.items()}
        for b, info in self.batches.items():
            for kind, pol in (("on_success", "fail"), ("on_complete", "continue"),
                              ("on_death", "death")):
                deps[info["callbacks"][kind]] = [(b, pol)] + [(j, pol) for j in info["jobs"]]
        return deps

    def duplicate(self, e: dict[str, Any], execs: list[dict[str, Any]], led: LedgerView,
                  failover: list[tuple[float, float]]) -> str:
        """Why execution ``e`` (not a job's first) happened: the one before it was in a
        process killed or stopped while it ran, or a failover overlapped it."""
        prev = [p for p in execs if p["t"] < e["t"]]
        if not prev:
            return "unexplained"
        p = prev[-1]
        end = led.ends.get(p["x"])
        hi = e["t"]
        for f in self.faults:
            if f.get("pid") == p["pid"] and p["t"] <= f["t"] <= hi:
                return "worker killed" if f["kind"] == "kill_worker" else "handed back at stop"
        lo = p["t"]
        if any(a <= hi and b >= lo for a, b in failover):
            return "primary failover"
        if any(pid == p["pid"] and a <= hi and b >= lo - 1 for pid, a, b in led.stalls):
            return "stall"
        return "unexplained" if end is not None else "unexplained (no end)"



def render_flows(rep: dict[str, Any]) -> str:
    t = rep.get("timing", {})
    lines = [f"streamq flow chaos run: seed {rep['seed']}, {rep['minutes']:g} min of faults,"
             f" {rep.get('nodes', 0):,} nodes, wall time {t.get('total_s', 0):.0f} s"
             f" (enqueue {t.get('enqueue_s', 0):.0f} s, drain {t.get('drain_s', 0):.0f} s)", "",
             "| flow | nodes | completed | failed | cancelled | executions |",
             "|---|---:|---:|---:|---:|---:|"]
    for flow, row in rep.get("flows", {}).items():
        lines.append(f"| {flow} | {row.get('nodes', 0):,} | {row.get('completed', 0):,} |"
                     f" {row.get('failed', 0):,} | {row.get('cancelled', 0):,} |"
                     f" {row.get('executions', 0):,} |")
    lat = rep.get("release_latency_s", {})
    lines += ["", "faults: " + ", ".join(f"{k} {n}" for k, n in rep.get("faults", {}).items()),
              f"- duplicate executions: {rep.get('duplicates') or 'none'}",
              f"- release after the last dependency ended (s): p50 {lat.get('p50')},"
              f" p99 {lat.get('p99')}, max {lat.get('max')} over {lat.get('n')} waiting nodes",
              f"- resolves made by the repair sweep: {rep.get('repairs', 0)}",
              f"- workflow keys left: {rep.get('keys_left', {}).get('counts') or 'none'}",
              f"- checks: {'all passed' if rep.get('ok') else 'FAILED'}"]
    lines += [f"  - {f}" for f in rep["failures"]]
    return "\n".join(lines)


def _state(infos: dict[str, Any], jid: str) -> str | None:
    info = infos.get(jid)
    return None if info is None else str(info.state)
