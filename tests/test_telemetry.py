"""OpenTelemetry traces and metrics across processes, the no-op path, structured job logs."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers import eventually, fast

from streamq import Job, JobContextFilter, JsonFormatter, Queue, Registry, Worker
from streamq._core import telemetry as tel

TESTS = Path(__file__).parent


def run_proc(mode: str, url: str, qname: str, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / f"{mode}.json"
    subprocess.run([sys.executable, str(TESTS / "otel_proc.py"), mode, url, qname, str(out)],
                   check=True, timeout=60, cwd=TESTS)
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def test_one_trace_from_request_through_retries_to_success(url: str, qname: str,
                                                           tmp_path: Path) -> None:
    produced = run_proc("producer", url, qname, tmp_path)
    worked = run_proc("worker", url, qname, tmp_path)
    request = next(s for s in produced["spans"] if s["name"] == "POST /signup")
    publish = [s for s in produced["spans"] if s["name"] == f"publish {qname}"]
    single = next(s for s in publish if s["attributes"].get("messaging.message.id") == "traced")
    batch = next(s for s in publish if "messaging.batch.message_count" in s["attributes"])
    assert single["kind"] == "PRODUCER" and single["parent_id"] == request["span_id"]
    assert batch["attributes"]["messaging.batch.message_count"] == 3
    assert single["attributes"]["messaging.destination.name"] == qname

    attempts = sorted((s for s in worked["spans"] if s["name"] == f"process {qname}"
                       and s["attributes"]["messaging.message.id"] == "traced"),
                      key=lambda s: s["attributes"]["streamq.job.attempt"])
    assert [a["attributes"]["streamq.job.attempt"] for a in attempts] == [1, 2, 3]
    for a in attempts:  # the worker's spans join the request's trace, in another process
        assert a["kind"] == "CONSUMER" and a["trace_id"] == request["trace_id"]
        assert a["parent_id"] == single["span_id"] and a["links"] == [single["span_id"]]
    assert [a["status"] for a in attempts] == ["ERROR", "ERROR", "UNSET"]
    assert [a["attributes"]["streamq.job.outcome"] for a in attempts] == ["retry", "retry", "ok"]
    assert "exception" in attempts[0]["events"] and "streamq.job.retry" in attempts[0]["events"]
    inner = next(s for s in worked["spans"] if s["name"] == "send email")
    assert inner["parent_id"] == attempts[2]["span_id"]  # handler spans nest in the attempt
    batch_attempts = [s for s in worked["spans"] if s["name"] == f"process {qname}"
                      and s["attributes"]["messaging.message.id"] != "traced"]
    assert len(batch_attempts) == 3 and {s["parent_id"] for s in batch_attempts} == {
        batch["span_id"]}

    m = worked["metrics"]

    def total(name: str) -> Any:
        return sum(p["value"] for p in m[name] if p["attributes"].get(
            "messaging.destination.name") == qname)

    assert total("streamq.jobs.started") == 6
    assert total("streamq.jobs.retried") == 2 and total("streamq.jobs.completed") == 4

    def by_labels(name: str) -> dict[tuple[str, ...], Any]:
        """(type, outcome) -> value of the queue's points (every point has ``queue``)."""
        points = [p for p in m[name] if p["attributes"]["messaging.destination.name"] == qname]
        assert all(p["attributes"]["queue"] == qname for p in points)
        return {(p["attributes"]["type"], *([p["attributes"]["outcome"]]
                 if "outcome" in p["attributes"] else [])): p["value"] for p in points}

    assert by_labels("streamq.jobs.started") == {("flaky",): 3, ("ok",): 3}
    assert by_labels("streamq.jobs.retried") == {("flaky",): 2, ("ok",): 0}  # 0 from the start
    assert by_labels("streamq.jobs.lease_lost") == {("flaky",): 0, ("ok",): 0}
    assert by_labels("streamq.jobs.completed") == {("flaky",): 1, ("ok",): 3}
    durations = {k: v["count"] for k, v in by_labels("streamq.job.duration").items()}
    assert durations == {("flaky", "retried"): 2, ("flaky", "completed"): 1,
                         ("ok", "completed"): 3}
    assert {k: v["count"] for k, v in by_labels("streamq.job.queue_wait").items()} == {
        ("flaky",): 3, ("ok",): 3}  # recorded when the attempt starts: no outcome
    assert m["_schema_urls"]["streamq"] == tel.SCHEMA_URL
    for a in attempts:  # the messaging attributes a tracing backend expects
        assert a["schema_url"] == tel.SCHEMA_URL
        assert a["attributes"]["messaging.consumer.group.name"] == "streamq"
        host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
        assert a["attributes"]["server.address"] == host
        assert a["attributes"]["server.port"] == int(port)
    assert [a["attributes"].get("error.type") for a in attempts] == [
        "ConnectionError", "ConnectionError", None]  # on failed attempts only
    ready = [p for p in m.get("streamq.queue.ready", [])
             if p["attributes"]["messaging.destination.name"] == qname]
    assert ready and ready[0]["value"] == 0  # gauges come from the cache the scrape asked for


