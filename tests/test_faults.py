"""Fault injection across processes: the invariants of DESIGN.md hold when workers, promoters
and the Redis server itself are killed, frozen, stopped or disconnected.

Workers run as separate processes (``tests/procs/worker_proc.py``) that record every handler
execution in a ledger file outside the Redis under test, so executions per job can be counted.
Every wait polls for a condition with a deadline (``wait_until``); nothing sleeps and hopes.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from helpers import field, record

from streamq import JobInfo, Keys, Queue
from streamq._core.keys import GROUP
from streamq._core.server import RedisServer

T = TypeVar("T")
PROCS = Path(__file__).parent / "procs"
RedisDown = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


# --------------------------------------------------------------------------- helpers


class Procs:
    """Child processes of one test; all of them are killed (by pid) at teardown."""

    def __init__(self, tmp_path: Path) -> None:
        self.dir = tmp_path
        self.ledger = tmp_path / "ledger.jsonl"
        self.ledger.touch()
        self.children: dict[str, subprocess.Popen[bytes]] = {}
        self.logs: dict[str, Path] = {}

    def worker(self, url: str, queue: str, consumer: str, **config: Any) -> subprocess.Popen[bytes]:
        log = self.dir / f"{consumer}.log"
        with open(log, "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, str(PROCS / "worker_proc.py"), url, queue, str(self.ledger),
                 consumer, json.dumps(config)],
                stdout=subprocess.DEVNULL, stderr=err)
        self.children[consumer] = proc
        self.logs[consumer] = log
        return proc

    def promoter(self, url: str, queue: str, name: str, ready: Path, go: Path,
                 timeout_s: float) -> subprocess.Popen[bytes]:
        log = self.dir / f"{name}.log"
        with open(log, "ab") as err:
            proc = subprocess.Popen(
                [sys.executable, str(PROCS / "promote_proc.py"), url, queue, str(ready),
                 str(go), str(timeout_s)],
                stdout=subprocess.PIPE, stderr=err)
        self.children[name] = proc
        self.logs[name] = log
        return proc

    def signal(self, name: str, sig: signal.Signals) -> None:
        os.kill(self.children[name].pid, sig)

    def sigkill(self, name: str) -> None:
        proc = self.children[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)

    def stop(self, names: list[str], timeout_s: float) -> None:
        """SIGTERM the workers, then wait for each to exit 0 (on a hang: dump its stacks, fail)."""
        for name in names:
            self.signal(name, signal.SIGTERM)
        end = time.monotonic() + timeout_s
        for name in names:
            proc = self.children[name]
            try:
                rc = proc.wait(max(0.1, end - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGUSR1)  # worker_proc dumps threads and tasks
                time.sleep(1.0)
                pytest.fail(f"{name} did not stop within {timeout_s:g}s of SIGTERM\n"
                            f"{self.diagnostics(200)}", pytrace=False)
            assert rc == 0, f"{name} exited with {rc}\n{self.diagnostics()}"

    def diagnostics(self, lines: int = 25) -> str:
        out = []
        for name, path in self.logs.items():
            proc = self.children[name]
            text = path.read_text(errors="replace") if path.exists() else ""
            tail = "\n".join(text.splitlines()[-lines:])
            out.append(f"--- {name} (pid {proc.pid}, returncode {proc.poll()}):\n{tail}")
        return "\n".join(out)

    def close(self) -> None:
        for proc in self.children.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)  # a stopped child would not die at once
                    proc.kill()
                except ProcessLookupError:
                    pass
                proc.wait(10)
            if proc.stdout is not None:
                proc.stdout.close()


def wait_until(pred: Callable[[], T], timeout_s: float, what: str,
               diag: Callable[[], str] | None = None, interval_s: float = 0.02) -> T:
    """Poll ``pred`` until it returns something truthy; fail the test after ``timeout_s``.

    A Redis connection error counts as "not yet" (servers under test go down on purpose).
    """
    end = time.monotonic() + timeout_s
    last_exc: BaseException | None = None
    while True:
        try:
            value = pred()
            if value:
                return value
        except RedisDown as exc:
            last_exc = exc
        if time.monotonic() > end:
            detail = f" (last error: {last_exc!r})" if last_exc else ""
            extra = "\n" + diag() if diag is not None else ""
            pytest.fail(f"timed out after {timeout_s:g}s waiting until {what}{detail}{extra}",
                        pytrace=False)
        time.sleep(interval_s)


def read_ledger(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def executions(path: Path, ev: str = "start") -> collections.Counter[str]:
    return collections.Counter(rec["job"] for rec in read_ledger(path) if rec["ev"] == ev)


def stat(client: redis.Redis, keys: Keys, name: str) -> int:
    v: Any = client.hget(keys.stats, name)
    return int(v or 0)


def registered(client: redis.Redis, keys: Keys, consumer: str) -> bool:
    """The worker heartbeat (written by its control loop once it has started)."""
    return client.zscore(keys.workers, consumer) is not None


def states(client: redis.Redis, keys: Keys, ids: list[str]) -> list[str | None]:
    vals = [field(client, keys.job(i), "state") for i in ids]
    return [v.decode() if v is not None else None for v in vals]


def all_completed(client: redis.Redis, keys: Keys, ids: list[str]) -> bool:
    if stat(client, keys, "completed") < len(ids):
        return False
    return all(s == "completed" for s in states(client, keys, ids))


def completed_at_least(client: redis.Redis, keys: Keys, k: int) -> Callable[[], bool]:
    return lambda: stat(client, keys, "completed") >= k


def wait_completed(q: Queue, job_id: str, timeout_s: float, what: str,
                   diag: Callable[[], str] | None = None) -> JobInfo:
    def done() -> JobInfo | None:
        info = q.get(job_id)
        return info if info is not None and info.state == "completed" else None

    info = wait_until(done, timeout_s, what, diag)
    assert info is not None
    return info


def consumers(client: redis.Redis, keys: Keys) -> dict[str, dict[str, Any]]:
    raw: Any = client.xinfo_consumers(keys.stream, GROUP)
    out: dict[str, dict[str, Any]] = {}
    for c in raw:
        name = c["name"].decode() if isinstance(c["name"], bytes) else str(c["name"])
        out[name] = c
    return out


def pel_size(client: redis.Redis, keys: Keys) -> int:
    info: Any = client.xpending(keys.stream, GROUP)
    return int(info["pending"])


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    yield p
    p.close()


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A private server for a test that disconnects every client of the server."""
    server = RedisServer().start()
    yield server
    server.close()


