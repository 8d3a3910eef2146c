"""``streamq worker --reload`` and ``streamq scheduler --reload`` (issue 30): a code change
restarts the process with a graceful stop, and a reload mid-drain loses nothing and
dead-letters nothing (every job has ``max_attempts=1``: a hand-back that counted an attempt
would dead-letter it)."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers import wait_until

from streamq import Queue
from streamq.cli.reload import changed, child_argv, scan, watch_roots

TASKS = '''
import asyncio

from streamq import Job, Registry

VERSION = {version}
registry = Registry()


@registry.handler("work")
async def work(job: Job) -> int:
    await asyncio.sleep(0.02)
    return VERSION
'''


class Lines:
    """A child's output, read line by line in a thread (no blocking read in the test)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.seen: list[str] = []
        self._q: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None
        out = proc.stdout

        def pump() -> None:
            for line in out:
                self._q.put(line)

        threading.Thread(target=pump, daemon=True).start()

    def count(self, text: str) -> int:
        while not self._q.empty():
            self.seen.append(self._q.get_nowait())
        return sum(text in line for line in self.seen)

    def wait_for(self, text: str, n: int = 1, timeout_s: float = 30) -> None:
        wait_until(lambda: self.count(text) >= n, timeout_s,
                   what=f"{n}x {text!r} in the output:\n{''.join(self.seen)}")


def write(path: Path, text: str) -> None:
    """Write and move the mtime forward a whole second, so the change shows on any clock."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_text(text)
    os.utime(path, ns=(before + 1_000_000_000, before + 1_000_000_000))


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    write(tmp_path / "myapp" / "tasks.py", TASKS.format(version=1))
    return tmp_path


def start(app: Path, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "STREAMQ_RELOAD_INTERVAL": "0.1"}
    return subprocess.Popen([sys.executable, "-m", "streamq", *args, "--reload"], cwd=app,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_reload_mid_drain_loses_nothing_and_runs_the_new_code(app: Path, url: str,
                                                                  qname: str) -> None:
    q = Queue.from_url(url, qname)
    proc = start(app, "worker", "myapp.tasks:registry", "--url", url, "--queue", qname,
                 "--concurrency", "4")
    lines = Lines(proc)
    try:
        lines.wait_for("started on")
        ids = [q.enqueue("work", i, max_attempts=1).job_id for i in range(300)]
        wait_until(lambda: any(q.get(i).state == "completed"  # type: ignore[union-attr]
                               for i in ids), what="the drain to begin")
        write(app / "myapp" / "tasks.py", TASKS.format(version=2))
        lines.wait_for("myapp/tasks.py changed; restarting the worker")
        lines.wait_for("started on", n=2)
        later = [q.enqueue("work", i, max_attempts=1).job_id for i in range(20)]
        wait_until(lambda: all(q.get(i).state in ("completed", "failed")  # type: ignore
                               for i in ids + later), timeout_s=60,
                   what="every job to finish")
        states = {i: q.get(i).state for i in ids + later}  # type: ignore[union-attr]
        assert [i for i, s in states.items() if s != "completed"] == []
        assert {q.result(i) for i in later} == {2}  # the new code runs them
        assert lines.count("stopped:") == 1  # the first child stopped gracefully
        # the drain (300 x 20 ms over 4 slots: 1.5 s at least) spanned the reload
        owners = {q.get(i).owner.split(":")[1] for i in ids}  # type: ignore[union-attr]
        assert len(owners) == 2, owners
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    assert rc == 0, "".join(lines.seen)
    lines.wait_for("stopped:", n=2)  # the signal reached the second child, which stopped


def test_a_child_that_fails_to_import_waits_for_a_fix(app: Path, url: str, qname: str) -> None:
    write(app / "myapp" / "tasks.py", "registry = (\n")  # a syntax error
    proc = start(app, "worker", "myapp.tasks:registry", "--url", url, "--queue", qname)
    lines = Lines(proc)
    try:
        lines.wait_for("exited with code 1; waiting for a change to restart it")
        write(app / "myapp" / "tasks.py", TASKS.format(version=3))
        lines.wait_for("started on")
        q = Queue.from_url(url, qname)
        job = q.enqueue("work", 0).job_id
        assert q.result(job, timeout=20) == 3
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=30)
    assert rc == 0, "".join(lines.seen)


def test_the_scheduler_reloads_too(app: Path, url: str, qname: str) -> None:
    (app / "myapp" / "cron.py").write_text("CRON: list[object] = []\n")
    proc = start(app, "scheduler", "--queue", qname, "--cron", "myapp.cron:CRON", "--url", url)
    lines = Lines(proc)
    try:
        lines.wait_for("started on")
        write(app / "myapp" / "cron.py", "CRON: list[object] = []  # edited\n")
        lines.wait_for("myapp/cron.py changed; restarting the scheduler")
        lines.wait_for("started on", n=2)
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    assert rc == 0, "".join(lines.seen)


def test_the_watcher_sees_added_edited_and_removed_files(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    write(tmp_path / "pkg" / "a.py", "x = 1\n")
    (tmp_path / ".venv").mkdir()
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "pyvenv.cfg").write_text("")
    (tmp_path / "venv" / "lib.py").write_text("")
    (tmp_path / ".venv" / "lib.py").write_text("")
    (tmp_path / "notes.txt").write_text("")
    roots = watch_roots([], str(tmp_path))
    before = scan(roots)
    assert list(before) == [str(tmp_path / "pkg" / "a.py")]  # no virtualenv, no text file
    write(tmp_path / "pkg" / "a.py", "x = 2\n")
    write(tmp_path / "pkg" / "b.py", "")
    after = scan(roots)
    assert changed(before, after) == [str(tmp_path / "pkg" / "a.py"),
                                      str(tmp_path / "pkg" / "b.py")]
    (tmp_path / "pkg" / "b.py").unlink()
    assert changed(after, scan(roots)) == [str(tmp_path / "pkg" / "b.py")]
    assert child_argv(["worker", "app:r", "--reload", "--queue", "q"])[1:] == [
        "-m", "streamq", "worker", "app:r", "--queue", "q"]


def test_the_app_package_outside_the_directory_is_watched(app: Path, tmp_path_factory:
                                                          pytest.TempPathFactory) -> None:
    elsewhere = tmp_path_factory.mktemp("run")
    sys.path.insert(0, str(app))
    try:
        roots = watch_roots(["myapp.tasks:registry"], str(elsewhere))
    finally:
        sys.path.remove(str(app))
    assert roots == [elsewhere.resolve(), (app / "myapp").resolve()]
