"""streamq.testing as a user's project meets it: `pytest -p streamq.testing` in a project of
its own, with the redis_url / queue / worker fixtures, run_until_idle, make_job, fast_forward."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import redis

from streamq import Job, Registry
from streamq.testing import URL_ENV, make_job

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
import redis

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


EXTERNAL_TESTS = '''
import os
from pathlib import Path

import pytest
import redis
import redis

from streamq import Job, Registry
from streamq.testing import run_until_idle

registry = Registry()


@registry.handler("echo")
def echo(job: Job) -> object:
    return job.payload


@pytest.fixture
def streamq_registry() -> Registry:
    return registry


SEEN = Path(os.environ["SEEN_FILE"])


@pytest.mark.parametrize("n", [1, 2, 3])
def test_each_test_has_a_namespace(redis_url, queue, worker, streamq_prefix, n) -> None:
    assert redis_url == os.environ["EXPECTED_URL"]  # no private server
    r = redis.Redis.from_url(redis_url)
    assert r.get("outside") == b"kept"  # the database is not emptied
    assert not r.keys(f"{streamq_prefix}:*")
    for earlier in SEEN.read_text().split():  # the keys of the tests before are gone
        assert earlier != streamq_prefix and not r.keys(f"{earlier}:*")
    job = queue.enqueue("echo", {"n": n})
    [done] = run_until_idle(worker)
    assert (done.id, done.result) == (job.job_id, {"n": n})
    assert r.keys(f"{streamq_prefix}:*")  # the queue and worker fixtures write there
    assert not r.keys("streamq:*")  # nothing under the default prefix
    SEEN.write_text(SEEN.read_text() + " " + streamq_prefix)
'''


@pytest.mark.parametrize("how", ["option", "env"])
def test_the_plugin_runs_against_an_existing_server(tmp_path: Path, how: str) -> None:
    """``--streamq-url URL`` or ``$STREAMQ_TEST_URL``: the fixtures use that server (here one
    this test starts, as a CI service container would be), each test under a key prefix of
    its own whose keys are deleted after it, and the database is never emptied."""
    from streamq._core.server import RedisServer

    (tmp_path / "test_ci.py").write_text(EXTERNAL_TESTS)
    (tmp_path / "seen").write_text("")
    with RedisServer() as server:
        r = redis.Redis.from_url(server.url)
        r.set("outside", "kept")
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", URL_ENV)}
        env |= {"SEEN_FILE": str(tmp_path / "seen"), "EXPECTED_URL": server.url}
        args = [sys.executable, "-m", "pytest", "-p", "streamq.testing", "-p",
                "no:cacheprovider", "-q"]
        if how == "option":
            args += ["--streamq-url", server.url]
        else:
            env[URL_ENV] = server.url
        proc = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "3 passed" in proc.stdout
        assert len(set((tmp_path / "seen").read_text().split())) == 3
        assert r.keys("*") == [b"outside"]  # every test's keys deleted, the rest kept
        r.close()
