"""Flow chaos: workflows on the loopback Redis Cluster (3 primaries, 3 replicas) under faults.

Two sharded queues (3 shards each, their slots spread over the primaries) carry, at once: a
fan-in (a chord of N children in queue A, its callback in queue B), a chain whose steps
alternate between the queues (every hand-off may cross slots), a random DAG whose nodes are in
either queue, with several parents per node and mixed edge policies (fail / continue /
ignore) and handlers that fail on purpose, and two batches with callbacks (one with a job that
fails: ``on_success`` dead-lettered, ``on_complete`` and ``on_death`` run; one without:
``on_death`` cancelled). Meanwhile workers (each one also the relay and repair sweep of every
shard it serves) are SIGKILLed and stopped gracefully at random, and a primary is SIGKILLed
and failed over. Then every node is checked against the execution ledger kept outside Redis:

- every node that should run ran (more than once only inside a fault's at-least-once window:
  its worker killed or stopped while it ran, or a primary failover);
- no execution started before every dependency was terminal (the ledger's start against the
  dependency's recorded end);
- no parent was released later than one repair interval after its last dependency ended
  (beyond the time a failover kept its slot unavailable);
- every policy did what docs/workflows.md says (a ``fail`` edge to a dead job dead-letters the
  parent naming it; ``continue`` / ``ignore`` run it; the batches' callbacks);
- workflow keys are back to zero (pending SETs, result copies, parents SETs: only the ones
  kept for a dead-lettered job's re-drive remain; outboxes and waiting indexes empty).

``python -m tests.chaos --cluster --flows`` (``make soak-flows``); the bounded CI run is
``tests/chaos/test_chaos_flows.py``. See ``docs/reliability.md#workflows-under-faults``.

Flows are enqueued before the faults begin (``wait.lua`` / ``link.lua`` do not WAIT for a
replica yet: docs/workflows.md#not-there-yet), then the replicas are synced.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redis.crc import key_slot

from streamq import ALL_EVENTS, JobRef, JobSpec, Keys, Queue, QueueConfig, chain, chord, group
from streamq._core.cluster_server import ClusterServer, wait_for
from streamq._core.retry import transient as engine_transient

from .cluster import ClusterChaos, ClusterOptions
from .common import HERE, transient
from .verify import _EXEC_RE, LedgerView, read_ledger

SHARDS = 3
FLOW_FAULTS = ("kill_worker", "kill_primary", "term_worker")
POLICIES = ("fail", "continue", "ignore")
POLICY_WEIGHTS = (50, 25, 25)
EVENTS_MAXLEN = 2_000_000
LONG = {"fan": 10_000, "chain": 1_000, "dag": 2_000, "batch": 2_000}
"""The long run's sizes (``--flows`` without ``--scale``); CI runs a fraction of them."""


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
    drain_timeout_s: float = 300.0


@dataclass
class Node:
    id: str
    queue: str
    flow: str
    kind: str = "instant"
    deps: list[tuple[str, str]] = field(default_factory=list)
    """(dependency id, policy)."""