FAST = {"heartbeat_interval_s": 0.5, "promote_interval_s": 0.2}
"""Worker settings every test uses: prompt heartbeats (readiness) and promotion."""


# --------------------------------------------------------------------------- 1. SIGKILL mid-job


def test_sigkill_mid_job_is_reclaimed_and_finished(url: str, qname: str, r: redis.Redis,
                                                  procs: Procs) -> None:
    keys = Keys(qname)
    q = Queue.from_url(url, qname)
    procs.worker(url, qname, "w-a", visibility_timeout_s=30, **FAST)
    wait_until(lambda: registered(r, keys, "w-a"), 15, "worker A is up", procs.diagnostics)
    q.enqueue("job", {"sleep_first": 30}, job_id="k1")
    wait_until(lambda: executions(procs.ledger)["k1"] == 1, 10, "worker A started k1",
               procs.diagnostics)

    procs.sigkill("w-a")
    procs.worker(url, qname, "w-b", visibility_timeout_s=1, reclaim_interval_s=0.2, **FAST)
    info = wait_completed(q, "k1", 20, "worker B finished k1", procs.diagnostics)

    assert info.attempts == 2
    assert info.result["consumer"] == "w-b"
    ledger = [rec for rec in read_ledger(procs.ledger) if rec["job"] == "k1"]
    assert [(rec["ev"], rec["consumer"], rec["attempt"]) for rec in ledger] == [
        ("start", "w-a", 1), ("start", "w-b", 2), ("end", "w-b", 2)]
    assert stat(r, keys, "reclaimed") == 1
    assert r.xlen(keys.stream) == 0 and pel_size(r, keys) == 0
    q.close()


# --------------------------------------------------------------------------- 2. stale completion