async def test_no_sdk_means_no_spans_and_empty_carriers(url: str, qname: str) -> None:
    assert not tel.tracing()  # nothing in this process installs an SDK
    q = Queue.from_url(url, qname)
    q.enqueue("t", job_id="plain")
    info = q.get("plain")
    assert info is not None and info.envelope is not None and info.envelope.trace == {}
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> str:
        return "ok"

    async with Worker(url, [qname], reg, fast()):
        await eventually(lambda: q.get("plain").state == "completed",  # type: ignore[union-attr]
                         what="the job")


async def test_job_log_records_carry_job_fields(url: str, qname: str) -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(JobContextFilter())
    handler.setFormatter(JsonFormatter())
    app_log = logging.getLogger("myapp.jobs")
    app_log.addHandler(handler)
    app_log.setLevel(logging.INFO)
    reg = Registry()

    @reg.handler("greet")
    async def greet(job: Job) -> None:
        app_log.info("greeting %s", job.payload)

    @reg.handler("greet.sync")
    def greet_sync(job: Job) -> None:
        app_log.info("greeting from a thread")

    q = Queue.from_url(url, qname)
    q.enqueue("greet", "ada", job_id="g1")
    q.enqueue("greet.sync", job_id="g2")
    try:
        async with Worker(url, [qname], reg, fast()):
            await eventually(lambda: stream.getvalue().count("\n") >= 2, what="two log lines")
            await asyncio.sleep(0)
    finally:
        app_log.removeHandler(handler)
    records = [json.loads(line) for line in stream.getvalue().splitlines()]
    by_id = {r["job_id"]: r for r in records}
    assert by_id["g1"]["message"] == "greeting ada" and by_id["g1"]["queue"] == qname
    assert by_id["g1"]["job_type"] == "greet" and by_id["g1"]["attempt"] == 1
    assert by_id["g2"]["job_type"] == "greet.sync"  # the context follows into the thread pool
    assert "trace_id" not in by_id["g1"]  # no tracing here: no trace id to report


def test_started_counts_outlive_their_worker() -> None:
    """``streamq.jobs.started`` adds up every worker's in-memory counts, and keeps those of a
    worker that is gone (a counter never goes down within a process)."""
    import gc

    from opentelemetry.metrics import CallbackOptions

    def total() -> float:
        return sum(o.value for o in tel._started(CallbackOptions())
                   if o.attributes and o.attributes["queue"] == "started-test")

    first, second = tel.Started(), tel.Started()
    first.zero(["started-test"], ["a", "b"])
    assert total() == 0
    first.by_type[("started-test", "a")] += 3
    second.by_type[("started-test", "b")] = 2
    assert total() == 5
    del first
    gc.collect()
    assert total() == 5
    assert second.by_type  # (kept alive to here)


def test_the_log_context_of_a_job_is_the_dict_it_was() -> None:
    """A span-less attempt's log context is the Job itself (``tel.JOB``), its fields read when
    a line is logged: the same fields and values the dict built per attempt had (the trace id
    the producer's carrier names, '' without one), through JobContextFilter and
    JsonFormatter alike; a traced attempt's dict is used as it is."""
    import contextvars

    tp = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    for carrier in ({}, {"traceparent": tp}, {"traceparent": "junk"}):
        job = Job("j1", "greet", {"n": 1}, 2, 5, "q1", 1, "j1", {}, dict(carrier))
        before = {"job_id": "j1", "job_type": "greet", "queue": "q1", "attempt": 2,
                  "trace_id": tel.carrier_trace_id(carrier) if carrier else ""}
        for value in (job, before):
            ctx = contextvars.copy_context()
            ctx.run(tel.JOB.set, value)
            assert ctx.run(tel.job_fields) == before
            record = logging.LogRecord("x", logging.INFO, __file__, 1, "hi", None, None)
            assert ctx.run(JobContextFilter().filter, record)
            assert {k: getattr(record, k) for k in before} == before
            line = json.loads(ctx.run(JsonFormatter().format, record))
            assert {k: line.get(k) for k in before} == {k: v or None for k, v in
                                                       before.items()}
    assert tel.job_fields() is None
    assert tel.carrier_trace_id({"traceparent": tp}) == "ab" * 16
