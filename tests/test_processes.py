"""``streamq worker --processes N`` (issue 30): a supervisor runs N full workers (each its own
consumer), restarts one that dies, stops them all gracefully on SIGTERM (nothing
dead-lettered, even with ``max_attempts=1``), and serves one metrics endpoint for all."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from helpers import running, wait_until
from test_reload import Lines

from streamq import Job, Queue, Registry
from streamq.admin import Admin
from streamq.cli.processes import exit_cause, processes_count

TASKS = '''
import asyncio

from streamq import Job, Registry

registry = Registry()


@registry.handler("work")
async def work(job: Job) -> int:
    await asyncio.sleep(0.02)
    return 1
'''


@pytest.fixture
def app(tmp_path: Path) -> Path:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tasks.py").write_text(TASKS)
    return tmp_path


def start(app: Path, url: str, qname: str, *args: str) -> tuple[subprocess.Popen[str], Lines]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "streamq", "worker", "myapp.tasks:registry",
                             "--url", url, "--queue", qname, "--concurrency", "4", *args],
                            cwd=app, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    return proc, Lines(proc)


def owners(q: Queue, ids: list[str]) -> set[str]:
    out: set[str] = set()
    for i in ids:
        info = q.get(i)
        if info is not None and info.state == "completed" and info.owner:
            out.add(info.owner)
    return out


def child_pids(lines: Lines) -> dict[int, int]:
    """Slot -> pid of the latest start of each worker process, from the supervisor's log."""
    lines.count("")
    found: dict[int, int] = {}
    for line in lines.seen:
        if m := re.search(r"worker process (\d+) started \(pid (\d+)\)", line):
            found[int(m[1])] = int(m[2])
    return found


def finished(q: Queue, ids: list[str]) -> bool:
    return all(q.get(i).state == "completed" for i in ids)  # type: ignore[union-attr]


def stop(proc: subprocess.Popen[str], lines: Lines) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("".join(lines.seen)) from None


def test_two_processes_drain_a_queue_and_serve_one_metrics_endpoint(app: Path, url: str,
                                                                    qname: str) -> None:
    q = Queue.from_url(url, qname)
    proc, lines = start(app, url, qname, "--processes", "2", "--metrics-port", "0")
    try:
        lines.wait_for("started on", n=2)
        ids = [q.enqueue("work", i).job_id for i in range(300)]
        wait_until(lambda: all(q.get(i).state == "completed"  # type: ignore[union-attr]
                               for i in ids), timeout_s=60, what="the drain")
        by = owners(q, ids)
        assert len(by) == 2, by  # two consumers, one per process
        assert {o.split(":")[1] for o in by} == {str(p) for p in child_pids(lines).values()}
        lines.wait_for("serving Prometheus metrics of every worker process")
        port = re.search(r"every worker process on http://[^:]+:(\d+)/metrics",
                         "".join(lines.seen))
        assert port is not None
        with urllib.request.urlopen(f"http://127.0.0.1:{port[1]}/metrics", timeout=10) as resp:
            text = resp.read().decode()
        completed = [line for line in text.splitlines()
                     if line.startswith("streamq_jobs_completed_total{")]
        assert {re.search(r'process="(\d)"', line)[1]  # type: ignore[index]
                for line in completed} == {"0", "1"}, text
        total = sum(float(line.rsplit(" ", 1)[1]) for line in completed)
        assert total == 300
        assert "streamq_worker_processes 2.0" in text
        assert text.count("# TYPE streamq_jobs_completed_total counter") == 1
    finally:
        rc = stop(proc, lines)
    assert rc == 0, "".join(lines.seen)


HOLD = '''

@registry.handler("hold")
async def hold(job: Job) -> int:
    if job.attempt == 1:  # the first attempt holds its slot until its process is killed
        await asyncio.sleep(600)
    return job.attempt
'''


