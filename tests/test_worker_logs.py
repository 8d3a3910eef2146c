"""What a worker tells its operator (issue 19, items 1 and 4): failed attempts and dead letters
in the log, one voice during a Redis outage, a graceful stop that says what it waits for and a
second signal that stops at once, and the event-loop watchdog naming a blocking handler."""

from __future__ import annotations

import asyncio
import json
import logging
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import eventually, fast, wait_until

from streamq import Job, Queue, Registry, RetryPolicy, Worker
from streamq._core.server import RedisServer

PROCS = Path(__file__).parent / "procs"



def messages(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


async def test_failed_attempts_and_dead_letters_are_logged(url: str, q: Queue,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    reg = Registry()
    calls: dict[str, int] = {}

    @reg.handler("charge", max_attempts=2, retry=RetryPolicy(base_s=0.01, cap_s=0.01))
    async def charge(job: Job) -> str:
        calls[job.id] = calls.get(job.id, 0) + 1
        if job.id == "bad" or calls[job.id] == 1:
            raise ValueError(f"card declined for {job.id}")
        return "ok"

    caplog.set_level(logging.INFO, logger="streamq.worker")
    q.enqueue("charge", job_id="bad")
    q.enqueue("charge", job_id="flaky")
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: q.get("bad").state == "failed"  # type: ignore[union-attr]
                         and q.get("flaky").state == "completed",  # type: ignore[union-attr]
                         what="both jobs to finish")
    warnings = messages(caplog, logging.WARNING)
    assert any(m.startswith("job bad (charge) attempt 1/2 failed: ValueError: card declined"
                            " for bad; retrying in") for m in warnings), warnings
    assert sum("job flaky (charge) attempt 1/2 failed" in m for m in warnings) == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    assert errors[0].getMessage() == ("job bad (charge) attempt 2/2 failed: ValueError: card"
                                      " declined for bad; dead-lettered (attempts exhausted)")
    assert errors[0].exc_info is not None  # the traceback goes with the dead letter
    assert not any("flaky" in m for m in messages(caplog, logging.ERROR))


async def test_an_unknown_job_type_says_what_is_registered(url: str, q: Queue,
                                                           caplog: pytest.LogCaptureFixture
                                                           ) -> None:
    reg = Registry()
    reg.register("email.send", lambda job: None)
    q.enqueue("email.sned", job_id="typo")
    async with Worker(url, [q.name], reg, fast()):
        await eventually(lambda: q.get("typo").state == "failed",  # type: ignore[union-attr]
                         what="the job to be dead-lettered")
    errors = messages(caplog, logging.ERROR)
    assert any("job typo (email.sned) attempt 1 failed: UnknownJobType: no handler for"
               " 'email.sned'" in m and "registered: email.send" in m for m in errors), errors


async def test_a_redis_outage_is_one_warning_then_one_line_when_it_is_back(
        qname: str, caplog: pytest.LogCaptureFixture) -> None:
    server = RedisServer(aof=True).start()
    try:
        caplog.set_level(logging.INFO, logger="streamq.worker")
        reg = Registry()
        reg.register("t", lambda job: None)
        async with Worker(server.url, [qname], reg, fast(block_ms=100,
                                                         heartbeat_interval_s=0.1)) as w:
            server.kill()
            await eventually(lambda: any("Redis unavailable" in m
                                         for m in messages(caplog, logging.WARNING)),
                             what="the outage warning")
            await asyncio.sleep(1.0)  # every loop meets the outage meanwhile
            server.start()
            await eventually(lambda: any("Redis available again" in m
                                         for m in messages(caplog, logging.INFO)),
                             timeout_s=20, what="the line saying Redis is back")
            q = Queue.from_url(server.url, qname)
            q.enqueue("t", job_id="after")
            await eventually(lambda: q.get("after").state == "completed",  # type: ignore
                             timeout_s=20, what="work to go on")
            q.close()
            await eventually(lambda: w.stats.completed == 1, what="the outcome counted")
        outage = [m for m in messages(caplog, logging.WARNING) if "Redis" in m]
        assert len(outage) == 1, outage
        assert not messages(caplog, logging.ERROR)
    finally:
        server.close()


def test_a_second_signal_stops_at_once_and_hands_the_job_back(url: str, q: Queue,
                                                              tmp_path: Path) -> None:
    log = tmp_path / "worker.log"
    cfg = {"grace_period_s": 120, "block_ms": 200}
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, str(PROCS / "worker_proc.py"), url,
                                 q.name, str(tmp_path / "ledger"), "w-signals",
                                 json.dumps(cfg)], stdout=subprocess.DEVNULL, stderr=err)
    try:
        q.enqueue("job", {"sleep": 300}, job_id="long")
        # the ledger's start line, not the record's "active" (written by the claim before
        # the worker reads its reply: a SIGTERM in between hands the job back unstarted)
        ledger = tmp_path / "ledger"
        wait_until(lambda: ledger.exists() and b'"ev": "start"' in ledger.read_bytes(),
                   what="the long job's handler to start")
        proc.send_signal(signal.SIGTERM)
        wait_until(lambda: b"waiting up to 120 s for 1 running jobs" in log.read_bytes(),
                   timeout_s=60, what="the stop to say what it waits for")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0  # well before the 120 s grace period
    finally:
        proc.kill()
    text = log.read_text()
    assert "second SIGTERM: stopping now" in text and "handing back 1 jobs" in text
    info = q.get("long")
    assert info is not None and info.state == "queued" and info.attempts == 0  # refunded


async def test_the_watchdog_names_a_handler_that_blocks_the_event_loop(
        url: str, q: Queue, caplog: pytest.LogCaptureFixture) -> None:
    reg = Registry()

    @reg.handler("blocker")
    async def blocker(job: Job) -> None:
        time.sleep(1.0)  # noqa: ASYNC251 - the mistake: a blocking call in an async handler

    caplog.set_level(logging.INFO, logger="streamq.worker")
    q.enqueue("blocker", job_id="stuck-1")
    async with Worker(url, [q.name], reg, fast(loop_stall_warn_s=0.3)) as w:
        await eventually(lambda: q.get("stuck-1").state == "completed",  # type: ignore
                         what="the job to finish")
        assert w._watchdog is not None and w._watchdog.stalls >= 1
    stalls = [m for m in messages(caplog, logging.WARNING) if "event loop blocked" in m]
    assert stalls and "by job stuck-1 (blocker)" in stalls[0]
    assert "time.sleep(1.0)" in stalls[0]  # the stack shows the blocking line
    assert any("event loop answers again" in m for m in messages(caplog, logging.INFO))
