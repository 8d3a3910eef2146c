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

The code: this module is the entry point (``run``, ``render``, ``Options``, ``FAULTS``,
``REPORT_KINDS``) and holds the phases of a run (``Chaos``: set up, fault phase, quiesce,
tear down). ``Chaos`` is made of mixins over one run's state, ``ChaosBase``:

- ``common.py``: the job and fault kinds, ``Options``, ``transient``, ``ChaosBase``;
- ``children.py``: starting, watching, replacing and stopping the processes;
- ``faults.py``: injecting and undoing each fault, and the probe thread;
- ``verify.py``: checking the job records, ledger, events and keyspace into the report.

The load is ``producer.py``, the summary table ``report.py``.
"""

from __future__ import annotations

import collections
import contextlib
import json
import shutil
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.exceptions import ResponseError

from streamq import Queue
from streamq._core.keys import GROUP
from streamq._core.model import record_state
from streamq._core.retry import TRANSIENT

from . import liveness
from .common import FAULT_WEIGHTS, FAULTS, MAX_ATTEMPTS, REPORT_KINDS, ChaosServer, Options
from .faults import FaultInjection
from .producer import Producer
from .report import render
from .verify import Verification, read_ledger

__all__ = ["FAULTS", "REPORT_KINDS", "Chaos", "Options", "render", "run"]


class Chaos(FaultInjection, Verification):
    """One run: set up, the fault phase, quiesce, check, tear down (the phases)."""

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
            slots = [f"w{k + 1}" for k in range(self.o.workers)]
            slots += [f"e{k + 1}" for k in range(self.o.embedded)]  # embedded.py
            for slot in slots:
                self.wslots[slot] = None
                self.start_worker(slot)
            for k in range(self.o.schedulers):
                self.sslots[f"s{k + 1}"] = None
                self.start_scheduler(f"s{k + 1}")
            direct = self.direct
            self.wait_for(lambda: direct.zcard(self.keys.workers) >= len(slots), 60,
                          "the workers are up")
            self.timing["setup_s"] = time.time() - t_start
            self.say(f"seed {self.o.seed}, queue {self.queue}, dir {self.dir}, redis port"
                     f" {self.server.port}, proxy {self.proxy_url}")

            probe = threading.Thread(target=self.probe, name="chaos-probe", daemon=True)
            probe.start()
            self.monitor = liveness.Monitor(self.server.port, self.keys)
            self.monitor.start()
            producer = Producer(self.proxy_url, self.queue, self.qcfg, self.o.rate, self.o.seed,
                                self.o.mix)
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
        menu = list(self.o.faults)
        weights = [FAULT_WEIGHTS[FAULTS.index(f)] for f in menu]
        first = list(menu)  # every kind once, in a seeded order, then at random
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
                    kind = self.rng.choices(menu, weights)[0]
                    if not self.inject(kind) and "cut" in menu:
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
        self.wait_for(lambda: self.graceful_done(), 60, "graceful stops and reloads ended")
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

    def graceful_done(self) -> bool:
        self.run_due(everything=True)  # replacements waiting for a start
        self.watch_children()
        return not self.draining and not self.reloading

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


def run(opts: Options) -> dict[str, Any]:
    rep = Chaos(opts).run()
    if opts.out is not None:
        opts.out.parent.mkdir(parents=True, exist_ok=True)
        opts.out.write_text(json.dumps(rep, indent=2, default=str) + "\n")
    return rep
