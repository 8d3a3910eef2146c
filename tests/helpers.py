"""Shared test helpers: poll for a condition with a deadline (no sleep-and-hope)."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import redis

from streamq import Keys, Queue, QueueConfig, Registry, Worker, WorkerConfig
from streamq._core.keys import GROUP
from streamq._core.model import V1_FIELDS, normalize_record
from streamq._core.scripts import SCRIPTS
from streamq._worker import start_call


async def eventually(pred: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition"
                     ) -> Any:
    """Await until ``pred()`` (sync or async) is truthy; fail with ``what`` after timeout_s."""
    end = time.monotonic() + timeout_s
    while True:
        value = pred()
        if isinstance(value, Awaitable):
            value = await value
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.02)


def wait_until(pred: Callable[[], Any], timeout_s: float = 10.0, what: str = "condition") -> Any:
    end = time.monotonic() + timeout_s
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


def fast(**overrides: Any) -> WorkerConfig:
    """A worker config with short intervals, for tests."""
    base = WorkerConfig(concurrency=16, block_ms=200, promote_interval_s=0.05,
                        heartbeat_interval_s=0.5, grace_period_s=2.0, visibility_timeout_s=30.0)
    return attrs.evolve(base, **overrides)


@asynccontextmanager
async def running(url: str, qname: str, reg: Registry, **cfg: Any) -> AsyncIterator[Worker]:
    """A Worker serving ``qname`` with the ``fast`` config (``cfg`` overrides some of it)."""
    async with Worker(url, [qname], reg, fast(**cfg)) as w:
        yield w


def state(q: Queue, job_id: str) -> str:
    """The job's state as ``Queue.get`` reads it; "" when there is no such job."""
    info = q.get(job_id)
    return info.state if info else ""


def finished(q: Queue, *ids: str) -> bool:
    return all(state(q, i) in ("completed", "failed", "cancelled") for i in ids)


_tokens = itertools.count(1)


def start_entries(r: redis.Redis, keys: Keys, consumer: str, pairs: list[tuple[str, str]],
                  token: str | None = None) -> Any:
    """Call start.lua as a worker would for (stream entry, job id) pairs; each start gets a
    fresh lease token unless ``token`` is given (the same token repeats the same start)."""
    part = [(e, j, token or f"test-{next(_tokens)}") for e, j in pairs]
    k, a = start_call(keys, consumer, QueueConfig(), part, [])
    return SCRIPTS["start"](r, k, a)


_V1_NAMES = {v: k for k, v in V1_FIELDS.items()}


def record(r: redis.Redis, key: str) -> dict[bytes, bytes]:
    """A job record (either layout) by its long names: state and entry decoded (``state`` =
    b"queued", ``entry`` = the stream id), ``type`` from the body; absent fields absent."""
    h: Any = r.hgetall(key)
    if not h:
        return {}
    n = normalize_record(h)
    # a layout-2 record's stray layout-1 names (written by hand) are not its fields
    out = {_V1_NAMES.get(k, k): v for k, v in n.items() if k not in V1_FIELDS}
    if b"b" in out:
        out[b"type"] = out[b"b"].partition(b" ")[0]
    return out


def records_untimed(r: redis.Redis, q: Queue, ids: list[str], timed: set[bytes]
                    ) -> list[dict[bytes, bytes]]:
    """The records of jobs ``ids`` without their ``timed`` fields (clock readings): what two
    ways of writing the same jobs must agree on."""
    out = []
    for j in ids:
        h: Any = r.hgetall(q.keys.job(j))
        out.append({k: v for k, v in h.items() if k not in timed})
    return out


def field(r: redis.Redis, key: str, name: str) -> bytes | None:
    """One field of ``record``."""
    return record(r, key).get(name.encode())


def started(r: redis.Redis, q: Queue, job_id: str, consumer: str = "c1") -> tuple[str, str]:
    """Enqueue ``job_id`` and start it as ``consumer`` would: (entry, token)."""
    q.enqueue("x", job_id=job_id)
    r.xreadgroup(GROUP, consumer, {q.keys.stream: ">"}, count=10)
    entries: Any = r.xrange(q.keys.stream)
    entry: str = entries[-1][0].decode()
    token = f"tok-{job_id}"
    reply = start_entries(r, q.keys, consumer, [(entry, job_id)], token=token)
    assert reply[0] == b"run"
    return entry, token


def finish(r: redis.Redis, q: Queue, job_id: str, entry: str, token: str, outcome: str,
           extra: Any = 1000) -> list[bytes]:
    """Call finish.lua for a job ``started`` above with ``outcome`` ("ok", "retry", "later",
    "dead", "cancel") and its argument ``extra`` (a delay in ms, or a dead letter's reason)."""
    k = q.keys
    data = b'{"type": "E", "message": "m"}' if outcome != "ok" else b"42"
    keys = [k.stream, k.delayed, k.dead, k.stats, k.events, k.job(job_id)]
    out: list[bytes] = SCRIPTS["finish"](r, keys, [
        GROUP, "1000", 3600, 1000, "", 1, job_id, entry, token, outcome, data, extra,
        "E" if outcome != "ok" else ""])
    return out
