"""The process pool (#30): isolated handlers in child processes, hard timeouts, crash
isolation, recycling, outcomes as in-process, graceful stop without orphans. Handlers live in
tests/pool_jobs.py (the children import it by module path)."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pool_jobs
import pytest
import redis
from helpers import eventually, fast, finished, state, wait_until

from streamq import Job, Queue, Registry, StartupFailed, Worker
from streamq.admin import Admin

START_S = 60.0  # children import streamq and the registry: slow on a loaded machine


def children_of_this_process() -> set[int]:
    """Child pids of this process, live or zombie (all threads' children)."""
    out: set[int] = set()
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        try:
            with open(f"/proc/{os.getpid()}/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
        except FileNotFoundError:  # the thread ended meanwhile
            continue
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def pool_worker(url: str, qname: str, **cfg: Any) -> Worker:
    base: dict[str, Any] = {"pool": "process", "pool_size": 1, "concurrency": 1}
    return Worker(url, [qname], pool_jobs.registry, fast(**{**base, **cfg}))


async def done(q: Queue, job_id: str, timeout_s: float = START_S) -> Any:
    await eventually(lambda: finished(q, job_id), timeout_s, f"job {job_id} to finish")
    return q.get(job_id)


async def test_payload_and_result_cross_in_the_serde(url: str, q: Queue, qname: str) -> None:
    """Values JSON has no type for cross both ways in the queue's serde; the child's startup
    hook filled its own job.ctx; the job's fields arrive as in-process."""
    payload = {"when": dt.datetime(2025, 5, 6, 7, 8, 9, tzinfo=dt.UTC), "n": [1, 2.5, None],
               "amount": decimal.Decimal("9.99"), "text": "héllo"}
    async with pool_worker(url, qname):
        jid = q.enqueue("echo", payload).job_id
        info = await done(q, jid)
    assert info.state == "completed"
    res = info.result
    assert res["payload"] == payload
    assert res["when"] == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert res["amount"] == decimal.Decimal("1.25") and res["uid"] == uuid.UUID(int=7)
    assert res["pid"] != os.getpid()
    assert res["ctx_pid"] == res["pid"]  # the startup hook ran in that child
    assert (res["id"], res["queue"], res["attempt"]) == (jid, qname, 1)


async def test_isolation_per_handler(url: str, q: Queue, qname: str) -> None:
    """A thread-pool worker runs only isolation='process' handlers in children (an async one
    here); the others stay in-process."""
    async with Worker(url, [qname], pool_jobs.registry, fast(concurrency=2, pool_size=1)) as w:
        assert w.pool is not None and len(w.pool.pids()) == 1
        isolated = q.enqueue("aecho", {"x": 1}).job_id
        local = q.enqueue("pid", None).job_id
        a, b = await done(q, isolated), await done(q, local)
    assert a.result["payload"] == {"x": 1} and a.result["pid"] != os.getpid()
    assert b.result == os.getpid()


async def test_sigkill_mid_job_retries_that_job(url: str, q: Queue, qname: str,
                                                r: redis.Redis) -> None:
    """A child killed mid-job fails only that attempt with the exit cause; the job runs
    again (attempt 2) on a fresh child and the worker goes on."""
    pids, key = f"{qname}:pids", f"{qname}:go"
    async with pool_worker(url, qname) as w:
        jid = q.enqueue("hold", {"url": url, "pids": pids, "key": key}).job_id
        first = int(await eventually(lambda: r.lpop(pids), START_S, "the job to start"))
        os.kill(first, signal.SIGKILL)
        info = await done(q, jid)
        assert info.state == "completed" and info.result == 2 and info.attempts == 2
        assert [e["type"] for e in info.errors] == ["ProcessDied"]
        # max_attempts=1: the dead letter names the exit cause
        dead = q.enqueue("wait", {"url": url, "pids": pids, "key": key}).job_id
        second = int(await eventually(lambda: r.lpop(pids), START_S, "the job to start"))
        assert second != first
        os.kill(second, signal.SIGKILL)
        info = await done(q, dead)
        assert info.state == "failed"
        assert info.error is not None and info.error["type"] == "ProcessDied"
        assert info.error["message"] == "worker process died: signal 9 (SIGKILL)"
        after = q.enqueue("pid", None).job_id
        info = await done(q, after)
        assert info.state == "completed" and info.result not in (first, second)
        assert w.pool is not None and w.pool.died == 2
        assert w.pool.metrics.counts["died"] == 2 and w.pool.metrics.busy == 0
    assert not alive(first) and not alive(second)


async def test_endless_loop_is_killed_at_its_timeout(url: str, q: Queue, qname: str,
                                                     r: redis.Redis) -> None:
    """A sync handler that never returns (timeout=1) is killed: the attempt fails with a
    TimeoutError, and its slot runs the next job in a fresh child."""
    pids = f"{qname}:pids"
    async with pool_worker(url, qname) as w:
        jid = q.enqueue("spin", {"url": url, "pids": pids}).job_id
        nxt = q.enqueue("pid", None).job_id
        info = await done(q, jid)
        assert info.state == "failed"
        assert info.error is not None and info.error["type"] == "TimeoutError"
        assert info.error["message"] == ("handler timed out after 1 s; its process was"
                                         " killed")
        spun = int(r.lindex(pids, 0) or b"0")
        assert spun
        info = await done(q, nxt)
        assert info.state == "completed" and info.result != spun  # pool_size 1: the same slot
        assert w.pool is not None and w.pool.killed == 1
        assert w.pool.metrics.counts["timed_out"] == 1
    assert not alive(spun)


async def test_leaking_handler_is_recycled_at_the_memory_limit(url: str, q: Queue,
                                                               qname: str) -> None:
    """Each job keeps 40 MiB more; a child at 110 MiB or more after a job is replaced before
    its next one (a child starts at about 45 MiB: it runs one job, then is retired)."""
    got: list[int] = []
    async with pool_worker(url, qname, max_memory_per_child_mb=110) as w:
        for _ in range(4):
            got.append((await done(q, q.enqueue("leak", None).job_id)).result)
        assert w.pool is not None and w.pool.recycled >= 1
        assert w.pool.metrics.counts["recycled_max_memory"] == w.pool.recycled
        assert w.pool.metrics.counts["recycled_max_jobs"] == 0
    assert got[0] == got[1]  # below the limit after its first job
    assert len(set(got)) >= 2  # replaced once over it


async def test_max_jobs_per_child_recycles(url: str, q: Queue, qname: str) -> None:
    got: list[int] = []
    async with pool_worker(url, qname, max_jobs_per_child=2) as w:
        for _ in range(5):
            got.append((await done(q, q.enqueue("pid", None).job_id)).result)
        assert w.pool is not None and w.pool.recycled == 2
        assert w.pool.metrics.counts["recycled_max_jobs"] == 2
    assert got[0] == got[1] != got[2] == got[3] != got[4]
    assert not any(alive(p) for p in set(got))


async def test_outcomes_settle_as_in_process(url: str, q: Queue, qname: str,
                                             r: redis.Redis) -> None:
    """Fail, Retry, RateLimited, fail_on/retry_on, os._exit, progress and log lines."""
    async with pool_worker(url, qname, pool_size=2, concurrency=2):
        ids = {
            "fail": q.enqueue("fail", None).job_id,
            "retry": q.enqueue("retry", None).job_id,
            "limited": q.enqueue("limited", {"url": url, "key": f"{qname}:rl"}).job_id,
            "permanent": q.enqueue("rules", {"raise": "permanent"}).job_id,
            "flaky": q.enqueue("rules", {"raise": "flaky"}).job_id,
            "exit": q.enqueue("exit", None).job_id,
            "progress": q.enqueue("progress", None).job_id,
            "none": q.enqueue("none", None).job_id,
        }
        got = {name: await done(q, jid) for name, jid in ids.items()}
    assert (got["fail"].state, got["fail"].reason) == ("failed", "no such address")
    assert got["fail"].attempts == 1 and got["fail"].error["type"] == "Fail"
    assert (got["retry"].state, got["retry"].result) == ("completed", 2)
    # rate limited once (the key), back without counting: attempt 1 again
    assert r.get(f"{qname}:rl") == b"1"
    assert (got["limited"].state, got["limited"].result) == ("completed", 1)
    assert got["permanent"].state == "failed" and got["permanent"].attempts == 1
    assert got["permanent"].reason == "Permanent is in fail_on"
    assert got["permanent"].error["type"] == "Permanent"
    assert "gone for good" in got["permanent"].error["traceback"]  # the child's traceback
    assert (got["flaky"].state, got["flaky"].result) == ("completed", 2)
    assert (got["exit"].state, got["exit"].result) == ("completed", 2)
    assert [e["type"] for e in got["exit"].errors] == ["ProcessDied"]
    assert got["progress"].result == "done" and got["progress"].progress == {"done": 50}
    assert [line["m"] for line in got["progress"].logs] == ["half way"]
    assert got["none"].state == "completed" and got["none"].result is None


async def test_cancel_reaches_the_child(url: str, q: Queue, qname: str,
                                        r: redis.Redis) -> None:
    """A cancel of a running isolated job turns its job.cancel_requested True in the child;
    the job ends cancelled and the child stays (it returned)."""
    pids = f"{qname}:pids"
    async with pool_worker(url, qname) as w:
        jid = q.enqueue("cancellable", {"url": url, "pids": pids}).job_id
        pid = int(await eventually(lambda: r.lpop(pids), START_S, "the job to start"))
        q.cancel(jid)
        info = await done(q, jid)
        assert info.state == "cancelled"
        assert w.pool is not None and w.pool.pids() == [pid] and w.pool.killed == 0


async def test_graceful_stop_leaves_no_children_and_dead_letters_nothing(
        url: str, q: Queue, qname: str, r: redis.Redis) -> None:
    """Stop while two max_attempts=1 jobs run past the grace period: their children are
    killed, the jobs handed back uncounted (a later worker completes them), nothing is
    dead-lettered, and no child process is left (not even a zombie)."""
    pids, key = f"{qname}:pids", f"{qname}:go"
    before = children_of_this_process()
    w = pool_worker(url, qname, pool_size=2, concurrency=2, grace_period_s=0.5)
    await w.start()
    try:
        assert w.pool is not None
        started = set(w.pool.pids())
        assert started <= children_of_this_process() - before
        ids = [q.enqueue("wait", {"url": url, "pids": pids, "key": key}).job_id
               for _ in range(2)]
        await eventually(lambda: r.llen(pids) == 2, START_S, "both jobs to start")
    finally:
        await w.stop()
    assert children_of_this_process() == before
    assert not any(alive(p) for p in started)
    assert Admin.from_url(url).count_dead(qname)[0] == 0
    assert [state(q, i) for i in ids] == ["queued", "queued"]
    r.rpush(key, "go", "go")
    async with Worker(url, [qname], pool_jobs.registry, fast()):  # in-process this time
        infos = [await done(q, i) for i in ids]
    assert [(i.state, i.result) for i in infos] == [("completed", "released")] * 2


async def test_graceful_stop_waits_for_running_children(url: str, q: Queue, qname: str,
                                                        r: redis.Redis) -> None:
    """A job that ends within the grace period is settled, then the children go."""
    pids, key = f"{qname}:pids", f"{qname}:go"
    before = children_of_this_process()
    w = pool_worker(url, qname, grace_period_s=60.0)
    await w.start()
    jid = q.enqueue("wait", {"url": url, "pids": pids, "key": key}).job_id
    await eventually(lambda: r.llen(pids) == 1, START_S, "the job to start")
    stopping = asyncio.ensure_future(w.stop())
    await eventually(lambda: not w._running, 10, "the stop to begin")
    r.rpush(key, "go")
    await stopping
    info = q.get(jid)
    assert info is not None and (info.state, info.result) == ("completed", "released")
    assert children_of_this_process() == before


async def test_pool_needs_the_registry_by_module_path(url: str, qname: str) -> None:
    """A registry no module holds cannot be imported by the children: a clear StartupFailed,
    and the worker starts nothing."""
    local = Registry()

    @local.handler("x", isolation="process")
    def x(job: Job) -> None:
        return None

    before = children_of_this_process()
    w = Worker(url, [qname], local, fast())
    with pytest.raises(StartupFailed, match="pool_registry"):
        await w.start()
    assert not w.running and children_of_this_process() == before


async def test_pool_registry_without_the_handlers_is_refused(url: str, qname: str) -> None:
    """pool_registry naming another registry: the children lack the worker's job types."""
    local = Registry()
    local.register("not-in-pool-jobs", lambda job: None, isolation="process")
    w = Worker(url, [qname], local, fast(pool_registry="pool_jobs:registry", pool_size=1))
    with pytest.raises(StartupFailed, match="not-in-pool-jobs"):
        await w.start()
    assert not w.running


def test_cli_pool_process(url: str, q: Queue, qname: str, tmp_path: Path) -> None:
    """`streamq worker ... --pool process --pool-size 1 --max-jobs-per-child 2`: jobs run in
    children of the worker, recycled every two jobs; the pool's metrics are in the first
    scrape at 0 and count the recycle by its cause; SIGTERM stops it cleanly and no child
    outlives it."""
    from test_metrics import metrics_port

    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    log = tmp_path / "worker.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "streamq", "worker", "pool_jobs:registry", "--url", url,
             "--queue", qname, "--concurrency", "1", "--pool", "process", "--pool-size", "1",
             "--max-jobs-per-child", "2", "--metrics-port", "0"], cwd=Path(__file__).parent,
            env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        port = metrics_port(log)
        wait_until(lambda: "started on" in log.read_text(), START_S, "the worker to start")
        assert pool_metrics(port) == {
            "streamq_pool_size": 1, "streamq_pool_busy": 0, "streamq_pool_started_total": 1,
            "streamq_pool_recycled_total{max_jobs}": 0,
            "streamq_pool_recycled_total{max_memory}": 0, "streamq_pool_died_total": 0,
            "streamq_pool_timeouts_total": 0}
        got: list[int] = []
        for _ in range(3):
            jid = q.enqueue("pid", None).job_id
            wait_until(lambda jid=jid: finished(q, jid), START_S, "the job to finish")  # type: ignore[misc]
            info = q.get(jid)
            assert info is not None and info.state == "completed"
            got.append(info.result)
        assert got[0] == got[1] != got[2] and proc.pid not in got
        after = pool_metrics(port)
        assert after["streamq_pool_recycled_total{max_jobs}"] == 1
        assert after["streamq_pool_started_total"] == 2 and after["streamq_pool_busy"] == 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=START_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not any(alive(p) for p in got)


def pool_metrics(port: int) -> dict[str, float]:
    """The ``streamq_pool_*`` samples of one scrape ('name{cause}' for the recycles)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name.startswith("streamq_pool_") and not s.name.endswith("_created"):
                cause = s.labels.get("cause")
                out[f"{s.name}{{{cause}}}" if cause else s.name] = s.value
    return out


SCRIPT = '''
import asyncio, json, os, sys, time
from streamq import Job, Queue, Registry, Worker, WorkerConfig

registry = Registry()


class Gone(Exception):
    pass


@registry.handler("where", isolation="process")
def where(job: Job) -> int:
    return os.getpid()


@registry.handler("gone", isolation="process", fail_on=Gone)
def gone(job: Job) -> None:
    raise Gone("for good")


async def main(url: str, queue: str) -> None:
    q = Queue.from_url(url, queue)
    a, b = q.enqueue("where", None).job_id, q.enqueue("gone", None).job_id
    async with Worker(url, [queue], registry, WorkerConfig(pool_size=1, block_ms=200)):
        while not all(q.get(i).finished for i in (a, b)):
            await asyncio.sleep(0.02)
    ia, ib = q.get(a), q.get(b)
    print(json.dumps({"pid": os.getpid(), "where": ia.result, "gone": [ib.state, ib.reason]}))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
'''


def test_embedded_script_as_main(url: str, qname: str, tmp_path: Path) -> None:
    """A script run as __main__: its children run it again as __mp_main__ (its main block
    does not run twice), and an exception class of the script still matches fail_on."""
    script = tmp_path / "job_script.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), url, qname], capture_output=True,
                         text=True, timeout=START_S * 2, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["where"] != got["pid"]
    assert got["gone"] == ["failed", "Gone is in fail_on"]


def test_bad_pool_options_are_refused() -> None:
    from streamq import InvalidArgument, WorkerConfig

    reg = Registry()
    with pytest.raises(InvalidArgument, match="isolation"):
        reg.register("x", lambda job: None, isolation="thread")
    with pytest.raises(InvalidArgument, match="isolation"):
        reg.handler("x", isolation="fork")
    with pytest.raises(InvalidArgument, match="pool must be 'thread' or 'process'"):
        WorkerConfig(pool="fork")
    with pytest.raises(InvalidArgument, match="MiB"):
        WorkerConfig(max_memory_per_child_mb=0)
    with pytest.raises(InvalidArgument, match="module:attribute"):
        WorkerConfig(pool_registry="myapp.tasks")
    with pytest.raises(InvalidArgument, match="positive integer"):
        WorkerConfig(max_jobs_per_child=0)


async def test_hooks_run_once_in_each_child(url: str, q: Queue, qname: str, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every child runs the startup hooks once before its first job and the shutdown hooks
    when it is retired (max_jobs_per_child) or the worker stops; the worker's own process,
    which runs no handler with pool='process', runs neither."""
    marks = tmp_path / "marks"
    monkeypatch.setenv("POOL_JOBS_MARKS", str(marks))
    async with pool_worker(url, qname, max_jobs_per_child=1):
        ran = [(await done(q, q.enqueue("pid", None).job_id)).result for _ in range(2)]
    lines = [line.split() for line in marks.read_text().splitlines()]
    starts = [int(p) for what, p in lines if what == "start"]
    stops = [int(p) for what, p in lines if what == "stop"]
    assert sorted(starts) == sorted(set(starts)) and sorted(stops) == sorted(starts)
    assert set(ran) <= set(starts) and os.getpid() not in starts


async def test_dependency_results_reach_the_child(url: str, q: Queue, qname: str) -> None:
    """A job that waited for others (depends_on) reads their results in its child as
    in-process (docs/workflows.md)."""
    async with pool_worker(url, qname):
        first = q.enqueue("echo", {"k": 1}, job_id=f"{qname}-a").job_id
        second = q.enqueue("pid", None, job_id=f"{qname}-b").job_id
        last = q.enqueue("deps", None, depends_on=[first, second]).job_id
        info = await done(q, last)
    a, b = q.get(first), q.get(second)
    assert a is not None and b is not None
    assert info.state == "completed"
    assert info.result == {"results": [a.result, b.result], "states": ["completed"] * 2,
                           "previous": a.result}


def test_the_serde_crosses_by_reference_in_json_never_pickled() -> None:
    """The children get the queue's serde as its configuration by reference (JSON: module-level
    names, plain values), rebuilt alike; one that cannot be named is refused at start."""
    from streamq._core.serde import JsonSerde, MsgpackSerde
    from streamq._worker.child import serde_from_ref
    from streamq._worker.pool import serde_ref

    value = {"n": 1, "s": "x", "l": [1, 2]}
    for serde in (JsonSerde(), MsgpackSerde(), JsonSerde(default=str)):
        ref = json.loads(json.dumps(serde_ref(serde)))
        copy = serde_from_ref(ref)
        assert type(copy) is type(serde)
        assert copy.loads(serde.dumps(value)) == value
    assert serde_from_ref(serde_ref(JsonSerde(default=str))).dumps({"d": object}) \
        == JsonSerde(default=str).dumps({"d": object})
    with pytest.raises(TypeError, match="not a module-level"):
        serde_ref(JsonSerde(default=lambda o: str(o)))
