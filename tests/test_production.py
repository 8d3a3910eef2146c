"""Running in production (issue 30): lifecycle hooks that build shared resources once per
process and hand them to handlers as ``job.ctx``; per-handler retry rules (``retry_on``,
``fail_on``); a typed task's invalid payload dead-lettered at once; a deliberate ``Fail`` logged
as one WARNING line; the ``stopped`` line's stats as fields."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import eventually, fast

from streamq import (
    Context,
    Fail,
    InvalidArgument,
    Job,
    JsonFormatter,
    Queue,
    Registry,
    RegistryError,
    StartupFailed,
    Worker,
)
from streamq.testing import make_job

# ----------------------------------------------------------------------- lifecycle hooks


class Pool:
    def __init__(self) -> None:
        self.closed = False


async def test_startup_hooks_fill_the_context_handlers_read(url: str, q: Queue) -> None:
    reg = Registry()
    calls: list[str] = []

    @reg.on_startup
    async def open_pool(ctx: Context) -> None:
        calls.append("start async")
        ctx.pool = Pool()

    @reg.on_startup
    def settings(ctx: Context) -> None:  # sync hooks too, in the order registered
        calls.append("start sync")
        ctx["greeting"] = "hello"

    @reg.on_shutdown
    async def close_pool(ctx: Context) -> None:
        calls.append("stop async")
        ctx.get_as("pool", Pool).closed = True

    seen: list[Any] = []

    @reg.handler("use")
    def use(job: Job) -> str:
        seen.append(job.ctx.get_as("pool", Pool))
        return f"{job.ctx.greeting} {job.payload}"

    q.enqueue("use", "a", job_id="a")
    async with Worker(url, [q.name], reg, fast()):
        assert calls == ["start async", "start sync"]
        await eventually(lambda: q.get("a").state == "completed",  # type: ignore[union-attr]
                         what="the job to complete")
    assert q.result("a", timeout=1) == "hello a"
    assert calls == ["start async", "start sync", "stop async"]
    assert seen[0].closed  # the resource the handler used was the one closed at shutdown
    assert dict(reg.ctx) == {}  # emptied after the shutdown hooks


async def test_hooks_run_once_per_process_for_several_workers(url: str, q: Queue) -> None:
    reg = Registry()
    starts: list[int] = []
    stops: list[int] = []
    reg.on_startup(lambda ctx: starts.append(1))
    reg.on_shutdown(lambda ctx: stops.append(1))
    reg.register("noop", lambda job: None)
    one = Worker(url, [q.name], reg, fast())
    two = Worker(url, [q.name], reg, fast())
    await asyncio.gather(one.start(), two.start())
    assert starts == [1]
    await one.stop()
    assert stops == []  # the other worker still runs jobs that may use the resources
    await two.stop()
    assert stops == [1]
    async with Worker(url, [q.name], reg, fast()):  # a new start builds them again
        assert starts == [1, 1]
    assert stops == [1, 1]


async def test_a_failing_startup_hook_stops_the_start(url: str, q: Queue) -> None:
    reg = Registry()
    stops: list[int] = []

    @reg.on_startup
    def connect(ctx: Context) -> None:
        ctx.half = "built"
        raise ConnectionRefusedError("database at db:5432 refused")

    reg.on_shutdown(lambda ctx: stops.append(1))
    ran: list[str] = []
    reg.register("noop", lambda job: ran.append(job.id))
    q.enqueue("noop", job_id="x")
    worker = Worker(url, [q.name], reg, fast())
    with pytest.raises(StartupFailed, match=r"startup hook .*connect failed:"
                       r" ConnectionRefusedError: database at db:5432 refused") as info:
        await worker.start()
    assert isinstance(info.value.__cause__, ConnectionRefusedError)
    assert not worker.running
    assert ran == [] and q.get("x").state == "queued"  # type: ignore[union-attr]
    assert stops == [] and dict(reg.ctx) == {}
    await worker.stop()  # a no-op, as for a worker never started
    assert stops == []


async def test_every_shutdown_hook_runs_even_after_one_raised(
        url: str, q: Queue, caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry()
    order: list[str] = []

    @reg.on_shutdown
    def first(ctx: Context) -> None:
        order.append("first")
        raise RuntimeError("flush failed")

    @reg.on_shutdown
    async def second(ctx: Context) -> None:
        order.append("second")

    reg.register("noop", lambda job: None)
    async with Worker(url, [q.name], reg, fast()):
        pass
    assert order == ["first", "second"]
    failed = [r for r in caplog.records if "shutdown hook" in r.getMessage()]
    assert failed and failed[0].levelno == logging.ERROR and "first" in failed[0].getMessage()
    assert failed[0].exc_info is not None


async def test_shutdown_hooks_run_after_the_last_job_settled(url: str, q: Queue) -> None:
    reg = Registry()
    states: list[str] = []
    release = asyncio.Event()
    started = asyncio.Event()

    @reg.handler("slow")
    async def slow(job: Job) -> None:
        started.set()
        await release.wait()

    @reg.on_shutdown
    def check(ctx: Context) -> None:
        states.append(q.get("s").state)  # type: ignore[union-attr]

    q.enqueue("slow", job_id="s")
    worker = Worker(url, [q.name], reg, fast(grace_period_s=10))
    await worker.start()
    # the handler's own signal, not the record's "active": the claim writes that before the
    # worker reads its reply, and a stop in between hands the unstarted job back (queued)
    await eventually(started.is_set, what="the handler to start")
    stopping = asyncio.create_task(worker.stop())
    await asyncio.sleep(0)  # stop() waits for the running job ...
    assert states == []
    release.set()  # ... which then completes; the hooks see it settled
    await stopping
    assert states == ["completed"]


def test_hooks_are_checked_at_registration() -> None:
    reg = Registry()
    with pytest.raises(RegistryError, match="cannot be called with the worker context"):
        reg.on_startup(lambda: None)  # type: ignore[type-var]
    with pytest.raises(RegistryError, match="decorates a function"):
        reg.on_shutdown("close")  # type: ignore[type-var]


def test_make_job_hands_a_context_to_a_handler_under_test() -> None:
    job = make_job({"n": 1}, ctx={"db": "fake"})
    assert job.ctx.db == "fake" and job.ctx.get_as("db", str) == "fake"
    with pytest.raises(AttributeError, match=r"no 'cache'.*startup hook"):
        job.ctx.cache  # noqa: B018
    with pytest.raises(TypeError, match="is a str, not a int"):
        job.ctx.get_as("db", int)


# ----------------------------------------------------------------------- retry rules


async def test_retry_on_retries_only_the_named_errors(url: str, q: Queue) -> None:
    reg = Registry()
    runs: dict[str, int] = {}

    @reg.handler("fetch", max_attempts=3, retry_on=(ConnectionError, TimeoutError),
                 retry=None)
    def fetch(job: Job) -> str:
        runs[job.id] = runs.get(job.id, 0) + 1
        if job.payload == "flaky" and runs[job.id] == 1:
            raise ConnectionResetError("peer reset")  # a ConnectionError: retried
        if job.payload == "bug":
            raise KeyError("price")  # not named: dead at once
        return "ok"

    q.enqueue("fetch", "flaky", job_id="flaky")
    q.enqueue("fetch", "bug", job_id="bug")
    async with Worker(url, [q.name], reg, fast(retry=_quick())):
        await eventually(lambda: q.get("flaky").state == "completed"  # type: ignore[union-attr]
                         and q.get("bug").state == "failed",  # type: ignore[union-attr]
                         what="both jobs to finish")
    bug = q.get("bug")
    assert bug is not None
    assert (bug.attempts, bug.reason) == (1, "KeyError is not in retry_on"
                                          " (ConnectionError, TimeoutError)")
    assert bug.error is not None and bug.error["type"] == "KeyError"
    assert runs == {"flaky": 2, "bug": 1}


async def test_fail_on_dead_letters_at_once_and_wins_over_retry_on(
        url: str, q: Queue, caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry()

    @reg.handler("read", max_attempts=5, retry_on=OSError, fail_on=FileNotFoundError)
    async def read(job: Job) -> None:
        raise FileNotFoundError(f"no file {job.payload}")

    q.enqueue("read", "/x", job_id="r")
    async with Worker(url, [q.name], reg, fast(retry=_quick())):
        await eventually(lambda: q.get("r").state == "failed",  # type: ignore[union-attr]
                         what="the job to be dead-lettered")
    info = q.get("r")
    assert info is not None and (info.attempts, info.reason) == (1, "FileNotFoundError is in"
                                                                 " fail_on")
    lines = [r for r in caplog.records if "job r " in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.WARNING]  # asked for: no ERROR, no traceback
    assert lines[0].exc_info is None


async def test_a_timeout_is_a_timeout_error_for_the_rules(url: str, q: Queue) -> None:
    reg = Registry()

    @reg.handler("hang", max_attempts=3, timeout=0.05, fail_on=TimeoutError)
    async def hang(job: Job) -> None:
        await asyncio.Event().wait()

    q.enqueue("hang", job_id="h")
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: q.get("h").state == "failed",  # type: ignore[union-attr]
                         what="the job to be dead-lettered")
    info = q.get("h")
    assert info is not None and (info.attempts, info.reason) == (1, "TimeoutError is in fail_on")


@pytest.mark.parametrize("kwargs, match", [
    ({"retry_on": "ConnectionError"}, "retry_on takes exception classes"),
    ({"retry_on": ()}, "retry_on needs at least one exception class"),
    ({"fail_on": (ValueError, 3)}, "fail_on takes exception classes"),
    ({"fail_on": Fail}, "Fail already says what happens"),
    ({"retry_on": ValueError, "fail_on": (ValueError,)}, "ValueError in both"),
])
def test_bad_retry_rules_are_refused(kwargs: dict[str, Any], match: str) -> None:
    reg = Registry()
    with pytest.raises(InvalidArgument, match=match):
        reg.register("x", lambda job: None, **kwargs)
    with pytest.raises(InvalidArgument, match=match):
        reg.handler("y", **kwargs)(lambda job: None)
    with pytest.raises(InvalidArgument, match=match):
        reg.task("z", **kwargs)(lambda: None)
    assert reg.names() == []


async def test_typed_tasks_take_retry_rules(url: str, q: Queue) -> None:
    reg = Registry()

    @reg.task("charge", max_attempts=4, fail_on=PermissionError)
    def charge(amount: int) -> int:
        raise PermissionError("card blocked")

    charge.enqueue_sync(q, 5)
    job_id = q.enqueue("charge", {"amount": 5}).job_id
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: q.get(job_id).state == "failed",  # type: ignore[union-attr]
                         what="the job to be dead-lettered")
    info = q.get(job_id)
    assert info is not None and (info.attempts, info.reason) == (1, "PermissionError is in"
                                                                 " fail_on")


# ----------------------------------------------------------------------- typed validation


async def test_an_invalid_typed_payload_is_dead_lettered_at_once(
        url: str, q: Queue, caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry()
    ran: list[int] = []

    @reg.task("resize", max_attempts=3)
    def resize(width: int, height: int = 10) -> int:
        ran.append(width)
        return width * height

    # producers that bypass the typed handle (another service, an old version)
    q.enqueue("resize", {"width": "wide"}, job_id="type")
    q.enqueue("resize", {"height": 3}, job_id="missing")
    q.enqueue("resize", {"width": 2, "depth": 1}, job_id="unknown")
    q.enqueue("resize", [2, 3], job_id="list")
    ok = resize.enqueue_sync(q, 4).job_id
    bad = ("type", "missing", "unknown", "list")
    async with Worker(url, [q.name], reg, fast(retry=_quick())):
        await eventually(lambda: all(q.get(i).state == "failed"  # type: ignore[union-attr]
                                     for i in bad)
                         and q.get(ok).state == "completed",  # type: ignore[union-attr]
                         what="the jobs to finish")
    reasons = {}
    for job_id in bad:
        info = q.get(job_id)
        assert info is not None and info.attempts == 1, (job_id, info)
        assert info.error is not None and info.error["type"] == "InvalidPayload"
        reasons[job_id] = info.reason
    assert "argument 'width': expected int" in reasons["type"]
    assert reasons["missing"] == "resize: missing argument(s) width"
    assert reasons["unknown"] == "resize: unexpected argument(s) depth (it takes width, height)"
    assert "must be a mapping of arguments, got list" in reasons["list"]
    assert ran == [4]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


# ----------------------------------------------------------------------- logs


async def test_a_deliberate_fail_is_one_warning_line(url: str, q: Queue,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry()

    @reg.handler("charge")
    def charge(job: Job) -> None:
        raise Fail("customer does not exist")

    caplog.set_level(logging.INFO, logger="streamq.worker")
    q.enqueue("charge", job_id="c")
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: q.get("c").state == "failed",  # type: ignore[union-attr]
                         what="the job to be dead-lettered")
    lines = [r for r in caplog.records if "job c " in r.getMessage()]
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in lines] == [
        (logging.WARNING, "job c (charge) attempt 1/3 failed: Fail: customer does not exist;"
         " dead-lettered", None)]


async def test_the_stopped_line_carries_the_stats_as_fields(
        url: str, q: Queue, caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry()
    reg.register("noop", lambda job: None)
    caplog.set_level(logging.INFO, logger="streamq.worker")
    q.enqueue("noop", job_id="n")
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: q.get("n").state == "completed",  # type: ignore[union-attr]
                         what="the job to complete")
    record = next(r for r in caplog.records if " stopped: " in r.getMessage())
    assert record.getMessage().endswith("stopped: 1 started, 1 completed")
    line = json.loads(JsonFormatter().format(record))
    assert line["stats"]["completed"] == 1 and line["stats"]["failed"] == 0
    assert "WorkerStats(" not in line["message"]


def _quick() -> Any:
    from streamq import RetryPolicy

    return RetryPolicy(base_s=0.01, cap_s=0.01)


# ----------------------------------------------------------------------- hooks under the CLI

HOOKED_APP = '''
from streamq import Context, Job, Registry

registry = Registry()


@registry.on_startup
def build(ctx: Context) -> None:
    if {fail}:
        raise RuntimeError("no database at db:5432")
    ctx.prefix = "built once"


@registry.on_shutdown
def close(ctx: Context) -> None:
    print("shutdown hook ran", flush=True)


@registry.handler("show")
def show(job: Job) -> str:
    return job.ctx.prefix
'''


def _cli_worker(tmp_path: Path, url: str, qname: str, fail: bool
                ) -> subprocess.Popen[str]:
    (tmp_path / "hooked.py").write_text(HOOKED_APP.format(fail=fail))
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "streamq", "worker", "hooked:registry",
                             "--url", url, "--queue", qname], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_hooks_run_under_streamq_worker(tmp_path: Path, url: str, q: Queue) -> None:
    job_id = q.enqueue("show").job_id
    proc = _cli_worker(tmp_path, url, q.name, fail=False)
    try:
        assert q.result(job_id, timeout=30) == "built once"
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "shutdown hook ran" in out


def test_a_failing_startup_hook_is_one_line_from_streamq_worker(tmp_path: Path, url: str,
                                                                 q: Queue) -> None:
    job_id = q.enqueue("show").job_id
    proc = _cli_worker(tmp_path, url, q.name, fail=True)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert err.strip().splitlines()[-1] == (
        "streamq: startup hook build failed: RuntimeError: no database at db:5432; the worker"
        " did not start"), err
    assert "Traceback" not in err and "shutdown hook ran" not in out
    assert q.get(job_id).state == "queued"  # type: ignore[union-attr]