def test_stale_worker_completion_is_fenced_out(url: str, qname: str, r: redis.Redis,
                                               procs: Procs) -> None:
    keys = Keys(qname)
    q = Queue.from_url(url, qname)
    cfg = {"visibility_timeout_s": 1.0, "reclaim_interval_s": 0.2, **FAST}
    procs.worker(url, qname, "w-a", **cfg)
    wait_until(lambda: registered(r, keys, "w-a"), 15, "worker A is up", procs.diagnostics)
    q.enqueue("job", {"sleep_first": 2.0}, job_id="k2")
    wait_until(lambda: executions(procs.ledger)["k2"] == 1, 10, "worker A started k2",
               procs.diagnostics)
    procs.signal("w-a", signal.SIGSTOP)  # freezes the handler and the lease thread alike

    procs.worker(url, qname, "w-b", **cfg)
    info = wait_completed(q, "k2", 20, "worker B finished k2", procs.diagnostics)
    assert info.result["consumer"] == "w-b"
    assert info.attempts == 2
    record_after_b: Any = r.hgetall(keys.job("k2"))
    assert stat(r, keys, "lease_lost") == 0

    procs.signal("w-a", signal.SIGCONT)
    wait_until(lambda: stat(r, keys, "lease_lost") == 1, 15,
               "worker A's stale completion was counted as lease_lost", procs.diagnostics)
    # (worker A's handler either returned or was stopped when its renewal found the lease
    # lost, whichever came first after the thaw: either way its outcome is fenced out)

    assert r.hgetall(keys.job("k2")) == record_after_b, "the stale worker wrote the record"
    info2 = q.get("k2")
    assert info2 is not None and info2.result["consumer"] == "w-b"
    assert stat(r, keys, "lease_lost") == 1
    assert stat(r, keys, "completed") == 1
    events: Any = r.xrange(keys.events)
    lost = [f for _, f in events if f[b"ev"] == b"lease_lost"]
    assert len(lost) == 1 and lost[0][b"job"] == b"k2"
    assert procs.children["w-a"].poll() is None, "the stale worker should keep running"
    q.close()


# --------------------------------------------------------------------------- 3. Redis restart


