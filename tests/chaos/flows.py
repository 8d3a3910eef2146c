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

The producer's flow calls hold a lock that a primary kill takes (written when the flow writes
did not WAIT for a replica; they now do under ``min_replicas``, but no kill overlaps them yet).
"""

from __future__ import annotations

import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from redis.crc import key_slot

from streamq import JobRef, JobSpec, Keys, Queue, chain, chord, group
from streamq._core.cluster_server import ClusterServer, wait_for
from streamq._core.retry import transient as engine_transient

from .common import HERE, transient
from .flow_checks import (
    EVENTS_MAXLEN,
    FLOW_FAULTS,
    SHARDS,
    FlowChecks,
    FlowOptions,
    Node,
    render_flows,
)

__all__ = ["FLOW_FAULTS", "LONG", "FlowChaos", "FlowOptions", "render_flows", "run_flows"]

POLICIES = ("fail", "continue", "ignore")
POLICY_WEIGHTS = (50, 25, 25)
LONG = {"fan": 10_000, "chain": 1_000, "dag": 2_000, "batch": 2_000}
"""The long run's sizes (``--flows`` without ``--scale``); CI runs a fraction of them."""


class FlowChaos(FlowChecks):
    def __init__(self, o: FlowOptions) -> None:
        super().__init__(o)
        self.enqueue_s = 0.0
        self.writing = threading.Lock()
        self.enqueued = False
        self.stop_enqueue = False
        self.enqueue_error: BaseException | None = None

    # ------------------------------------------------------------------ processes

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
            self.cluster = ClusterServer(primaries=3, replicas=1)
            self.cluster.start()  # (a start that fails is closed by the finally below)
            owners = {s: self.cluster.slot_owner(s) for s in (0, 5461, 10923)}
            for n in itertools.count():  # each queue's shards on three different primaries
                # (names of one length whose shards' slots never qualify exist: CRC16 is
                # affine, so the tag's length changes too)
                tag = uuid.uuid4().hex[:4 + n % 8]
                self.qa, self.qb = f"fa{self.fo.seed}-{tag}", f"fb{self.fo.seed}-{tag}"
                slots = [owners[max(b for b in owners if b <= s)] for s in self.shard_slots()]
                if len(set(slots[:SHARDS])) == len(set(slots[SHARDS:])) == SHARDS:
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

