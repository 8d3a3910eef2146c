"""``streamq worker --reload`` and ``streamq scheduler --reload`` (issue 30): a code change
restarts the process with a graceful stop, and a reload mid-drain loses nothing and
dead-letters nothing (every job has ``max_attempts=1``: a hand-back that counted an attempt
would dead-letter it)."""

from __future__ import annotations

import functools
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


LEDGER_TASKS = '''
import asyncio
import os
from pathlib import Path

from streamq import Job, Registry

VERSION = {version}
HERE = Path(__file__).resolve().parent.parent
registry = Registry()


@registry.handler("work")
async def work(job: Job) -> int:
    with open(HERE / "ledger", "a") as f:  # one line per run of a handler
        f.write(f"{{job.id}} {{os.getpid()}}\\n")
    gate = job.payload["gate"]
    while gate and not (HERE / f"gate-{{gate}}").exists():  # holds its slot until told
        await asyncio.sleep(0.01)
    return VERSION
'''


def test_two_reloads_mid_drain_of_4000_jobs_lose_nothing_and_dead_letter_nothing(
        app: Path, url: str, qname: str) -> None:
    """Deterministic by construction: before each edit every slot of the worker holds a gate
    job (so thousands of jobs are still queued or prefetched behind it), and the gate opens
    only once the reloader has said it is restarting, so each reload's graceful stop meets
    running jobs and a backlog. The ledger counts handler runs: each job ran exactly once."""
    from collections import Counter

    from streamq.admin import Admin

    slots = 8
    gates = {1: range(1000, 1000 + slots), 2: range(2500, 2500 + slots)}
    tasks = app / "myapp" / "tasks.py"
    write(tasks, LEDGER_TASKS.format(version=1))
    q = Queue.from_url(url, qname)
    proc = start(app, "worker", "myapp.tasks:registry", "--url", url, "--queue", qname,
                 "--concurrency", str(slots))
    lines = Lines(proc)
    ledger = app / "ledger"

    def ran() -> list[str]:
        return ledger.read_text().split("\n")[:-1] if ledger.exists() else []

    def started(want: set[str]) -> bool:
        return want <= {line.split()[0] for line in ran()}

    try:
        lines.wait_for("started on")
        jobs = [{"type": "work", "max_attempts": 1,
                 "payload": {"i": i, "gate": next((g for g, r in gates.items() if i in r), 0)}}
                for i in range(4000)]
        ids = [r.job_id for r in q.enqueue_many(jobs)]
        for gate, held in gates.items():
            want = {ids[i] for i in held}
            wait_until(functools.partial(started, want), timeout_s=60,
                       what=f"every slot to hold a job of gate {gate}")
            assert len(ran()) < 4000 - 1000  # the worker is stalled with a backlog behind it
            write(tasks, LEDGER_TASKS.format(version=gate + 1))
            lines.wait_for("myapp/tasks.py changed; restarting the worker", n=gate)
            (app / f"gate-{gate}").touch()  # the stop is under way: let the held jobs finish
            lines.wait_for("started on", n=gate + 1, timeout_s=60)
        wait_until(lambda: len(ran()) >= 4000, timeout_s=120, what="4,000 handler runs")
        wait_until(lambda: Admin.from_url(url).stats(qname).counters.get("completed") == 4000,
                   timeout_s=30, what="4,000 completions")
        runs = Counter(line.split()[0] for line in ran())
        assert len(runs) == 4000 and set(runs.values()) == {1}, runs.most_common(3)
        stats = Admin.from_url(url).stats(qname)
        assert stats.dead == 0 and stats.ready == 0 and stats.pending == 0, stats
        assert stats.counters.get("failed", 0) == 0, stats.counters
        infos = [q.get(i) for i in ids]
        assert {i.state for i in infos if i is not None} == {"completed"}
        assert len({i.owner for i in infos if i is not None}) == 3  # three worker processes
        assert q.result(ids[0]) == 1
        later = [q.enqueue("work", {"gate": 0}).job_id for _ in range(20)]
        assert {q.result(i, timeout=30) for i in later} == {3}  # the new code runs them
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=30)
    assert rc == 0, "".join(lines.seen)
    assert lines.count("stopped:") == 3  # each child stopped gracefully
