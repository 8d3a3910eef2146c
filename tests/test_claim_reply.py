"""claim.lua's reply (one array per read, 4 values per entry, tokens by place) and the
worker's decoding of it (fetch.py's ``_claim``), against a real redis-server: priority
levels read in share order, the short form and the full form of a start, entries not
started, and a worker that drains such a mix with the right tokens, attempts, deadlines and
priorities."""

from __future__ import annotations

from typing import Any

import redis
from helpers import eventually, fast

from streamq import Job, Queue, Registry, Retry, Worker
from streamq._core.config import QueueConfig
from streamq._core.keys import GROUP, Keys
from streamq._core.scripts import SCRIPTS
from streamq._worker.calls import claim_call, claim_read, claim_rows, lease_tokens


def _groups(r: redis.Redis, k: Keys, levels: list[int]) -> list[str]:
    streams = [k.stream_level(p) for p in levels]
    for s in streams:
        r.xgroup_create(s, GROUP, id="0", mkstream=True)
    return streams


def test_the_worker_names_a_claims_tokens_as_the_script_does() -> None:
    # claim_rows names them one by one, as claim.lua does: <prefix><hex(first + k)>
    for prefix, first, n in (("a1b2c3d4e5", 1, 75), ("w%d:", 0xfff, 3), ("p", 10**12, 1)):
        assert lease_tokens(prefix, first, n) == [f"{prefix}{k:x}" for k in range(first,
                                                                                  first + n)]
    assert lease_tokens("p", 5, 0) == []


def test_levels_in_reading_order_with_tokens_by_place(r: redis.Redis, q: Queue) -> None:
    """Shares first (a read per level), then the rest from the levels in order: one array
    per read, each naming its level; the k-th entry of the reply (malformed entries and
    entries not started counted too) started under the token of number first + k."""
    k = q.keys
    for i in range(3):
        q.enqueue("t", {"i": i}, job_id=f"hi{i}", priority=4)
        q.enqueue("t", {"i": i}, job_id=f"mid{i}")
        q.enqueue("t", {"i": i}, job_id=f"lo{i}", priority=0)
    streams = _groups(r, k, [4, 2, 0])
    r.xadd(k.stream_level(4), {"junk": "x"})  # a malformed entry after hi0..hi2
    q.enqueue("t", job_id="hi3", priority=4)
    r.hset(k.job("hi1"), "e", "1-1")  # a ghost: its record names another entry
    reply: Any = SCRIPTS["claim"](r, *claim_call(k, "c1", QueueConfig(), "pfx", 30, 9,
                                                 streams, [2, 1, 1]))
    assert reply[0] == b"ok" and reply[2] == 9 and claim_read(reply) == 9
    # l: the place of the level's stream in the call (4, 2, 0): shares, then the rest
    assert [rows[0] for rows in reply[4:]] == [1, 2, 3, 1, 2]
    rows = claim_rows(reply, "pfx", 30)
    assert [(lv, jid, code) for lv, _e, jid, code, *_ in rows] == [
        (1, "hi0", "run"), (1, "hi1", "skip"), (2, "mid0", "run"), (3, "lo0", "run"),
        (1, "hi2", "run"), (1, "", "dead"), (1, "hi3", "run"), (2, "mid1", "run"),
        (2, "mid2", "run")]
    assert [row[4] for row in rows] == [f"pfx{30 + i:x}" for i in range(9)]
    for lv, entry, jid, code, token, attempt, data, deadline, wait, age in rows:
        if code != "run":
            continue
        rec: Any = r.hgetall(k.job(jid))
        assert rec[b"k"] == token.encode() and rec[b"o"] == b"c1" and rec[b"s"] == b"a"
        assert attempt == 1 and deadline == 0 and wait >= 0 and age >= 0
        assert data.startswith(b"t ")
        assert r.xpending_range(streams[lv - 1], GROUP, entry, entry, 1)[0][
            "consumer"] == b"c1"
    assert rows[1][6] == b"queued" and rows[5][6] == b"malformed stream entry"


def test_the_full_form_of_a_start(r: redis.Redis, q: Queue) -> None:
    """A start that is not attempt 1 without a deadline (wait == age) answers its four
    numbers in an array; the short form is a number, and both decode to the same row."""
    k = q.keys
    q.enqueue("t", job_id="plain")
    q.enqueue("t", job_id="timed", deadline=3600)
    q.enqueue("t", job_id="again")
    q.enqueue("t", job_id="old")
    r.hset(k.job("again"), "n", "2")  # two attempts made before (a retried job)
    r.hset(k.job("old"), "c", "1")  # created long before it entered the stream
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    reply: Any = SCRIPTS["claim"](r, *claim_call(k, "c1", QueueConfig(), "p", 0, 10))
    ((level, *flat),) = reply[4:]
    assert level == 1 and len(flat) == 16
    ts = flat[3::4]
    assert isinstance(ts[0], int) and all(isinstance(t, list) for t in ts[1:])
    rows = {row[2]: row for row in claim_rows(reply, "p", 0)}
    assert rows["plain"][5:6] == (1,) and rows["plain"][7] == 0
    assert rows["plain"][8] == rows["plain"][9]
    _lv, _e, _j, code, token, attempt, _d, deadline, *_ = rows["timed"]
    assert code == "run" and token == "p1" and attempt == 1 and deadline > 0
    assert rows["again"][5] == 3 and rows["again"][7] == 0
    assert rows["old"][5] == 1 and rows["old"][9] > rows["old"][8]


async def test_a_worker_drains_a_mix_of_levels_and_forms(url: str, qname: str,
                                                         r: redis.Redis) -> None:
    """Jobs at three levels, some with deadlines, one retried (its next start in the full
    form), a ghost and a malformed entry among them: each runs with its level, attempt and
    deadline, and completes under the token the worker computed (a wrong one would be
    refused as lost and the job never completes)."""
    seen: dict[str, list[tuple[int, int, bool]]] = {}
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> None:
        seen.setdefault(job.id, []).append((job.priority, job.attempt, job.deadline_ms > 0))
        if job.id == "r1" and job.attempt == 1:
            raise Retry(delay_s=0.01)

    with Queue.from_url(url, qname) as q:
        k = q.keys
        q.enqueue("t", job_id="warm")  # the groups of every level, made before the batch
        for p in (4, 0):
            q.enqueue("t", job_id=f"warm{p}", priority=p)
        async with Worker(url, [qname], reg, fast(concurrency=40)):
            await eventually(lambda: len(seen) == 3, what="the warm-up jobs")
            jobs: list[dict[str, Any]] = []
            for i in range(20):
                p = (4, 2, 0)[i % 3]
                jobs.append({"type": "t", "job_id": f"j{i}", "priority": p,
                             **({"deadline": 3600} if i % 4 == 0 else {})})
            jobs.append({"type": "t", "job_id": "r1", "priority": 4})
            q.enqueue_many(jobs)
            r.xadd(k.stream_level(0), {"junk": "x"})
            await eventually(lambda: all(
                q.get(j) is not None and q.get(j).state == "completed"  # type: ignore
                for j in [f"j{i}" for i in range(20)] + ["r1"]), what="all jobs completed")
    for i in range(20):
        assert seen[f"j{i}"] == [((4, 2, 0)[i % 3], 1, i % 4 == 0)]
    assert seen["r1"] == [(4, 1, False), (4, 2, False)]
    assert r.xlen(k.dead) == 1  # the malformed entry
