"""A multi-job write answers per job (DESIGN.md invariant 16), on one server: one shard of a
sharded queue refuses its jobs (its stream key holds a string: enqueue.lua answers WRONGTYPE
before writing anything), and only that shard's jobs fail, in ``enqueue_many``
(``PartialEnqueueError`` with every job's outcome) and in the self-batching producer (each
caller gets its own shard's answer). ``retry.each`` retries only the parts that failed
transiently. The cluster side (a node down): tests/test_cluster_partial.py."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redis
from redis.exceptions import ConnectionError as RedisConnectionError

from streamq import (
    AsyncQueue,
    Keys,
    PartialEnqueueError,
    Queue,
    QueueConfig,
    ScriptError,
)
from streamq._core.keys import shard_of
from streamq._core.retry import each
from streamq._core.retry import transient as is_transient

SHARDS = 3
CFG = QueueConfig(shards=SHARDS)
BAD = 1
"""The shard whose stream key is broken."""


def ids(prefix: str, n: int) -> list[str]:
    out = [f"{prefix}{i}" for i in range(n)]
    assert {shard_of(j, SHARDS) for j in out} == set(range(SHARDS))
    return out


def broken(r: redis.Redis, qname: str) -> None:
    r.set(Keys(qname, shard=BAD).stream, "not a stream")


def test_enqueue_many_fails_only_the_refused_shards_jobs(url: str, qname: str,
                                                         r: redis.Redis) -> None:
    jobs = ids("m", 30)
    with Queue.from_url(url, qname, CFG) as q:
        q.enqueue_many([{"type": "ok", "job_id": "warm"}])
        broken(r, qname)
        with pytest.raises(PartialEnqueueError) as told:
            q.enqueue_many([{"type": "ok", "job_id": j} for j in jobs])
        exc = told.value
        mine = [j for j in jobs if shard_of(j, SHARDS) == BAD]
        assert exc.job_ids == mine
        assert [r.job_id for r in exc.results] == jobs  # every job, the caller's order
        for res in exc.results:
            if res.job_id in mine:
                assert res.status == "error"
                assert isinstance(res.exception, ScriptError)
                assert "WRONGTYPE" in str(res.exception) and "WRONGTYPE" in res.reason
                assert exc.errors[res.job_id] is res.exception
                assert q.get(res.job_id) is None  # nothing written
            else:
                assert res.status == "queued"
                info = q.get(res.job_id)
                assert info is not None and info.state == "queued"
        assert isinstance(exc.__cause__, ScriptError)
        assert "of 30 job(s)" in str(exc)
        # only refused jobs: nothing was answered, the error itself is raised
        with pytest.raises(ScriptError):
            q.enqueue_many([{"type": "ok", "job_id": j} for j in mine])


async def test_async_enqueue_many_and_gathered_singles(url: str, qname: str,
                                                       r: redis.Redis) -> None:
    singles = ids("s", 30)
    bulk = ids("b", 30)
    async with AsyncQueue.from_url(url, qname, CFG) as q:
        await q.enqueue("ok", job_id="warm")
        broken(r, qname)
        got = await asyncio.gather(*(q.enqueue("ok", job_id=j) for j in singles),
                                   return_exceptions=True)
        for j, g in zip(singles, got, strict=True):
            if shard_of(j, SHARDS) == BAD:
                assert isinstance(g, ScriptError), (j, g)
            else:
                assert not isinstance(g, BaseException) and g.status == "queued", (j, g)
        with pytest.raises(PartialEnqueueError) as told:
            await q.enqueue_many([{"type": "ok", "job_id": j} for j in bulk])
        assert told.value.job_ids == [j for j in bulk if shard_of(j, SHARDS) == BAD]
        assert {res.status for res in told.value.results
                if res.job_id not in told.value.errors} == {"queued"}


def test_threads_get_their_own_shards_answer(url: str, qname: str, r: redis.Redis) -> None:
    singles = ids("t", 30)
    with Queue.from_url(url, qname, CFG) as q:
        q.enqueue("ok", job_id="warm")
        broken(r, qname)
        outcome: dict[str, object] = {}
        go = threading.Barrier(len(singles))

        def send(job_id: str) -> None:
            go.wait()
            try:
                outcome[job_id] = q.enqueue("ok", job_id=job_id).status
            except ScriptError as exc:
                outcome[job_id] = exc

        threads = [threading.Thread(target=send, args=(j,)) for j in singles]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        for j in singles:
            if shard_of(j, SHARDS) == BAD:
                assert isinstance(outcome[j], ScriptError), (j, outcome[j])
            else:
                assert outcome[j] == "queued", (j, outcome[j])


def test_each_retries_only_the_parts_that_failed_transiently() -> None:
    calls: list[tuple[list[int], bool]] = []
    permanent = ValueError("no")

    def fn(parts: list[int], retried: bool) -> list[int | Exception]:
        calls.append((parts, retried))
        out: list[int | Exception] = []
        for i in parts:
            if i == 1:
                out.append(permanent)
            elif i == 2 and len(calls) < 3:
                out.append(RedisConnectionError("down for a while"))
            else:
                out.append(i * 10)
        return out

    assert is_transient(RedisConnectionError("x")) and not is_transient(permanent)
    assert each(fn, 4) == [0, permanent, 20, 30]
    assert calls == [([0, 1, 2, 3], False), ([2], True), ([2], True)]


def test_a_partial_answer_keeps_the_unconfirmed_jobs_apart() -> None:
    """With min_replicas: a failed call's jobs are 'error', the written jobs of a call whose
    replicas fell short are in ``replication`` (written, not failed), the confirmed ones
    neither."""
    from streamq._core.model import EnqueueResult
    from streamq._producer import prepare as prod

    cfg = QueueConfig(shards=SHARDS, min_replicas=1)
    keys = Keys("partial")
    prepared = [prod.prepare(keys, cfg, "ok", None, job_id=j) for j in ids("p", 12)]
    batches = prod.chunks(prepared)
    assert len(batches) == SHARDS
    down = RedisConnectionError("node down")
    outcomes: list[prod.Part | Exception] = [
        ([EnqueueResult(p.job_id, "queued", "queued") for p in batches[0]], 1),
        down,
        ([EnqueueResult(p.job_id, "queued", "queued") for p in batches[2]], 0)]
    with pytest.raises(PartialEnqueueError) as told:
        prod.answered_many("partial", cfg, prepared, batches, outcomes)
    exc = told.value
    assert [r.job_id for r in exc.results] == [p.job_id for p in prepared]
    assert exc.job_ids == [p.job_id for p in prepared if p.shard == batches[1][0].shard]
    assert all(exc.errors[j] is down for j in exc.job_ids)
    assert exc.replication is not None
    assert set(exc.replication.job_ids) == {p.job_id for p in batches[2]}
    assert not set(exc.replication.job_ids) & set(exc.job_ids)