class FlowChaos(ClusterChaos):
    def __init__(self, o: FlowOptions) -> None:
        super().__init__(o)
        self.fo = o
        self.qa = self.qb = ""
        self.nodes: dict[str, Node] = {}
        self.batches: dict[str, dict[str, Any]] = {}
        self.enqueue_s = 0.0
        self.writing = threading.Lock()
        self.enqueued = False
        self.stop_enqueue = False
        self.enqueue_error: BaseException | None = None

    # ------------------------------------------------------------------ processes

    def qconfig(self) -> QueueConfig:
        return QueueConfig(shards=SHARDS, min_replicas=1, min_replicas_timeout_ms=500,
                           event_kinds=ALL_EVENTS, events_maxlen=EVENTS_MAXLEN)

    def start_worker(self, name: str) -> None:
        assert self.cluster is not None
        cfg = {"worker": {"concurrency": self.fo.concurrency,
                          "visibility_timeout_s": self.fo.visibility_s,
                          "heartbeat_interval_s": 0.5, "consumer_dead_after_s": 10.0,
                          "block_ms": 1000, "grace_period_s": 1.0,
                          "promote_interval_s": self.fo.relay_every_s},
               "events_maxlen": EVENTS_MAXLEN,
               "repair_every_s": self.fo.repair_every_s,
               "repair_min_age_ms": self.fo.repair_min_age_ms,
               "queue": {"shards": SHARDS, "min_replicas": 1, "min_replicas_timeout_ms": 500}}
        with open(self.dir / f"worker-{name}.log", "ab") as err:
            self.procs[name] = subprocess.Popen(
                [sys.executable, str(HERE / "flow_worker.py"), self.cluster.url,
                 f"{self.qa},{self.qb}", str(self.dir / "ledger.jsonl"), name, json.dumps(cfg)],
                stdout=subprocess.DEVNULL, stderr=err, cwd=HERE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.spawned[name] = time.time()

    def shard_slots(self) -> list[int]:
        return [key_slot(Keys(q, shard=i).stream.encode()) for q in (self.qa, self.qb)
                for i in range(SHARDS)]

    def worker_fault(self, rng: random.Random, graceful: bool) -> dict[str, Any]:
        name = rng.choice(sorted(n for n, p in self.procs.items() if p.poll() is None))
        p = self.procs[name]
        ev: dict[str, Any] = {"kind": "term_worker" if graceful else "kill_worker",
                              "t": time.time(), "name": name, "pid": p.pid}
        if graceful:
            p.send_signal(signal.SIGTERM)
            try:
                rc = p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            ev["rc"] = rc
        else:
            p.kill()
            p.wait()
        ev["t1"] = time.time()
        del self.procs[name]
        self.start_worker(f"{name.split('.')[0]}.{len(self.faults) + 1}")
        return ev

    # ------------------------------------------------------------------ the flows

    def build(self, rng: random.Random) -> None:
        """Every node of every flow, with its kind and dependencies (ids unique across both
        queues: the ledger is keyed by job id)."""
        o, qa, qb = self.fo, self.qa, self.qb
        for i in range(o.fan):
            self.add(Node(f"fan-{i:06d}", qa, "fan", _kind(rng, fail=0.0, slow=0.5)))
        self.add(Node("fan-sink", qb, "fan", deps=[(f"fan-{i:06d}", "fail")
                                                   for i in range(o.fan)]))
        for i in range(o.chain):
            self.add(Node(f"ch-{i:05d}", qa if i % 2 == 0 else qb, "chain",
                          _kind(rng, fail=0.0, slow=0.1),
                          [(f"ch-{i - 1:05d}", "fail")] if i else []))
        for i in range(o.dag):
            k = rng.choice((0, 0, 1, 1, 2, 2, 3, 4)) if i else 0
            picks = rng.sample(range(max(0, i - 100), i), min(k, i))
            self.add(Node(f"dag-{i:05d}", rng.choice((qa, qb)), "dag",
                          _kind(rng, fail=0.06, slow=0.4),
                          [(f"dag-{j:05d}", rng.choices(POLICIES, POLICY_WEIGHTS)[0])
                           for j in sorted(picks)]))
        for b, size, bad in (("bat1", o.batch, max(1, o.batch // 100)),
                             ("bat2", max(10, o.batch // 4), 0)):
            ids = [f"{b}-{i:05d}" for i in range(size)]
            bad_ids = set(rng.sample(ids, bad))
            for jid in ids:
                self.add(Node(jid, rng.choice((qa, qb)), b,
                              "fail" if jid in bad_ids else _kind(rng, fail=0.0, slow=0.3)))
            self.batches[b] = {"jobs": ids, "bad": sorted(bad_ids), "callbacks": {}}

    def add(self, n: Node) -> None:
        self.nodes[n.id] = n

    def spec(self, n: Node) -> JobSpec:
        payload: dict[str, Any] = {}
        if n.kind == "slow":
            payload = {"s": round(random.Random(n.id).uniform(0.05, 0.6), 2)}
        return JobSpec(f"chaos.{n.kind}", payload, queue=n.queue, job_id=n.id,
                       max_attempts=1 if n.kind == "fail" else 25)

    def enqueue_all(self, pace_s: float) -> None:
        """The producer (a thread): the fan-in and the chain at once, the batches opened;
        then the DAG's nodes and the batches' jobs (500 per ``add``) spread over ``pace_s``
        seconds, the batches closed last. Every call holds ``self.writing``, which a primary
        kill takes around its sync and failover: flow writes do not WAIT for a replica yet
        (docs/workflows.md#not-there-yet), so none may be in flight when a primary dies."""
        assert self.cluster is not None
        qs = {q: Queue.from_url(self.cluster.url, q, self.qconfig()) for q in (self.qa, self.qb)}
        t0 = time.time()

        def call(fn: Callable[[], Any]) -> Any:
            with self.writing:
                return _retry(fn)
        try:
            nodes = self.nodes
            fan = [self.spec(nodes[f"fan-{i:06d}"]) for i in range(self.fo.fan)]
            sink = self.spec(nodes["fan-sink"])
            call(lambda: qs[self.qb].enqueue_flow(chord(group(fan), sink), flow_id="fan"))
            steps = [self.spec(nodes[f"ch-{i:05d}"]) for i in range(self.fo.chain)]
            if steps:
                call(lambda: qs[self.qa].enqueue_flow(chain(*steps), flow_id="ch"))
            cb = JobSpec("chaos.instant", {})
            adds: list[Callable[[], Any]] = []
            dag: list[Callable[[], Any]] = []
            opened = []
            for b, info in self.batches.items():
                batch = call(lambda b=b: qs[self.qb].batch(  # type: ignore[misc]
                    on_success=cb, on_complete=cb, on_death=cb, batch_id=b))
                opened.append(batch)
                info["callbacks"] = dict(batch.callbacks)
                for kind, cid in batch.callbacks.items():
                    self.add(Node(cid, self.qb, f"{b}.{kind}"))
                jobs = [self.spec(nodes[j]) for j in info["jobs"]]
                adds += [_adder(batch, jobs[k:k + 500]) for k in range(0, len(jobs), 500)]
            for i in range(self.fo.dag):
                n = nodes[f"dag-{i:05d}"]
                s = self.spec(n)
                kw: dict[str, Any] = {"job_id": n.id, **s.options}
                if n.deps:
                    kw["depends_on"] = [JobRef(nodes[d].queue, d, pol)  # type: ignore[arg-type]
                                        for d, pol in n.deps]
                dag.append(lambda s=s, n=n, kw=kw: qs[n.queue].enqueue(  # type: ignore[misc]
                    s.type, s.payload, **kw))
            # the batches' adds spread among the DAG's nodes
            order: list[Callable[[], Any]] = []
            every = max(1, len(dag) // (len(adds) + 1))
            for k, w in enumerate(dag):
                order.append(w)
                if adds and k % every == every - 1:
                    order.append(adds.pop(0))
            order += adds
            for k, w in enumerate(order):
                if self.stop_enqueue:
                    return
                call(w)
                lag = t0 + pace_s * (k + 1) / len(order) - time.time()
                if lag > 0:
                    time.sleep(lag)
            for batch in opened:
                call(batch.close)
            self.enqueued = True
        except BaseException as exc:  # noqa: BLE001 - reported by the run
            self.enqueue_error = exc
        finally:
            for q in qs.values():
                q.close()
            self.enqueue_s = time.time() - t0

    def kill_primary(self, rng: random.Random) -> dict[str, Any]:
        with self.writing:
            return super().kill_primary(rng)

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        t_start = time.time()
        own_dir = self.fo.workdir is None
        self.dir = Path(self.fo.workdir or tempfile.mkdtemp(prefix="streamq-chaos-flows-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "ledger.jsonl").unlink(missing_ok=True)
        (self.dir / "ledger.jsonl").touch()
        rng = random.Random(f"flow-faults-{self.fo.seed}")
        report: dict[str, Any] = {"failures": []}
        try:
            self.cluster = ClusterServer(primaries=3, replicas=1).start()
            while True:  # each queue's shards on three different primaries
                tag = uuid.uuid4().hex[:6]
                self.qa, self.qb = f"fa{self.fo.seed}-{tag}", f"fb{self.fo.seed}-{tag}"
                slots = self.shard_slots()
                if all(len({self.cluster.slot_owner(s) for s in slots[k:k + SHARDS]}) == SHARDS
                       for k in (0, SHARDS)):
                    break
            self.queue = self.qa
            for k in range(self.fo.workers):
                self.start_worker(f"w{k + 1}")
            beats = Keys(self.qa).workers
            wait_for(lambda: self._zcard(beats) >= self.fo.workers, 60, "the workers are up")
            self.say(f"seed {self.fo.seed}, queues {self.qa} {self.qb}, cluster"
                     f" {self.cluster.url}, dir {self.dir}")
            self.build(random.Random(f"flows-{self.fo.seed}"))
            t0 = time.time()
            end = t0 + self.fo.minutes * 60
            producer = threading.Thread(target=self.enqueue_all, name="chaos-flow-producer",
                                        args=(self.fo.minutes * 60 * 0.6,), daemon=True)
            producer.start()
            next_fault = t0 + 3
            while time.time() < end or producer.is_alive():
                self.watch_workers()
                if self.enqueue_error is not None:
                    raise RuntimeError("the producer failed") from self.enqueue_error
                if time.time() >= next_fault and time.time() < end:
                    kind = FLOW_FAULTS[len(self.faults) % len(FLOW_FAULTS)]
                    ev = self.kill_primary(rng) if kind == "kill_primary" \
                        else self.worker_fault(rng, graceful=kind == "term_worker")
                    self.faults.append(ev)
                    self.say(f"{kind} done in {ev['t1'] - ev['t']:.1f} s")
                    next_fault = time.time() + rng.uniform(0.5, 1.5) * self.fo.fault_every_s
                time.sleep(0.1)
            if self.enqueue_error is not None:
                raise RuntimeError("the producer failed") from self.enqueue_error
            self.say(f"{len(self.nodes):,} nodes enqueued in {self.enqueue_s:.1f} s")
            self.timing["fault_phase_s"] = time.time() - t0
            report = self.verify_flows()
        finally:
            self.stop_enqueue = True
            unclean = self.stop_workers()
            if self.cluster is not None:
                self.cluster.close()
        if unclean:
            report["failures"].append(f"workers did not stop cleanly on SIGTERM: {unclean}")
        self.timing["enqueue_s"] = self.enqueue_s
        self.timing["total_s"] = time.time() - t_start
        report["timing"] = {k: round(v, 1) for k, v in self.timing.items()}
        report["ok"] = not report["failures"]
        if report["ok"] and own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            report["workdir"] = str(self.dir)
        if self.fo.out is not None:
            self.fo.out.parent.mkdir(parents=True, exist_ok=True)
            self.fo.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        return report

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
                deps = [(d, p) for d, p in deps if p == "fail" and infos[d].state == "failed"]
            elif n.flow.endswith("on_death"):
                deps = [(d, p) for d, p in deps if infos[d].state == "failed"]
            ends = [ended(d) for d, _ in deps]
            if not ends or any(t is None for t in ends):
                continue
            ts = [t for t in ends if t is not None]
            ready = max(ts) if want == "completed" and not n.flow.endswith("on_death") \
                else min(ts)
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
            if lat - outage > self.fo.repair_every_s + 1.0:
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
                "keys_left": left, "problems": dict(problems),
                "startup_exits": self.startup_exits, "unexpected_exits": self.exits,
                "fault_log": self.faults, "failures": failures}

    def dependencies(self) -> dict[str, list[tuple[str, str]]]:
        """Each node's dependencies with their policies (a batch callback's: the batch's
        jobs; ``on_success`` fail, ``on_complete`` continue, ``on_death`` death)."""
        deps = {jid: list(n.deps) for jid, n in self.nodes.items()}
        for info in self.batches.values():
            for kind, pol in (("on_success", "fail"), ("on_complete", "continue"),
                              ("on_death", "death")):
                deps[info["callbacks"][kind]] = [(j, pol) for j in info["jobs"]]
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


def _kind(rng: random.Random, fail: float, slow: float) -> str:
    r = rng.random()
    return "fail" if r < fail else "slow" if r < fail + slow else "instant"


def _adder(batch: Any, part: list[JobSpec]) -> Callable[[], Any]:
    return lambda: batch.add(part)


def _retry(fn: Callable[[], Any]) -> Any:
    give_up = time.monotonic() + 120
    while True:
        try:
            return fn()
        except Exception as exc:
            if time.monotonic() > give_up or not (transient(exc) or engine_transient(exc)):
                raise
            time.sleep(0.2)


def run_flows(opts: FlowOptions) -> dict[str, Any]:
    return FlowChaos(opts).run()


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
              f"- workflow keys left: {rep.get('keys_left', {}).get('counts') or 'none'}",
              f"- checks: {'all passed' if rep.get('ok') else 'FAILED'}"]
    lines += [f"  - {f}" for f in rep["failures"]]
    return "\n".join(lines)