@pytest.mark.slow  # about 20 s: five deaths, four of them waiting out a 2 s lease
def test_four_processes_killed_child_by_child_are_restarted_and_the_drain_goes_on(
        app: Path, url: str, qname: str) -> None:
    """Deterministic by construction: 8 jobs hold their first attempt over 4 processes x 2
    slots, so every process is known to hold 2 of them when it is killed; after each kill its
    2 come back (visibility timeout 2 s) and complete on their second attempt, and a fresh
    batch drains on the processes alive."""
    (app / "myapp" / "tasks.py").write_text(TASKS + HOLD)
    q = Queue.from_url(url, qname)
    proc, lines = start(app, url, qname, "--processes", "4", "--concurrency", "2",
                        "--visibility-timeout", "2")
    try:
        lines.wait_for("started on", n=4, timeout_s=60)
        held = [q.enqueue("hold", i).job_id for i in range(8)]

        def holders() -> dict[str, list[str]]:
            by: dict[str, list[str]] = {}
            for i in held:
                info = q.get(i)
                if info is not None and info.state == "active" and info.owner:
                    by.setdefault(info.owner.split(":")[1], []).append(i)
            return by

        wait_until(lambda: sum(map(len, holders().values())) == 8, timeout_s=30,
                   what="every slot to hold a job")
        by_pid = holders()
        pids = child_pids(lines)
        assert sorted(by_pid) == sorted(str(p) for p in pids.values())  # 2 in each process
        # slots 0 to 3, then slot 0 again: its second quick death waits twice as long
        for n, slot in enumerate([0, 1, 2, 3, 0]):
            victim = pids[slot]
            mine = by_pid.get(str(victim), [])
            assert len(mine) == (2 if n < 4 else 0)
            os.kill(victim, signal.SIGKILL)
            lines.wait_for(f"worker process {slot} (pid {victim}) died with signal SIGKILL")
            lines.wait_for(f"restarting it in {'1.0' if n == 4 else '0.5'} s",
                           n=1 if n == 4 else n + 1)
            lines.wait_for("started on", n=5 + n, timeout_s=60)  # its replacement is up
            pids = child_pids(lines)
            assert pids[slot] != victim
            batch = [q.enqueue("work", i).job_id for i in range(40)]
            wait_until(functools.partial(finished, q, batch + mine), timeout_s=60,
                       what=f"the batch and the jobs of killed process {slot} to finish")
            assert {q.result(i) for i in mine} <= {2}  # retried: a second attempt
            ran = {o.split(":")[1] for o in owners(q, batch)}
            assert ran <= {str(p) for p in pids.values()}, (ran, pids)
        assert {q.result(i) for i in held} == {2}
        assert Admin.from_url(url).stats(qname).dead == 0
    finally:
        rc = stop(proc, lines)
    assert rc == 0, "".join(lines.seen)


def test_sigterm_stops_every_process_gracefully_and_dead_letters_nothing(
        app: Path, url: str, qname: str) -> None:
    q = Queue.from_url(url, qname)
    proc, lines = start(app, url, qname, "--processes", "2")
    lines.wait_for("started on", n=2)
    ids = [q.enqueue("work", i, max_attempts=1).job_id for i in range(2000)]
    # (about 5 s of work on 2 x 4 slots: the stop comes mid-drain)
    wait_until(lambda: len(owners(q, ids[::10])) == 2, what="both processes to run jobs")
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=30)
    assert rc == 0, "".join(lines.seen)
    lines.wait_for("stopped:", n=2)  # each worker process stopped gracefully
    assert lines.count("restarting it") == 0  # nothing restarted during the stop
    states = {q.get(i).state for i in ids}  # type: ignore[union-attr]
    assert states <= {"completed", "queued"}, states
    assert "queued" in states  # the stop came mid-drain: the rest was handed back
    assert Admin.from_url(url).stats(qname).dead == 0
    reg = Registry()

    @reg.handler("work")
    async def work(job: Job) -> int:
        return 1

    async def drain() -> None:
        async with running(url, qname, reg):
            await _finish(q, ids)

    import asyncio

    asyncio.run(drain())  # the handed-back jobs run on their first attempt


async def _finish(q: Queue, ids: list[str]) -> None:
    from helpers import eventually

    await eventually(lambda: all(q.get(i).state == "completed"  # type: ignore[union-attr]
                                 for i in ids), timeout_s=60, what="the rest to run")


def test_a_worker_that_cannot_start_stops_the_set(app: Path, url: str, qname: str) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "streamq", "worker", "myapp.nothing:registry",
                             "--url", url, "--queue", qname, "--processes", "2"], cwd=app,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 1, out
    assert "no module named 'myapp.nothing'" in out
    assert "not restarting (a configuration error?)" in out


def test_the_processes_option() -> None:
    assert processes_count("3") == 3
    assert processes_count("auto") == (os.cpu_count() or 1)
    for bad in ("0", "-1", "many"):
        with pytest.raises(Exception, match="a count of processes"):
            processes_count(bad)
    assert exit_cause(3) == "exit code 3"
    assert exit_cause(-9) == "signal SIGKILL"


def test_reload_restarts_the_whole_set(app: Path, url: str, qname: str) -> None:
    from test_reload import write

    env = {**os.environ, "PYTHONUNBUFFERED": "1", "STREAMQ_RELOAD_INTERVAL": "0.1"}
    proc = subprocess.Popen([sys.executable, "-m", "streamq", "worker", "myapp.tasks:registry",
                             "--url", url, "--queue", qname, "--processes", "2", "--reload"],
                            cwd=app, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    lines = Lines(proc)
    try:
        lines.wait_for("started on", n=2)
        write(app / "myapp" / "tasks.py", TASKS.replace("return 1", "return 2"))
        lines.wait_for("myapp/tasks.py changed; restarting the worker")
        lines.wait_for("stopped:", n=2)  # both old processes stopped gracefully
        lines.wait_for("started on", n=4)
        q = Queue.from_url(url, qname)
        job = q.enqueue("work", 0).job_id
        assert q.result(job, timeout=20) == 2
    finally:
        rc = stop(proc, lines)
    assert rc == 0, "".join(lines.seen)
    lines.wait_for("stopped:", n=4)
