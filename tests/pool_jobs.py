"""A registry module for the process pool tests (its children import it by module path)."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import os
import time
import uuid
from typing import Any

import redis

from streamq import Context, Fail, Job, RateLimited, Registry, Retry

registry = Registry()
_LEAK: list[bytearray] = []


class Permanent(Exception):
    """In fail_on of 'rules': dead-lettered at once."""


class Flaky(Exception):
    """In retry_on of 'rules': retried."""


def _mark(what: str) -> None:
    """With POOL_JOBS_MARKS set (a file path): one line per hook run, with the pid."""
    path = os.environ.get("POOL_JOBS_MARKS")
    if path:
        with open(path, "a") as f:
            f.write(f"{what} {os.getpid()}\n")


@registry.on_startup
def startup(ctx: Context) -> None:
    ctx.started_in = os.getpid()
    _mark("start")


@registry.on_shutdown
async def shutdown(ctx: Context) -> None:
    _mark("stop")


def _client(job: Job) -> redis.Redis:
    return redis.Redis.from_url(job.payload["url"])


@registry.handler("echo")
def echo(job: Job) -> dict[str, Any]:
    """The payload back with values JSON has no type for, and where it ran."""
    return {"payload": job.payload, "pid": os.getpid(), "ctx_pid": job.ctx.started_in,
            "attempt": job.attempt, "id": job.id, "queue": job.queue,
            "when": dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
            "amount": decimal.Decimal("1.25"), "uid": uuid.UUID(int=7)}


@registry.handler("aecho", isolation="process")
async def aecho(job: Job) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"payload": job.payload, "pid": os.getpid()}


@registry.handler("pid")
def pid(job: Job) -> int:
    return os.getpid()


@registry.handler("none")
def none(job: Job) -> None:
    return None


@registry.handler("hold", max_attempts=3)
def hold(job: Job) -> int:
    """Attempt 1 tells its pid and blocks until the key is pushed; later attempts return."""
    if job.attempt == 1:
        r = _client(job)
        r.rpush(job.payload["pids"], os.getpid())
        r.blpop([job.payload["key"]], timeout=60)
    return job.attempt


@registry.handler("wait", max_attempts=1)
def wait(job: Job) -> str:
    """Tells its pid and blocks until the key is pushed (or 60 s)."""
    r = _client(job)
    r.rpush(job.payload["pids"], os.getpid())
    r.blpop([job.payload["key"]], timeout=60)
    return "released"


@registry.handler("spin", timeout=1, max_attempts=1)
def spin(job: Job) -> None:
    """Never returns: only a hard timeout ends it."""
    _client(job).rpush(job.payload["pids"], os.getpid())
    while True:
        pass


@registry.handler("leak")
def leak(job: Job) -> int:
    """Keeps 40 MiB more at every job (touched, so it is resident)."""
    _LEAK.append(bytearray(b"x" * (40 * 1024 * 1024)))
    return os.getpid()


@registry.handler("exit")
def exit_(job: Job) -> int:
    """Attempt 1 ends its process without a word (os._exit); attempt 2 returns."""
    if job.attempt == 1:
        os._exit(7)
    return job.attempt


@registry.handler("fail")
def fail(job: Job) -> None:
    raise Fail("no such address")


@registry.handler("retry", max_attempts=2)
def retry(job: Job) -> int:
    if job.attempt == 1:
        raise Retry("later", delay_s=0.01)
    return job.attempt


@registry.handler("limited", max_attempts=1)
def limited(job: Job) -> int:
    if job.attempt == 1 and not _client(job).get(job.payload["key"]):
        _client(job).set(job.payload["key"], "1")
        raise RateLimited(0.05, "429 from upstream")
    return job.attempt


@registry.handler("rules", fail_on=Permanent, retry_on=Flaky, max_attempts=3)
def rules(job: Job) -> int:
    if job.payload["raise"] == "permanent":
        raise Permanent("gone for good")
    if job.attempt == 1:
        raise Flaky("try again")
    return job.attempt


@registry.handler("cancellable")
def cancellable(job: Job) -> str:
    r = _client(job)
    r.rpush(job.payload["pids"], os.getpid())
    end = time.monotonic() + 60
    while not job.cancel_requested and time.monotonic() < end:
        time.sleep(0.01)
    return "stopped"


@registry.handler("progress")
def progress(job: Job) -> str:
    job.progress({"done": 50})
    job.log("half way")
    return "done"


@registry.handler("cpu")
def cpu(job: Job) -> int:
    """About 5 ms of pure-Python work (benchmarks)."""
    n = 0
    for i in range(job.payload.get("n", 60_000)):
        n += i * i % 7
    return n


@registry.handler("deps")
def deps(job: Job) -> dict[str, Any]:
    """What a job that waited for others sees of them, in a child."""
    return {"results": [d.result for d in job.dependency_results()],
            "states": [d.state for d in job.dependency_results()],
            "previous": job.previous_result()}


@registry.handler("spawner", children=True)
def spawner(job: Job) -> Any:
    """Adds two children from a child process and waits for them (docs/workflows.md)."""
    from streamq import JobSpec, Queue, WaitForChildren

    done = job.dependency_results()
    if not done:
        with Queue.from_url(job.payload["url"], job.queue) as q:
            q.add_children(job.id, [JobSpec("echo", i, job_id=f"{job.id}-{i}")
                                    for i in range(2)])
        raise WaitForChildren()
    return {"attempt": job.attempt, "kids": [d.result["payload"] for d in done]}
