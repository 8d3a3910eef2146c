"""streamq.testing as a user's project meets it: `pytest -p streamq.testing` in a project of
its own, with the redis_url / queue / worker fixtures, run_until_idle, make_job, fast_forward."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from streamq import Job, Registry
from streamq.testing import make_job

TASKS = '''
from streamq import Fail, Job, Registry

registry = Registry()
sent: list[str] = []


@registry.handler("email.send")
async def send_email(job: Job) -> dict[str, str]:
    sent.append(job.payload["to"])
    return {"to": job.payload["to"], "status": "sent"}


@registry.handler("invoice.check")
def check_invoice(job: Job) -> None:
    if job.payload["total"] < 0:
        raise Fail("negative total")
'''

USER_TESTS = '''
import pytest

from myapp.tasks import registry, send_email, sent
from streamq import Registry
from streamq.testing import fast_forward, make_job, run_until_idle


@pytest.fixture
def streamq_registry() -> Registry:
    return registry


def test_handler_without_redis() -> None:
    import asyncio

    result = asyncio.run(send_email(make_job({"to": "ada@example.com"}, type="email.send")))
    assert result == {"to": "ada@example.com", "status": "sent"}


def test_jobs_run_until_idle(queue, worker) -> None:
    queue.enqueue("email.send", {"to": "a@example.com"})
    queue.enqueue("invoice.check", {"total": -1})
    later = queue.enqueue("email.send", {"to": "later@example.com"}, delay=3600)
    outcomes = run_until_idle(worker)
    assert sorted((o.type, o.state) for o in outcomes) == [
        ("email.send", "completed"), ("invoice.check", "failed")]
    assert queue.get(later.job_id).state == "scheduled"
    assert fast_forward(queue) == 1
    [done] = run_until_idle(worker)
    assert (done.id, done.result) == (later.job_id, {"to": "later@example.com",
                                                     "status": "sent"})


def test_each_test_gets_an_empty_database(redis_url, queue) -> None:
    import redis

    assert redis.Redis.from_url(redis_url).dbsize() == 0
'''


def _run(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(project)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           *args], cwd=project, env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tasks.py").write_text(TASKS)
    (tmp_path / "test_tasks.py").write_text(textwrap.dedent(USER_TESTS))
    return tmp_path


@pytest.mark.slow
def test_a_users_project_runs_with_the_plugin(project: Path) -> None:
    proc = _run(project, "-p", "streamq.testing")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 passed" in proc.stdout


@pytest.mark.slow
def test_a_missing_registry_fixture_says_what_to_write(project: Path) -> None:
    (project / "test_tasks.py").write_text(textwrap.dedent('''
        def test_needs_a_worker(worker) -> None:
            pass
    '''))
    proc = _run(project, "-p", "streamq.testing")
    assert proc.returncode != 0
    assert "define a fixture `streamq_registry` that returns your streamq.Registry" in (
        proc.stdout + proc.stderr)


def test_make_job_builds_what_a_handler_gets() -> None:
    job = make_job({"a": 1}, type="t", attempt=2, headers={"h": "v"})
    assert isinstance(job, Job)
    assert (job.payload, job.type, job.attempt, job.idempotency_key, job.headers) == (
        {"a": 1}, "t", 2, "job-1", {"h": "v"})
    assert job.priority == 2 and make_job(priority=4).priority == 4


async def test_arun_until_idle_in_async_tests(url: str, qname: str) -> None:
    from streamq import AsyncQueue, Worker
    from streamq.testing import arun_until_idle, fast_forward, run_until_idle, test_config

    reg = Registry()

    @reg.handler("double")
    async def double(job: Job) -> int:
        return int(job.payload) * 2

    async with AsyncQueue.from_url(url, qname) as q:
        for n in range(5):
            await q.enqueue("double", n)
        worker = Worker(url, [qname], reg, test_config())
        outcomes = await arun_until_idle(worker)
        assert sorted(o.result for o in outcomes) == [0, 2, 4, 6, 8]
        with pytest.raises(RuntimeError, match="await arun_until_idle"):
            run_until_idle(worker)
    from streamq import Queue

    sq = Queue.from_url(url, qname)
    sq.enqueue("double", 1, delay=30)
    sq.enqueue("double", 2, delay=3000)
    assert fast_forward(sq, seconds=60) == 1
    sq.close()
