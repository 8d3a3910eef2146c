"""`--metrics-port` (Prometheus text over HTTP) and `--log-format json` on `streamq worker` and
`streamq scheduler`: real processes against a private server, scraped as Prometheus would."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import wait_until
from prometheus_client.parser import text_string_to_metric_families
from test_deploy import metric_names_used

from streamq import Queue
from streamq._ops.metrics import SCOPE_LABELS_ENV, _reader

TESTS = Path(__file__).parent
Samples = dict[str, float]
"""'name{queue}' (or 'name' for a sample without a queue label) -> value."""


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(TESTS)}
    with log.open("wb") as out:
        return subprocess.Popen([sys.executable, "-m", "streamq", *args], cwd=TESTS, env=env,
                                stdout=out, stderr=subprocess.STDOUT)


def metrics_port(log: Path) -> int:
    """The port logged at start (the tests pass --metrics-port 0: a free one). A process that
    stopped at start instead (`streamq: ...`, as an exporter without a keyword we pass did)
    fails the test at once, with its log."""
    def found() -> re.Match[str] | None:
        text = log.read_text()
        if text.startswith("streamq: "):
            raise AssertionError(f"stopped before serving metrics: {text[-2000:]}")
        return re.search(r"/(?:\[[^]]*\]|[\d.]+):(\d+)/metrics", text)

    try:
        line = wait_until(found, timeout_s=30, what="the metrics line")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; the log:\n{log.read_text()[-2000:]}") from None
    return int(line.group(1))


def scrape(port: int) -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            queue = s.labels.get("queue")
            assert queue == s.labels.get("messaging_destination_name")
            if "le" in s.labels:
                continue  # histogram buckets: counts and sums are enough here
            key = f"{s.name}{{{queue}}}" if queue else s.name
            out[key] = out.get(key, 0.0) + s.value  # summed over job types and outcomes
    return out


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


def test_worker_serves_prometheus_metrics_and_json_logs(
        url: str, qname: str, r: redis.Redis, tmp_path: Path,
        procs: list[subprocess.Popen[bytes]]) -> None:
    q = Queue.from_url(url, qname)
    for _ in range(3):
        q.enqueue("ok")
    q.enqueue("bad", job_id="bad-1")
    release = f"{qname}:release"
    q.enqueue("hold", {"url": url, "key": release})
    q.enqueue("ok", delay=3600)
    log = tmp_path / "worker.log"
    procs.append(start(["worker", "metrics_jobs:registry", "--queue", qname, "--url", url,
                        "--metrics-port", "0", "--metrics-interval", "0.1",
                        "--log-format", "json"], log))
    port = metrics_port(log)

    def c(name: str) -> float:
        return scrape(port).get(f"{name}{{{qname}}}", -1.0)

    def settled(want: Samples) -> bool:
        got = scrape(port)
        return all(got.get(f"{k}{{{qname}}}") == v for k, v in want.items())

    wait_until(lambda: settled({
        "streamq_jobs_started_total": 5, "streamq_jobs_completed_total": 3,
        "streamq_jobs_failed_total": 1, "streamq_worker_in_flight": 1,
        "streamq_job_duration_seconds_count": 4,
        # the per-queue gauges, re-read from Redis while scraped
        "streamq_queue_ready": 0, "streamq_queue_pending": 1, "streamq_queue_delayed": 1,
        "streamq_queue_dead": 1, "streamq_queue_oldest_ready_age_seconds": 0}),
        timeout_s=20, what="counters and gauges of 3 done, 1 dead, 1 running, 1 delayed")
    r.rpush(release, 1)
    wait_until(lambda: settled({"streamq_jobs_completed_total": 4, "streamq_worker_in_flight": 0,
                                "streamq_queue_pending": 0,
                                "streamq_job_duration_seconds_count": 5}),
               timeout_s=20, what="the held job to finish")
    assert c("streamq_jobs_retried_total") in (-1.0, 0.0)
    assert scrape(port)["target_info"] == 1  # the resource: service_name="streamq-worker"

    assert stop(procs[0]) == 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]  # every line is JSON
    assert lines[0]["logger"] == "streamq.metrics" and "/metrics" in lines[0]["message"]
    dead = next(rec for rec in lines if rec.get("job_id") == "bad-1")
    # a deliberate Fail is one WARNING line, without a traceback (docs/production.md)
    assert dead["level"] == "WARNING" and "dead-lettered" in dead["message"]
    assert "exc_info" not in dead and "Traceback" not in json.dumps(dead)


QUEUE_GAUGES = ("ready", "pending", "delayed", "dead", "oldest_ready_age_seconds", "workers",
                "group_waiting", "backlog", "slots", "saturation")
JOB_COUNTERS = ("started", "completed", "retried", "failed", "lease_lost", "cancelled",
                "rate_limited")


def scrape_raw(port: int) -> list[Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return list(text_string_to_metric_families(resp.read().decode()))


def test_first_scrape_has_every_counter_at_0_the_queue_gauges_and_the_recipes_names(
        url: str, qname: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    """A worker that has run nothing yet: every counter of each registered job type at 0 and
    every queue gauge, in the first scrape after it started (no 10 s wait for the gauges,
    so `absent()` alerts hold at a restart); no scope labels; then, once a job ran, every
    metric name the Grafana dashboard and the KEDA ScaledObject query is in the scrape."""
    Queue.from_url(url, qname).enqueue("ok", delay=3600)  # one delayed, nothing to run
    log = tmp_path / "worker.log"
    procs.append(start(["worker", "metrics_jobs:registry", "--queue", qname, "--url", url,
                        "--metrics-port", "0", "--metrics-interval", "3600"], log))
    port = metrics_port(log)
    wait_until(lambda: "started on" in log.read_text(), timeout_s=30, what="the worker")
    families = scrape_raw(port)  # the first scrape
    samples = [s for f in families for s in f.samples if s.labels.get("queue") == qname]
    got = {(s.name, s.labels.get("type")): s.value for s in samples if "le" not in s.labels}
    for name in JOB_COUNTERS:
        for job_type in ("ok", "bad", "hold"):
            assert got[(f"streamq_jobs_{name}_total", job_type)] == 0, (name, job_type)
    assert got[("streamq_jobs_reclaimed_total", None)] == 0
    gauges = {name: got[(f"streamq_queue_{name}", None)] for name in QUEUE_GAUGES}
    assert gauges["delayed"] == 1 and gauges["backlog"] == 0 and gauges["saturation"] == 0
    assert gauges["workers"] == 1 and gauges["slots"] == 64  # its own heartbeat, at start
    for s in samples:  # the queue under both names, no per-series scope labels
        assert s.labels["messaging_destination_name"] == qname
        assert not any(k.startswith("otel_scope") for k in s.labels), s

    Queue.from_url(url, qname).enqueue("ok")
    Queue.from_url(url, qname).enqueue("no.such.type")  # dead-lettered: counted as type '?'
    wait_until(lambda: scrape(port).get(f"streamq_jobs_completed_total{{{qname}}}") == 1
               and scrape(port).get(f"streamq_jobs_failed_total{{{qname}}}") == 1,
               timeout_s=20, what="the two jobs")
    types = {s.labels["type"] for f in scrape_raw(port) for s in f.samples
             if s.name == "streamq_jobs_failed_total" and s.labels["queue"] == qname}
    assert types == {"ok", "bad", "hold", "?"}
    emitted = {s.name for f in scrape_raw(port) for s in f.samples}
    used = metric_names_used()
    assert used and used <= emitted, sorted(used - emitted)
    buckets = {s.labels["le"] for f in scrape_raw(port) for s in f.samples
               if s.name == "streamq_job_duration_seconds_bucket"}
    assert "0.0005" in buckets  # a no-op job's run time is charted below 5 ms
    assert stop(procs[0]) == 0


def test_scheduler_serves_queue_gauges_and_its_counters(
        url: str, qname: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    q = Queue.from_url(url, qname)
    q.enqueue("ok")
    q.enqueue("ok", delay=3600)
    q.enqueue("ok", delay=0.2)
    log = tmp_path / "scheduler.log"
    procs.append(start(["scheduler", "--queue", qname, "--url", url, "--metrics-port", "0",
                        "--metrics-interval", "0.1", "--poll-interval", "0.2"], log))
    port = metrics_port(log)

    def ready() -> bool:
        got = scrape(port)
        return (got.get("streamq_scheduler_promoted_total", 0) >= 1
                and got.get(f"streamq_queue_ready{{{qname}}}") == 2
                and got.get(f"streamq_queue_delayed{{{qname}}}") == 1
                and got.get(f"streamq_queue_workers{{{qname}}}") == 0)

    wait_until(ready, timeout_s=20, what="the promoted job in the gauges")
    got = scrape(port)
    assert got["streamq_scheduler_cron_fired_total"] == 0
    # 2 ready (one promoted), the other delayed job not due; no worker: saturated
    assert got[f"streamq_queue_backlog{{{qname}}}"] == 2
    assert got[f"streamq_queue_saturation{{{qname}}}"] == 2
    assert got[f"streamq_queue_oldest_ready_age_seconds{{{qname}}}"] >= 0
    assert stop(procs[0]) == 0
    assert "Traceback" not in log.read_text()


def test_metrics_refused_without_the_extra_or_with_the_port_taken(url: str) -> None:
    blocked = ("import sys; sys.modules['opentelemetry.exporter.prometheus'] = None;"
               " from streamq.cli.main import main;"
               f" main(['worker', 'cli_jobs:registry', '--queue', 'x', '--url', '{url}',"
               " '--metrics-port', '0'])")
    proc = subprocess.run([sys.executable, "-c", blocked], cwd=TESTS, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 1
    assert proc.stderr.startswith("streamq: --metrics-port needs the metrics extra: pip install"
                                  " 'streamq[metrics]'"), proc.stderr

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "streamq", "scheduler", "--queue", "x",
                               "--url", url, "--metrics-port", str(port)], cwd=TESTS,
                              capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert f"streamq: cannot serve metrics on 127.0.0.1:{port}: " in proc.stderr, proc.stderr


def test_scope_labels_asked_of_an_exporter_without_the_switch(
        caplog: pytest.LogCaptureFixture) -> None:
    """opentelemetry-exporter-prometheus before 0.64b0 (the floor, 0.51b0, pairs with
    opentelemetry-sdk 1.30) takes no `scope_info_enabled` and adds no otel_scope_* labels:
    the reader is made without it (streamq stopped at start with a TypeError), and
    STREAMQ_METRICS_SCOPE_LABELS=1 there is a warning. Newer readers get the switch."""
    made: list[dict[str, Any]] = []

    class Old:  # 0.51b0 .. 0.63b0
        def __init__(self, disable_target_info: bool = False) -> None:
            made.append({})

    class New:  # 0.64b0 and later
        def __init__(self, disable_target_info: bool = False, prefix: str = "",
                     scope_info_enabled: bool = True) -> None:
            made.append({"scope_info_enabled": scope_info_enabled})

    with caplog.at_level("WARNING", logger="streamq.metrics"):
        assert isinstance(_reader(Old, False), Old)
        assert not caplog.records
        assert isinstance(_reader(Old, True), Old)
    [warning] = caplog.records
    assert SCOPE_LABELS_ENV in warning.getMessage() and "0.64b0" in warning.getMessage()
    assert isinstance(_reader(New, False), New) and isinstance(_reader(New, True), New)
    assert made == [{}, {}, {"scope_info_enabled": False}, {"scope_info_enabled": True}]