@pytest.mark.slow
def test_redis_restart_under_load_loses_nothing(aof_server: RedisServer, qname: str,
                                                procs: Procs) -> None:
    n = 3000
    url = aof_server.url
    keys = Keys(qname)
    r = redis.Redis.from_url(url, protocol=2)
    q = Queue.from_url(url, qname)
    ids = [f"r{i:05d}" for i in range(n)]
    q.enqueue_many([{"type": "job", "payload": {"sleep": 0.01}, "job_id": i} for i in ids])
    cfg = {"concurrency": 16, "visibility_timeout_s": 10, **FAST}
    for name in ("w-a", "w-b"):
        procs.worker(url, qname, name, **cfg)

    ledger_at_kill = []
    for frac in (5, 2):  # two outages: at a fifth and at half of the backlog
        wait_until(completed_at_least(r, keys, n // frac), 30, f"1/{frac} of the jobs is done",
                   procs.diagnostics)
        aof_server.kill()
        ledger_at_kill.append(len(read_ledger(procs.ledger)))
        time.sleep(0.5)  # a deliberate outage: the workers meet refused connections meanwhile
        port = aof_server.port
        aof_server.restart()
        assert aof_server.port == port, "the restarted server must keep its port"

    wait_until(lambda: all_completed(r, keys, ids), 90, "every job completed after the restart",
               procs.diagnostics)
    ledger = read_ledger(procs.ledger)
    done_at_kill = sum(1 for x in ledger[:ledger_at_kill[-1]] if x["ev"] == "end")
    assert done_at_kill < n, "Redis was killed after the queue had drained; nothing was tested"

    starts = executions(procs.ledger)
    ends = executions(procs.ledger, "end")
    assert set(starts) == set(ids) and set(ends) == set(ids)
    attempts = {i: int(field(r, keys.job(i), "attempts") or 0) for i in ids}
    # at-least-once: every execution was a counted attempt (no run outside a lease)
    over = {i: (starts[i], attempts[i]) for i in ids if starts[i] > attempts[i]}
    assert not over, f"executions beyond counted attempts: {over}"
    dups = {i: c for i, c in starts.items() if c > 1}
    inflated = sum(1 for i in ids if attempts[i] > starts[i])  # a start whose reply was lost
    print(f"\n[restart] ledger lines at kills {ledger_at_kill}; duplicate executions:"
          f" {sum(dups.values()) - len(dups)} over {len(dups)} jobs; reclaimed"
          f" {stat(r, keys, 'reclaimed')}, lease_lost {stat(r, keys, 'lease_lost')};"
          f" jobs with more counted attempts than runs: {inflated}")
    assert stat(r, keys, "completed") == n  # each job completed once (finish is fenced)
    assert r.xlen(keys.stream) == 0 and pel_size(r, keys) == 0  # invariant 5: no ghosts

    for name in ("w-a", "w-b"):  # the workers survived on their own and stop cleanly
        assert procs.children[name].poll() is None, f"{name} died:\n{procs.diagnostics()}"
    procs.stop(["w-a", "w-b"], 20)
    q.close()
    r.close()


# --------------------------------------------------------------------------- 4. promotion race


@pytest.mark.slow
def test_two_promoters_promote_each_job_exactly_once(url: str, qname: str, r: redis.Redis,
                                                     procs: Procs, tmp_path: Path) -> None:
    n = 2000
    keys = Keys(qname)
    q = Queue.from_url(url, qname)
    go = tmp_path / "go"
    readies = [tmp_path / f"ready-{i}" for i in range(2)]
    for k, ready in enumerate(readies):
        procs.promoter(url, qname, f"p{k}", ready, go, timeout_s=40)
    wait_until(lambda: all(p.exists() for p in readies), 15, "both promoters are connected",
               procs.diagnostics)

    ids = [f"p{i:05d}" for i in range(n)]
    res = q.enqueue_many([{"type": "job", "payload": {}, "job_id": i, "delay": 1.0}
                          for i in ids])
    assert {x.status for x in res} == {"scheduled"}
    go.touch()  # both spin on run_once from now on, and race once the jobs come due
    outs = []
    for name in ("p0", "p1"):
        proc = procs.children[name]
        try:
            stdout, _ = proc.communicate(timeout=40)
        except subprocess.TimeoutExpired:
            pytest.fail(f"promoter {name} did not finish\n{procs.diagnostics()}")
        assert proc.returncode == 0, procs.diagnostics()
        outs.append(json.loads(stdout))
    print(f"\n[promote] promoter results: {outs}")

    assert sum(o["moved"] for o in outs) == n
    assert r.zcard(keys.delayed) == 0
    entries: Any = r.xrange(keys.stream)
    in_stream = collections.Counter(f[b"id"].decode() for _, f in entries)
    assert len(entries) == n and set(in_stream) == set(ids)
    assert max(in_stream.values()) == 1, "a job was promoted into the stream twice"
    records = {i: record(r, keys.job(i)) for i in ids}
    for eid, f in entries:
        rec = records[f[b"id"].decode()]
        state, entry = rec.get(b"state"), rec.get(b"entry")
        assert state == b"queued" and entry == eid
    events: Any = r.xrange(keys.events)
    queued = collections.Counter(f[b"job"].decode() for _, f in events if f[b"ev"] == b"queued")
    assert set(queued) == set(ids) and max(queued.values()) == 1

    procs.worker(url, qname, "w-drain", concurrency=32, promote=False, **FAST)
    wait_until(lambda: all_completed(r, keys, ids), 30, "every promoted job completed",
               procs.diagnostics)
    starts = executions(procs.ledger)
    assert set(starts) == set(ids) and max(starts.values()) == 1
    assert stat(r, keys, "started") == n and stat(r, keys, "completed") == n
    q.close()


@pytest.mark.slow
def test_two_promoting_workers_run_each_delayed_job_once(url: str, qname: str, r: redis.Redis,
                                                         procs: Procs) -> None:
    n = 2000
    keys = Keys(qname)
    q = Queue.from_url(url, qname)
    for name in ("w-a", "w-b"):
        procs.worker(url, qname, name, concurrency=32, **FAST)
    wait_until(lambda: registered(r, keys, "w-a") and registered(r, keys, "w-b"), 15,
               "both workers are up", procs.diagnostics)
    ids = [f"d{i:05d}" for i in range(n)]
    q.enqueue_many([{"type": "job", "payload": {}, "job_id": i, "delay": 1.0} for i in ids])

    wait_until(lambda: all_completed(r, keys, ids), 40, "every delayed job completed",
               procs.diagnostics)
    starts = executions(procs.ledger)
    assert set(starts) == set(ids) and max(starts.values()) == 1
    by_worker = collections.Counter(x["consumer"] for x in read_ledger(procs.ledger)
                                    if x["ev"] == "start")
    events: Any = r.xrange(keys.events)
    queued = collections.Counter(f[b"job"].decode() for _, f in events if f[b"ev"] == b"queued")
    assert set(queued) == set(ids) and max(queued.values()) == 1, "a job was promoted twice"
    assert stat(r, keys, "started") == n and stat(r, keys, "completed") == n
    assert r.xlen(keys.stream) == 0 and pel_size(r, keys) == 0 and r.zcard(keys.delayed) == 0
    print(f"\n[promote] executions per worker: {dict(by_worker)}")
    q.close()


# --------------------------------------------------------------------------- 5. graceful stop


@pytest.mark.slow
def test_sigterm_finishes_short_jobs_and_hands_back_long_ones(url: str, qname: str,
                                                              r: redis.Redis,
                                                              procs: Procs) -> None:
    keys = Keys(qname)
    q = Queue.from_url(url, qname)
    cfg = {"concurrency": 4, "visibility_timeout_s": 60, "grace_period_s": 3, **FAST}
    procs.worker(url, qname, "w-a", **cfg)
    wait_until(lambda: registered(r, keys, "w-a"), 15, "worker A is up", procs.diagnostics)
    short = ["s1", "s2", "s3"]
    q.enqueue_many([{"type": "job", "payload": {"sleep": 1.0}, "job_id": i} for i in short])
    q.enqueue("job", {"sleep_first": 30}, job_id="long")
    wait_until(lambda: len(executions(procs.ledger)) == 4, 10, "all four jobs started on A",
               procs.diagnostics)

    t0 = time.monotonic()
    procs.signal("w-a", signal.SIGTERM)
    try:
        rc = procs.children["w-a"].wait(3 + 10)
    except subprocess.TimeoutExpired:
        pytest.fail(f"worker A did not stop after SIGTERM\n{procs.diagnostics()}")
    assert rc == 0, procs.diagnostics()

    for i in short:  # shorter than the grace period: finished by A
        info = q.get(i)
        assert info is not None and info.state == "completed", (i, info)
        assert info.result["consumer"] == "w-a" and info.attempts == 1
    long = q.get("long")  # longer than the grace period: handed back at once, attempt refunded
    assert long is not None
    assert (long.state, long.attempts, long.owner) == ("queued", 0, None)
    assert stat(r, keys, "released") == 1
    assert r.xlen(keys.stream) == 1 and pel_size(r, keys) == 0

    procs.worker(url, qname, "w-b", **cfg)
    info = wait_completed(q, "long", 10 - (time.monotonic() - t0),
                          "worker B finished the handed-back job", procs.diagnostics)
    assert time.monotonic() - t0 < 10  # far below the 60 s visibility timeout
    assert info.result["consumer"] == "w-b" and info.attempts == 1
    ledger = [(x["ev"], x["consumer"]) for x in read_ledger(procs.ledger) if x["job"] == "long"]
    assert ledger == [("start", "w-a"), ("start", "w-b"), ("end", "w-b")]
    q.close()


# --------------------------------------------------------------------------- 6. dropped links


@pytest.mark.slow
def test_worker_survives_dropped_connections(own_server: RedisServer, qname: str,
                                             procs: Procs) -> None:
    n = 1500
    url = own_server.url
    keys = Keys(qname)
    r = redis.Redis.from_url(url, protocol=2)
    q = Queue.from_url(url, qname)
    ids = [f"c{i:05d}" for i in range(n)]
    q.enqueue_many([{"type": "job", "payload": {"sleep": 0.02}, "job_id": i} for i in ids])
    procs.worker(url, qname, "w-a", concurrency=8, visibility_timeout_s=5, **FAST)

    killed = []
    for step in range(1, 13):  # drop every connection at each sixteenth of the backlog
        wait_until(completed_at_least(r, keys, step * n // 16), 30,
                   f"{step}/16 of the jobs completed", procs.diagnostics)
        # CLIENT KILL TYPE normal SKIPME yes: every client but this one
        count: Any = r.client_kill_filter(_type="normal", skipme=True)
        killed.append(int(count))
    print(f"\n[disconnect] connections killed per round: {killed}")
    assert all(k >= 1 for k in killed)
    assert stat(r, keys, "completed") < n, "the queue drained before the last disconnect"

    wait_until(lambda: all_completed(r, keys, ids), 60, "every job completed",
               procs.diagnostics)
    starts = executions(procs.ledger)
    dups = {i: c for i, c in starts.items() if c > 1}
    print(f"[disconnect] duplicate executions: {sum(dups.values()) - len(dups)}; lease_lost"
          f" {stat(r, keys, 'lease_lost')}, reclaimed {stat(r, keys, 'reclaimed')}")
    assert set(starts) == set(ids)
    assert stat(r, keys, "completed") == n
    assert r.xlen(keys.stream) == 0 and pel_size(r, keys) == 0
    assert procs.children["w-a"].poll() is None, procs.diagnostics()
    procs.stop(["w-a"], 20)
    q.close()
    r.close()


# --------------------------------------------------------------------------- 7. consumer hygiene


@pytest.mark.slow
def test_dead_consumers_are_pruned_only_with_empty_pel(url: str, qname: str, r: redis.Redis,
                                                       procs: Procs) -> None:
    keys = Keys(qname)
    q = Queue.from_url(url, qname)
    cfg = {"visibility_timeout_s": 60, **FAST}  # nobody reclaims w-busy's entry in this test

    def start_worker(name: str, **extra: Any) -> None:
        procs.worker(url, qname, name, **cfg, **extra)
        wait_until(lambda: registered(r, keys, name), 15, f"worker {name} is up",
                   procs.diagnostics)

    start_worker("w-idle")  # will die with an empty PEL
    q.enqueue("job", {}, job_id="h1")
    wait_completed(q, "h1", 10, "w-idle completed h1", procs.diagnostics)
    procs.sigkill("w-idle")
    start_worker("w-busy")  # will die holding a job
    q.enqueue("job", {"sleep_first": 60}, job_id="h2")
    wait_until(lambda: executions(procs.ledger)["h2"] == 1, 10, "w-busy started h2",
               procs.diagnostics)
    procs.sigkill("w-busy")
    cs = consumers(r, keys)
    assert int(cs["w-idle"]["pending"]) == 0 and int(cs["w-busy"]["pending"]) == 1

    start_worker("w-pruner", consumer_dead_after_s=1.0, prune_interval_s=0.3)
    wait_until(lambda: "w-idle" not in consumers(r, keys), 15,
               "the pruner removed the dead consumer with an empty PEL", procs.diagnostics)
    assert r.zscore(keys.workers, "w-idle") is None

    # a consumer that dies while the pruner runs goes on a later pass; w-busy survives them all
    start_worker("w-late")
    procs.sigkill("w-late")
    wait_until(lambda: "w-late" not in consumers(r, keys), 15,
               "a later pruning pass removed the consumer that died after the pruner started",
               procs.diagnostics)

    cs = consumers(r, keys)
    assert set(cs) == {"w-busy", "w-pruner"}
    assert int(cs["w-busy"]["pending"]) == 1
    pending: Any = r.xpending_range(keys.stream, GROUP, "-", "+", 10)
    assert [p["consumer"] for p in pending] == [b"w-busy"]
    h2 = q.get("h2")
    assert h2 is not None and (h2.state, h2.owner) == ("active", "w-busy")
    assert procs.children["w-pruner"].poll() is None
    q.close()
