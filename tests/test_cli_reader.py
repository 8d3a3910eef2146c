"""A command line that respects its reader (issue 30): a closed pipe (``streamq ... | head``)
ends quietly, a ``--limit`` over the page cap says so, and a file path given for the registry
gets the ``module:attribute`` to write instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamq import Queue
from streamq.cli.hints import module_hint

TESTS = Path(__file__).parent


def run_into_closed_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    """Run ``streamq *args`` with stdout a pipe whose reader is already gone (what ``| head``
    leaves once it has read its lines): every write meets EPIPE, deterministically."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([sys.executable, "-m", "streamq", *args], cwd=TESTS,
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)


def test_a_closed_pipe_ends_the_command_quietly(url: str, q: Queue) -> None:
    for i in range(3):
        q.enqueue("echo", i)
    for args in (("stats", q.name, "--url", url), ("--help",),
                 ("stats", q.name, "--url", url, "--json")):
        proc = run_into_closed_pipe(*args)
        assert proc.stderr == "", (args, proc.stderr)
        assert proc.returncode in (0, 141), (args, proc.returncode)
    proc = run_into_closed_pipe("stats", q.name, "--url", url)
    assert proc.returncode == 141  # as a command killed by SIGPIPE reports


@pytest.mark.parametrize("command", [["pending", "q"], ["dead", "list", "q"],
                                     ["groups", "q", "list"]])
def test_a_limit_over_the_cap_says_so(command: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "streamq", *command, "--limit", "5000",
                           "--url", "redis://127.0.0.1:1/0"], cwd=TESTS, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert "5000 is over the cap of 1000 per page: give --limit 1000 and follow the" in (
        proc.stderr), proc.stderr
    for bad in ("0", "many"):
        proc = subprocess.run([sys.executable, "-m", "streamq", *command, "--limit", bad,
                               "--url", "redis://127.0.0.1:1/0"], cwd=TESTS,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "--limit" in proc.stderr, proc.stderr


def test_a_limit_at_the_cap_is_taken(url: str, q: Queue) -> None:
    q.enqueue("echo", 1)
    proc = subprocess.run([sys.executable, "-m", "streamq", "pending", q.name, "--limit",
                           "1000", "--url", url], cwd=TESTS, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr


def test_a_file_path_for_the_registry_suggests_the_module(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "streamq", "worker", "myapp/tasks.py:registry",
                           "--queue", "q", "--url", "redis://127.0.0.1:1/0"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "write myapp.tasks:registry" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("spec, hint", [
    ("myapp/tasks.py:registry", "myapp.tasks:registry"),
    ("./myapp/tasks.py:reg", "myapp.tasks:reg"),
    ("tasks.py:registry", "tasks:registry"),
    ("myapp/__init__.py:registry", "myapp:registry"),
    ("myapp/tasks:registry", "myapp.tasks:registry"),
    ("myapp.tasks:registry", None),
    ("../elsewhere/tasks.py:registry", None),
])
def test_module_hint(spec: str, hint: str | None) -> None:
    assert module_hint(spec) == hint
