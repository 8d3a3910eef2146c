"""The `streamq` command line, driven as a user would: a subprocess against a real server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import wait_until

from streamq import ALL_EVENTS, DEFAULT_EVENTS, Queue
from streamq.cli.main import build_parser, queue_config

TESTS = Path(__file__).parent


def streamq(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "streamq", *args], cwd=TESTS, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_worker_command_runs_jobs_and_stops_gracefully_on_sigterm(url: str, qname: str) -> None:
    q = Queue.from_url(url, qname)
    q.enqueue("echo", {"hello": "world"}, job_id="cli-1")
    proc = streamq("worker", "cli_jobs:registry", "--url", url, "--queue", qname,
                   "--concurrency", "4", "--visibility-timeout", "5")
    try:
        wait_until(lambda: (i := q.get("cli-1")) is not None and i.state == "completed",
                   what="the CLI worker to run the job")
        assert q.result("cli-1") == {"hello": "world"}
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert "stopped" in out


def test_worker_command_rejects_what_is_not_a_registry(url: str) -> None:
    for spec, message in [("cli_jobs", "module:attribute"),
                          ("cli_jobs:missing", "cannot load registry"),
                          ("no_such_module:registry", "cannot load registry"),
                          ("cli_jobs:not_a_registry", "not a streamq.Registry")]:
        proc = streamq("worker", spec, "--url", url, "--queue", "x")
        out, _ = proc.communicate(timeout=20)
        assert proc.returncode != 0 and message in out, out


@pytest.mark.slow
def test_demo_runs_on_its_own_embedded_redis() -> None:
    """The README's first command: no URL, a private redis-server, numbers that add up."""
    env = {k: v for k, v in os.environ.items() if k != "STREAMQ_URL"}
    proc = subprocess.run([sys.executable, "-m", "streamq", "demo", "--jobs", "300"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "started a private redis-server" in proc.stdout
    assert "the numbers match, nothing was lost" in proc.stdout
    assert "SIGKILLed worker" in proc.stdout
    assert "demo --web\nthen open http://127.0.0.1:8080/queue?q=demo" in proc.stdout  # next


@pytest.mark.parametrize(("given", "kinds"), [
    ([], DEFAULT_EVENTS),
    (["--events", "all"], ALL_EVENTS),
    (["--events", "completed,failed"], frozenset({"completed", "failed"})),
])
def test_worker_and_scheduler_take_the_event_kinds(given: list[str], kinds: frozenset[str]) -> None:
    for command in (["worker", "app:registry", "--queue", "q"], ["scheduler", "--queue", "q"]):
        args = build_parser().parse_args([*command, *given])
        assert queue_config(args).event_kinds == kinds


def test_an_unknown_event_kind_is_refused_with_the_known_ones() -> None:
    args = build_parser().parse_args(["worker", "app:registry", "--queue", "q",
                                      "--events", "completed,finished"])
    with pytest.raises(SystemExit, match="finished"):
        queue_config(args)


@pytest.mark.parametrize("var", ["STREAMQ_SHARDS", "STREAMQ_GROUP_CONCURRENCY"])
def test_a_bad_number_in_the_environment_is_a_usage_error(
        var: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(var, "abc")
    with pytest.raises(SystemExit) as stopped:
        build_parser().parse_args(["stats", "q"])
    assert stopped.value.code == 2 and "invalid int value: 'abc'" in capsys.readouterr().err
    monkeypatch.setenv(var, "4")
    assert getattr(build_parser().parse_args(["stats", "q"]),
                   var.removeprefix("STREAMQ_").lower()) == 4
