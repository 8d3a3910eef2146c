"""Cluster chaos: a sharded, grouped, prioritised queue drains on the loopback Redis Cluster
(3 primaries, 3 replicas: ``streamq._core.cluster_server``) while the primaries under it are
SIGKILLed (their replicas take over; the killed node comes back empty as a replica) and its
shards' slots are migrated to other primaries, key by key, as ``redis-cli --cluster reshard``
does. Afterwards every accepted job is checked against the execution ledger kept outside
Redis: none lost, each outcome written by a recorded execution, every dead letter explained.

``python -m tests.chaos --cluster --minutes M --seed S`` (``make soak-cluster``); the bounded
CI run is ``tests/chaos/test_chaos_cluster.py``. See ``docs/reliability.md#cluster-chaos``.

The cluster nodes keep no data on disk (no AOF): a primary killed before its replica got a
write loses it. So the queue runs with ``min_replicas=1`` (docs/durability.md): a job counts as
accepted only once a replica confirmed it (``ReplicationTimeout`` otherwise: the producer sends
it again under the same id), and workers settle with a WAIT too. A settle the failover lost
puts the job back to its running state on the new primary: its lease lapses and it runs again
(a duplicate, counted), never lost.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
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
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from redis.crc import key_slot

from streamq import (
    ALL_EVENTS,
    Keys,
    LayoutChanged,
    PartialEnqueueError,
    Queue,
    QueueConfig,
    ReplicationTimeout,
)
from streamq._core.cluster_server import ClusterServer, wait_for
from streamq._core.keys import GROUP, shard_of
from streamq._core.model import entry_id
from streamq._core.retry import transient as engine_transient

from .common import HERE, LAPSED, max_attempts_of, transient
from .reshard_soak import HIGH, LOW, Resharder, render_reshard, reshard_report
from .verify import _EXEC_RE, read_ledger

KINDS = ("instant", "slow", "once", "last", "fail")
MIX = (45, 15, 20, 10, 10)
SHARDS = 3
GROUPS = 6
GROUP_LIMIT = 3
CLUSTER_FAULTS = ("kill_primary", "migrate_slot")
WORKER_FAULTS = ("kill_worker", "term_worker")
RESHARD_MENU = ("kill_primary", "migrate_slot", "kill_worker", "kill_primary", "migrate_slot",
                "term_worker")
"""The rotation with ``--reshard``: the primary kills and slot moves as often as without."""
"""With ``--reshard``: a worker SIGKILLed, or SIGTERMed (a graceful stop), and replaced."""


@dataclass
class ClusterOptions:
    minutes: float = 1.5
    seed: int = 1
    out: Path | None = None
    workdir: Path | None = None
    rate: float = 80.0
    """Jobs per second offered (each batch waits for a replica: min_replicas=1)."""
    workers: int = 2
    concurrency: int = 16
    visibility_s: float = 3.0
    fault_every_s: float = 15.0
    """Mean time between the end of one fault and the start of the next."""
    drain_timeout_s: float = 180.0
    verbose: bool = True
    reshard: bool = False
    """Reshard the queue 3 -> 6 -> 3 ... during the fault phase (tests/chaos/reshard_soak.py);
    workers are SIGKILLed and SIGTERMed too."""
    reshard_every_s: float = 20.0
    """Mean time between two reshards (each at a random time: 0.3-1.7 times it)."""
    abandon_p: float = 0.35
    reshard_turns: int = 0
    """0: reshard until the fault phase ends; else this many turns, the first one a begin
    abandoned half-way (the bounded run: 2, one reshard up and one down)."""
    """The share of begins abandoned half-way (finished by a producer or the next call)."""


def qconfig() -> QueueConfig:
    return QueueConfig(shards=SHARDS, min_replicas=1, min_replicas_timeout_ms=500,
                       group_concurrency=GROUP_LIMIT, event_kinds=ALL_EVENTS)


def job_spec(i: int, rng: random.Random) -> dict[str, Any]:
    kind = rng.choices(KINDS, MIX)[0]
    spec: dict[str, Any] = {"type": f"chaos.{kind}", "job_id": f"{kind}-{i:07d}",
                            "max_attempts": max_attempts_of(kind), "payload": {},
                            "group": f"g{rng.randrange(GROUPS)}",
                            "priority": rng.randrange(5)}
    if kind in ("slow", "once"):
        spec["type"] = "chaos.slow"
        spec["payload"] = {"s": round(rng.uniform(0.2, 1.5), 2) if kind == "slow"
                           or rng.random() < 0.3 else 0}
    elif kind == "last":
        spec["type"] = "chaos.retry"
        spec["payload"] = {"fails": 1, "d": round(rng.uniform(0.1, 0.5), 2)}
    return spec


class ClusterProducer(threading.Thread):
    """Offers ``rate`` jobs per second in batches; a batch that raised (a node down, a slot
    moving, a replica that did not confirm) is sent again with the same ids until every job
    of it is written and confirmed: a ``duplicate`` then means ours, accepted earlier."""

    def __init__(self, url: str, queue: str, rate: float, seed: int, resend: int = 0) -> None:
        super().__init__(name="chaos-cluster-producer", daemon=True)
        self.url, self.queue, self.rate = url, queue, rate
        self.rng = random.Random(seed)
        self.resend = resend
        """Ids accepted by earlier calls sent again in each batch (each must answer
        ``duplicate``: dedup by id across reshards)."""
        self.order: list[str] = []
        self.resent = 0
        self.not_duplicate: list[tuple[str, str, float, float]] = []
        self.stop = threading.Event()
        self.accepted: dict[str, dict[str, Any]] = {}
        self.errors: collections.Counter[str] = collections.Counter()
        self.error: BaseException | None = None

    def run(self) -> None:
        q = Queue.from_url(self.url, self.queue, qconfig())
        try:
            t0, i = time.monotonic(), 0
            while not self.stop.is_set():
                due = int((time.monotonic() - t0) * self.rate)
                if due <= i:
                    time.sleep(0.05)
                    continue
                n = min(due - i, 200)
                old = self.rng.sample(self.order, min(self.resend, len(self.order)))
                self.send(q, [job_spec(i + k, self.rng) for k in range(n)],
                          [self.accepted[j] for j in old])
                i += n
        except BaseException as exc:  # noqa: BLE001 - reported by the harness
            self.error = exc
        finally:
            q.close()

    def send(self, q: Queue, batch: list[dict[str, Any]],
             old: list[dict[str, Any]] | None = None) -> None:
        give_up, t0 = time.monotonic() + 180, time.time()
        batch = [*batch, *(old or [])]
        while True:
            try:
                results = q.enqueue_many(batch)
                break
            except Exception as exc:
                self.errors[type(exc).__name__] += 1
                causes = [exc, *(exc.errors.values() if isinstance(exc, PartialEnqueueError)
                                 else ())]
                retry = any(isinstance(e, (ReplicationTimeout, LayoutChanged)) or transient(e)
                            or engine_transient(e) for e in causes)
                if time.monotonic() > give_up or not retry:
                    raise
                time.sleep(0.2)
        known = {s["job_id"] for s in old or ()}
        for spec, res in zip(batch, results, strict=True):
            if res.status not in ("queued", "duplicate"):
                raise RuntimeError(f"job {res.job_id} not accepted: {res}")
            if spec["job_id"] in known:
                self.resent += 1
                if res.status != "duplicate":  # (judged against the faults: reshard_soak.py)
                    self.not_duplicate.append((res.job_id, res.status, t0, time.time()))
                continue
            self.accepted[spec["job_id"]] = spec
            self.order.append(spec["job_id"])


@dataclass
class ClusterChaos:
    o: ClusterOptions
    cluster: ClusterServer | None = None
    queue: str = ""
    dir: Path = field(default_factory=Path)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    spawned: dict[str, float] = field(default_factory=dict)
    startup_exits: list[dict[str, Any]] = field(default_factory=list)
    """Workers that exited while starting (Redis not reachable then: by design they fail
    fast, and are started again); an exit of a running worker fails the run."""
    faults: list[dict[str, Any]] = field(default_factory=list)
    exits: list[dict[str, Any]] = field(default_factory=list)
    timing: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    """Held by a primary kill around its replica sync and the kill, and by the resharder
    around each call (a reshard's writes have no WAIT: a kill must not take one no replica
    has yet)."""
    resharder: Resharder | None = None
    retired: dict[str, Any] = field(default_factory=dict)

    def say(self, msg: str) -> None:
        if self.o.verbose:
            print(f"[chaos-cluster {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    # ------------------------------------------------------------------ processes

    def start_worker(self, name: str) -> None:
        assert self.cluster is not None
        cfg = {"worker": {"concurrency": self.o.concurrency,
                          "visibility_timeout_s": self.o.visibility_s,
                          "heartbeat_interval_s": 0.5, "consumer_dead_after_s": 10.0,
                          "block_ms": 1000, "grace_period_s": 3.0},
               "events_maxlen": 1_000_000,
               "queue": {"shards": SHARDS, "min_replicas": 1, "min_replicas_timeout_ms": 500,
                         "group_concurrency": GROUP_LIMIT}}
        with open(self.dir / f"worker-{name}.log", "ab") as err:
            self.procs[name] = subprocess.Popen(
                [sys.executable, str(HERE / "worker.py"), self.cluster.url, self.queue,
                 str(self.dir / "ledger.jsonl"), name, json.dumps(cfg)],
                stdout=subprocess.DEVNULL, stderr=err, cwd=HERE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.spawned[name] = time.time()

    def watch_workers(self) -> None:
        for name, p in list(self.procs.items()):
            if p.poll() is not None:
                ev = {"name": name, "rc": p.returncode, "t": time.time()}
                log = (self.dir / f"worker-{name}.log").read_text(errors="replace")[-30000:]
                starting = time.time() - self.spawned[name] < 30 and "ConnectionError" in log \
                    and "in start" in log
                (self.startup_exits if starting else self.exits).append(ev)
                self.say(f"worker {name} exited with {p.returncode}; replacing it")
                self.start_worker(f"{name}.{len(self.exits) + len(self.startup_exits)}")
                del self.procs[name]

    # ------------------------------------------------------------------ faults

    def shard_slots(self) -> list[int]:
        n = HIGH if self.o.reshard else SHARDS
        return [key_slot(Keys(self.queue, shard=i).stream.encode()) for i in range(n)]

    def synced(self) -> None:
        """Until every live replica has every write its primary had when this was called (a
        MIGRATE's writes to its target have no WAIT: a kill that follows must not lose what
        the migration moved; it may lose only writes nobody was told were confirmed)."""
        c = self.cluster
        assert c is not None
        want = {p: int(c.info(p, "replication").get("master_repl_offset", 0))
                for p in c.primary_ports()}

        def caught_up() -> bool:
            for port, offset in want.items():
                info = c.info(port, "replication")
                for k, v in info.items():
                    if k.startswith("slave") and isinstance(v, dict) and \
                            int(v.get("offset", -1)) < offset:
                        return False
            return True
        wait_for(caught_up, 30, "the replicas caught up")

    def kill_primary(self, rng: random.Random) -> dict[str, Any]:
        c = self.cluster
        assert c is not None
        with self.lock:
            self.synced()
            port = c.slot_owner(rng.choice(self.shard_slots()))
            (replica,) = c.replicas_of(port)
            ev: dict[str, Any] = {"kind": "kill_primary", "t": time.time(), "port": port,
                                  "replica": replica}
            c.kill(port)
        c.wait_promoted(replica, timeout_s=60)
        ev["promoted_s"] = round(time.time() - ev["t"], 2)
        c.restart(port, timeout_s=60)  # back empty, as the new primary's replica
        ev["t1"] = time.time()
        return ev

    def migrate_slot(self, rng: random.Random) -> dict[str, Any]:
        c = self.cluster
        assert c is not None
        self.synced()
        slot = rng.choice(self.shard_slots())
        src = c.slot_owner(slot)
        dst = rng.choice([p for p in c.primary_ports() if p != src])
        ev: dict[str, Any] = {"kind": "migrate_slot", "t": time.time(), "slot": slot,
                              "from": src, "to": dst}
        ev["keys"] = c.migrate_slot(slot, dst, batch=20, pause_s=0.05)
        ev["t1"] = time.time()
        return ev

    def stop_worker(self, rng: random.Random, kind: str) -> dict[str, Any]:
        """SIGKILL (``kill_worker``) or SIGTERM (``term_worker``: a graceful stop) one
        worker, then start another in its place."""
        name = rng.choice(sorted(self.procs))
        p = self.procs.pop(name)
        ev: dict[str, Any] = {"kind": kind, "t": time.time(), "worker": name}
        p.send_signal(signal.SIGKILL if kind == "kill_worker" else signal.SIGTERM)
        try:
            ev["rc"] = p.wait(60)
        except subprocess.TimeoutExpired:
            p.kill()
            ev["rc"] = f"killed after 60 s: {p.wait()}"
        self.start_worker(f"{name.split('.')[0]}.{len(self.faults) + 1}")
        ev["t1"] = time.time()
        return ev

    # ------------------------------------------------------------------ the run

    def run(self) -> dict[str, Any]:
        t_start = time.time()
        own_dir = self.o.workdir is None
        self.dir = Path(self.o.workdir or tempfile.mkdtemp(prefix="streamq-chaos-cluster-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "ledger.jsonl").unlink(missing_ok=True)
        (self.dir / "ledger.jsonl").touch()
        rng = random.Random(f"cluster-faults-{self.o.seed}")
        producer: ClusterProducer | None = None
        try:
            self.cluster = ClusterServer(primaries=3, replicas=1).start()
            while True:  # a queue whose shards live on three different primaries
                self.queue = f"chaos-c{self.o.seed}-{uuid.uuid4().hex[:6]}"
                if len({self.cluster.slot_owner(s) for s in self.shard_slots()}) == SHARDS:
                    break
            for k in range(self.o.workers):
                self.start_worker(f"w{k + 1}")
            beats = Keys(self.queue).workers  # every worker up before any fault
            wait_for(lambda: self._zcard(beats) >= self.o.workers, 60, "the workers are up")
            producer = ClusterProducer(self.cluster.url, self.queue, self.o.rate, self.o.seed,
                                       resend=5 if self.o.reshard else 0)
            producer.start()
            if self.o.reshard:
                self.resharder = Resharder(self.cluster.url, self.queue, self.o.seed,
                                           self.o.reshard_every_s, self.o.abandon_p, self.lock,
                                           self.say, self.o.reshard_turns)
                self.resharder.start()
            self.say(f"seed {self.o.seed}, queue {self.queue}, cluster {self.cluster.url},"
                     f" dir {self.dir}")
            t0 = time.time()
            end = t0 + self.o.minutes * 60
            kinds = list(kinds_of(self.o))
            next_fault = t0 + 5
            while time.time() < end:
                self.watch_workers()
                if producer.error is not None:
                    raise RuntimeError("the producer failed") from producer.error
                if self.resharder is not None and self.resharder.error is not None:
                    raise RuntimeError("the resharder failed") from self.resharder.error
                if time.time() >= next_fault:
                    kind = kinds[len(self.faults) % len(kinds)]
                    ev = self.kill_primary(rng) if kind == "kill_primary" \
                        else self.migrate_slot(rng) if kind == "migrate_slot" \
                        else self.stop_worker(rng, kind)
                    self.faults.append(ev)
                    self.say(f"{kind} done in {ev['t1'] - ev['t']:.1f} s; accepted"
                             f" {len(producer.accepted)}")
                    next_fault = time.time() + rng.uniform(0.5, 1.5) * self.o.fault_every_s
                time.sleep(0.1)
            self.timing["fault_phase_s"] = time.time() - t0
            if self.resharder is not None:  # the last one down to 3, producers still sending
                self.resharder.stop.set()
                self.resharder.join(300)
                if self.resharder.error is not None:
                    raise RuntimeError("the resharder failed") from self.resharder.error
                self.resharder.once(target=LOW, abandon=False)
                time.sleep(3)
            producer.stop.set()
            producer.join(200)
            if producer.error is not None:
                raise RuntimeError("the producer failed") from producer.error
            report = self.check(producer)
            if self.resharder is not None:
                reshard_report(self, report, producer)
        finally:
            if producer is not None:
                producer.stop.set()
            if self.resharder is not None:
                self.resharder.stop.set()
            unclean = self.stop_workers()
            if self.cluster is not None:
                self.cluster.close()
        if unclean:
            report["failures"].append(f"workers did not stop cleanly on SIGTERM: {unclean}")
        self.timing["total_s"] = time.time() - t_start
        report["timing"] = {k: round(v, 1) for k, v in self.timing.items()}
        report["ok"] = not report["failures"]
        if report["ok"] and own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
        else:
            report["workdir"] = str(self.dir)
        if self.o.out is not None:
            self.o.out.parent.mkdir(parents=True, exist_ok=True)
            self.o.out.write_text(json.dumps(report, indent=2, default=str) + "\n")
        return report

    def _zcard(self, key: str) -> int:
        assert self.cluster is not None
        self.watch_workers()
        with self.cluster.node(self.cluster.owner(key)) as c:
            return int(c.zcard(key))

    def stop_workers(self) -> list[str]:
        unclean = []
        for p in self.procs.values():
            if p.poll() is None:
                p.terminate()
        for name, p in self.procs.items():
            try:
                rc = p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = p.wait()
            if rc != 0:
                unclean.append(f"{name}: {rc}")
        return unclean

    # ------------------------------------------------------------------ checks

    def check(self, producer: ClusterProducer) -> dict[str, Any]:
        assert self.cluster is not None
        t0 = time.time()
        accepted = dict(producer.accepted)
        q = Queue.from_url(self.cluster.url, self.queue, qconfig())
        infos: dict[str, Any] = {}
        try:
            def drained() -> bool:
                self.watch_workers()
                for jid in [j for j in accepted
                            if j not in infos or infos[j].state not in ("completed", "failed")]:
                    infos[jid] = q.get(jid)
                    if infos[jid] is None or infos[jid].state not in ("completed", "failed"):
                        return False
                return True
            with contextlib.suppress(RuntimeError):
                wait_for(drained, self.o.drain_timeout_s, "every accepted job to end")
            for jid in accepted:  # after a timeout: drained() stopped at the first job not
                info = infos.get(jid)  # ended; read the rest, so 'lost' lists only those
                if info is None or info.state not in ("completed", "failed"):
                    infos[jid] = q.get(jid)
        finally:
            q.close()
        self.timing["drain_s"] = time.time() - t0
        led = read_ledger(self.dir / "ledger.jsonl")
        vt = self.o.visibility_s
        windows = [(f["t"] - vt, f["t1"] + vt + 2) for f in self.faults]
        stalls = [(a, b) for _, a, b in led.stalls]
        failures: list[str] = []
        problems: collections.Counter[str] = collections.Counter()
        examples: dict[str, Any] = {}
        jobs: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        dead: collections.Counter[str] = collections.Counter()
        lost: list[str] = []
        lost_detail: dict[str, Any] = {}
        twice: collections.Counter[str] = collections.Counter()

        def problem(what: str, jid: str, detail: Any) -> None:
            problems[what] += 1
            examples.setdefault(what, (jid, detail))

        def in_fault(lo: float, hi: float) -> bool:
            return any(a <= hi and b >= lo for a, b in windows + stalls)

        for jid in accepted:
            kind = jid.rsplit("-", 1)[0]
            jobs[kind]["accepted"] += 1
            info = infos.get(jid)
            execs = sorted(led.starts.get(jid, []), key=lambda e: e["t"])
            jobs[kind]["executions"] += len(execs)
            runs = len({e["a"] for e in execs})
            for prev, e in itertools.pairwise(execs):  # a run after one that did not end in
                if led.ends.get(prev["x"], {}).get("o") == "retry":  # Retry: a duplicate,
                    continue  # allowed only across a fault or a stall (a lapse, a hand-back)
                twice[kind] += 1
                if not in_fault(prev["t"], e["t"]):
                    problem("ran again without a fault between the runs", jid, [prev, e])
            if info is None or info.state not in ("completed", "failed"):
                lost.append(f"{jid}: {info.state if info else 'no record'}")
                continue
            jobs[kind][info.state] += 1
            if info.state == "completed":
                if kind == "fail":
                    problem("an always-failing job completed", jid, info.result)
                res = info.result
                end = led.ends.get(str(res.get("x")) if isinstance(res, dict) else "")
                if end is None or end["job"] != jid or end["r"] != res:
                    problem("completed result matches no recorded execution", jid, res)
                continue
            reason = info.reason or ""
            if kind == "fail" and _EXEC_RE.search(reason):
                dead["Fail raised by the handler"] += 1
            elif reason == LAPSED and in_fault(_ts(info.started_at, 0.0) - 0.05,
                                               _ts(info.finished_at, time.time()) + 0.5):
                dead["lease lapsed: primary killed, slot moving or a stall"] += 1
            elif reason == "attempts exhausted" and runs >= max_attempts_of(kind):
                dead["retries exhausted (ran max_attempts times)"] += 1
            else:
                problem("dead letter nothing explains", jid,
                        {"reason": reason, "runs": runs, "max": max_attempts_of(kind)})
        group_report = self.group_limits(led, accepted, in_fault)
        if group_report["over_limit_outside_faults"]:
            problem("a group ran more than its limit outside any fault", "-", group_report)
        failures += [f"{what}: {n} (e.g. {examples[what]})" for what, n in problems.items()]
        if lost:
            failures.append(f"lost: {len(lost)} (e.g. {lost[:5]})")
            lost_detail = self.where_lost([x.split(":", 1)[0] for x in lost[:5]])
            failures.append(f"where they are: {json.dumps(lost_detail, default=str)[:4000]}")
        if self.exits:
            failures.append(f"workers exited on their own: {self.exits}")
        menu = CLUSTER_FAULTS + (WORKER_FAULTS if self.o.reshard else ())
        must = menu if len(self.faults) >= len(kinds_of(self.o)) else CLUSTER_FAULTS
        missing = [k for k in must if not any(f["kind"] == k for f in self.faults)]
        if missing:
            failures.append(f"fault kinds never injected: {missing}")
        self.timing["check_s"] = time.time() - t0
        return {"mode": "cluster", "seed": self.o.seed, "minutes": self.o.minutes,
                "options": {k: str(v) if isinstance(v, Path) else v
                            for k, v in asdict(self.o).items()},
                "queue": {"name": self.queue, "shards": SHARDS, "groups": GROUPS,
                          "group_limit": GROUP_LIMIT, "priorities": 5, "min_replicas": 1},
                "accepted": len(accepted), "lost": len(lost),
                "jobs": {k: dict(jobs[k]) for k in KINDS},
                "executions": sum(j["executions"] for j in jobs.values()),
                "faults": {k: sum(1 for f in self.faults if f["kind"] == k) for k in menu},
                "ran_twice": dict(twice),
                "dead_letters": {"total": sum(dead.values()), "by_reason": dict(dead)},
                "groups": group_report, "producer_errors": dict(producer.errors),
                "startup_exits": self.startup_exits, "unexpected_exits": self.exits,
                "worker_stalls": len(led.stalls), "fault_log": self.faults,
                "lost_detail": lost_detail, "failures": failures}

    def where_lost(self, job_ids: list[str]) -> dict[str, Any]:
        """For a job that did not end: its record in every shard that has one (raw fields but
        the payload), and its entry in each level stream of that shard (in the stream, pending
        with whom), read straight from the cluster: what the next look at a failure needs."""
        assert self.cluster is not None
        from redis.cluster import RedisCluster

        out: dict[str, Any] = {}
        first = self.cluster.url.split("://", 1)[1].split(",")[0].split("/")[0]
        rc = RedisCluster.from_url(f"redis://{first}", protocol=2, decode_responses=True)
        try:
            base = Keys(self.queue, qconfig().key_prefix)
            for jid in job_ids:
                seen: dict[str, Any] = {}
                for n in range(16):
                    k = base.of_shard(n)
                    rec = {f: v for f, v in rc.hgetall(k.job(jid)).items() if f not in ("b",)}
                    if not rec:
                        continue
                    entry = entry_id(str(rec.get("e", "")).encode())
                    streams: dict[str, Any] = {}
                    for s in [k.stream, *k.level_streams]:
                        try:
                            pend = rc.xpending_range(s, GROUP, min="-", max="+", count=10000)
                            streams[s] = {
                                "len": rc.xlen(s), "pending": len(pend),
                                "entry pending": [x for x in pend if x["message_id"] == entry],
                                "entry in stream": bool(entry and rc.xrange(s, entry, entry))}
                        except Exception as exc:  # noqa: BLE001 - NOGROUP: never read
                            streams[s] = f"{type(exc).__name__}: {exc}"
                    seen["entry"] = entry
                    seen[f"shard {n}"] = {"record": rec, "streams": streams}
                out[jid] = seen
        except Exception as exc:  # noqa: BLE001 - a diagnosis must not hide the failure
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            rc.close()
        return out

    def group_limits(self, led: Any, accepted: dict[str, dict[str, Any]],
                     in_fault: Any) -> dict[str, Any]:
        """The most handlers of one group (and shard: the limit is per shard) that ran at
        once, from the ledger; moments over the limit outside every fault window count."""
        marks: dict[tuple[str, int], list[tuple[float, int]]] = collections.defaultdict(list)
        for x, s in led.starts_by_x.items():
            spec = accepted.get(s["job"])
            if spec is None:
                continue
            end = led.ends.get(x)
            home = shard_of(s["job"], SHARDS)
            if self.o.reshard and home != shard_of(s["job"], HIGH):
                continue  # its shard depends on the layout it was written under: not counted
            key = (spec["group"], home)  # (a lower bound of each moment's count: sound)
            marks[key] += [(s["t"], 1), ((end or s)["t"] + (0 if end else 5.0), -1)]
        worst, over = 0, 0
        for points in marks.values():
            n = 0
            for t, d in sorted(points, key=lambda p: (p[0], p[1])):
                n += d
                worst = max(worst, n)
                if n > GROUP_LIMIT and not in_fault(t - 0.5, t + 0.5):
                    over += 1
        return {"limit": GROUP_LIMIT, "most_at_once": worst, "over_limit_outside_faults": over}


def kinds_of(o: ClusterOptions) -> tuple[str, ...]:
    return RESHARD_MENU if o.reshard else CLUSTER_FAULTS


def _ts(when: dt.datetime | None, default: float) -> float:
    return when.timestamp() if when is not None else default


def run_cluster(opts: ClusterOptions) -> dict[str, Any]:
    return ClusterChaos(opts).run()


def render_cluster(rep: dict[str, Any]) -> str:
    lines = [f"streamq cluster chaos run: seed {rep['seed']}, {rep['minutes']:g} min of faults,"
             f" wall time {rep['timing'].get('total_s', 0):.0f} s"
             f" (drain {rep['timing'].get('drain_s', 0):.0f} s)", "",
             "| kind | accepted | completed | failed | executions |", "|---|---:|---:|---:|---:|"]
    for kind, row in rep["jobs"].items():
        lines.append(f"| {kind} | {row.get('accepted', 0):,} | {row.get('completed', 0):,} |"
                     f" {row.get('failed', 0):,} | {row.get('executions', 0):,} |")
    g = rep["groups"]
    lines += ["", "faults: " + ", ".join(f"{k} {n}" for k, n in rep["faults"].items()),
              f"- **lost = {rep['lost']}** of {rep['accepted']:,} accepted",
              f"- dead letters {rep['dead_letters']['total']:,}: " + (", ".join(
                  f"{w} {n:,}" for w, n in sorted(rep["dead_letters"]["by_reason"].items()))
                  or "none"),
              f"- groups: limit {g['limit']} per shard, at most {g['most_at_once']} ran at once,"
              f" {g['over_limit_outside_faults']} moments over it outside a fault",
              f"- ran again (not after a Retry; across a fault): {rep.get('ran_twice') or 'none'}",
              f"- producer errors (sent again): {rep['producer_errors'] or 'none'}",
              f"- checks: {'all passed' if rep.get('ok') else 'FAILED'}"]
    if "reshard" in rep:
        lines[-1:-1] = render_reshard(rep["reshard"])
    lines += [f"  - {f}" for f in rep["failures"]]
    return "\n".join(lines)
