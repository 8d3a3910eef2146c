"""A worker or scheduler started before Redis is usable (a deploy racing the server's start, a
failover): with ``start_wait_s`` / ``--start-wait`` it keeps trying, and starts when Redis
answers; a refused login fails at once; a signal while it waits stops it cleanly."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from helpers import eventually, fast, wait_until

from streamq import InvalidArgument, Queue, Registry, Worker, WorkerConfig
from streamq._core.server import RedisServer
from streamq.cli.main import build_parser

TESTS = Path(__file__).parent
WAITING = "Redis is not usable yet"


class UnixRedis:
    """A redis-server on a unix socket of its own, started only when the test says: the
    socket's path is known before the server exists (no port to lose to another process)."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sq-sw-"))  # short: a socket path <= 107
        self.sock = self.dir / "r.sock"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.sock}"

    def start(self) -> None:
        binary = os.environ.get("STREAMQ_REDIS_SERVER", "redis-server")
        self.proc = subprocess.Popen(
            [binary, "--port", "0", "--unixsocket", str(self.sock), "--unixsocketperm", "700",
             "--dir", str(self.dir), "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(unix_socket_path=str(self.sock), protocol=2)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        try:
            wait_until(answers, timeout_s=30, what="redis-server on its unix socket")
        finally:
            client.close()

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def later() -> Iterator[UnixRedis]:
    server = UnixRedis()
    yield server
    server.close()


def waits(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and WAITING in r.getMessage()]


async def test_a_worker_started_before_redis_waits_for_it_then_runs_jobs(
        later: UnixRedis, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="streamq")
    reg = Registry()
    reg.register("double", lambda job: job.payload * 2)
    worker = Worker(later.url, ["sw"], reg, fast(start_wait_s=3600))
    starting = asyncio.create_task(worker.start())
    try:
        await eventually(lambda: waits(caplog), what="the start to say it waits for Redis")
        assert not starting.done()  # no server yet: it cannot have started, nor given up
        assert "ConnectionError" in waits(caplog)[0]
        await asyncio.to_thread(later.start)
        await asyncio.wait_for(starting, 60)
        assert any("started after" in r.getMessage() for r in caplog.records)
        q = Queue.from_url(later.url, "sw")
        q.enqueue("double", 21, job_id="a")
        await eventually(lambda: q.get("a").state == "completed",  # type: ignore[union-attr]
                         what="the job to run")
        assert q.result("a") == 42
        q.close()
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await worker.stop()


async def test_without_a_wait_a_worker_gives_up_with_the_connection_error(
        later: UnixRedis) -> None:
    worker = Worker(later.url, ["sw"], Registry(), fast())
    with pytest.raises(redis.ConnectionError):
        await asyncio.wait_for(worker.start(), 60)  # about 3 s of the calls' own retries
    await worker.stop()  # nothing was left running


async def test_a_refused_login_fails_at_once_whatever_the_wait(
        caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer().start()
    try:
        admin = redis.Redis.from_url(server.url, protocol=2)
        admin.config_set("requirepass", "right-one")
        admin.close()
        url = server.url.replace("redis://", "redis://:wrong-one@")
        worker = Worker(url, ["sw"], Registry(), fast(start_wait_s=3600))
        with pytest.raises(redis.AuthenticationError):
            await asyncio.wait_for(worker.start(), 60)  # not an hour of waiting
        assert waits(caplog) == []
    finally:
        server.close()


async def test_a_scheduler_started_before_redis_waits_then_promotes(
        later: UnixRedis, caplog: pytest.LogCaptureFixture) -> None:
    from schedulers import Scheduler, SchedulerConfig

    caplog.set_level(logging.INFO, logger="streamq")
    scheduler = Scheduler(later.url, ["sw"], config=SchedulerConfig(poll_interval_s=0.2,
                                                                    start_wait_s=3600))
    starting = asyncio.create_task(scheduler.start())
    try:
        await eventually(lambda: waits(caplog), what="the start to say it waits for Redis")
        assert not starting.done()
        await asyncio.to_thread(later.start)
        await asyncio.wait_for(starting, 60)
        q = Queue.from_url(later.url, "sw")
        q.enqueue("t", job_id="due", delay=0.2)
        await eventually(lambda: q.get("due").state == "queued",  # type: ignore[union-attr]
                         what="the scheduler to promote the delayed job")
        q.close()
    finally:
        starting.cancel()
        await asyncio.gather(starting, return_exceptions=True)
        await scheduler.stop()


def test_sigterm_while_the_worker_command_waits_stops_it_cleanly(later: UnixRedis,
                                                                 tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "STREAMQ_START_WAIT": "3600"}
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streamq", "worker", "cli_jobs:registry",
                                 "--url", later.url, "--queue", "sw"], cwd=TESTS, env=env,
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: WAITING.encode() in log.read_bytes(), timeout_s=60,
                   what="the worker command to say it waits for Redis")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # not the hour it was told to wait
    finally:
        proc.kill()
        proc.wait()
    text = log.read_text()
    assert "stopped before it started" in text and "Traceback" not in text


def test_the_wait_is_checked() -> None:
    with pytest.raises(InvalidArgument, match="start_wait_s"):
        WorkerConfig(start_wait_s=-1)
    with pytest.raises(InvalidArgument, match="start_wait_s"):
        WorkerConfig(start_wait_s=float("inf"))
    for command in (["worker", "app:registry", "--queue", "q"], ["scheduler", "--queue", "q"]):
        assert build_parser().parse_args([*command, "--start-wait", "90"]).start_wait == 90.0
    bad = subprocess.run([sys.executable, "-m", "streamq", "scheduler", "--queue", "q",
                          "--start-wait", "-5"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "must be 0 or more seconds" in bad.stderr
