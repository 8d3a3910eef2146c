"""Dedup by an explicit key at enqueue (docs/dedup.md), against a real server: each mode's
window, the transitions that free a key (start, completion, dead letter, cancel, purge, a
lapsed lease), the TTL backstop, repeat safety, sharded queues, and every enqueue path."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any

import pytest
import redis
from helpers import finish, start_entries, wait_until

from streamq import (
    AsyncQueue,
    Dedup,
    InvalidArgument,
    InvalidDedup,
    Queue,
    QueueConfig,
    Registry,
)
from streamq._core.keys import GROUP, shard_of
from streamq._core.scripts import SCRIPTS
from streamq._producer import prepare as prod
from streamq.admin import Admin


def server_ms(r: redis.Redis) -> int:
    s, us = r.time()
    return int(s) * 1000 + int(us) // 1000


def holder(r: redis.Redis, q: Queue, key: str) -> str | None:
    """The id of the job holding dedup key ``key`` (None: free)."""
    v: Any = r.get(q.keys.for_job(key, q.config.shards).dedup(key))
    return v.decode() if v is not None else None


def start(r: redis.Redis, q: Queue, job_id: str, consumer: str = "c1") -> tuple[str, str]:
    """Deliver the queue's oldest undelivered entries to ``consumer`` and start ``job_id``'s:
    (entry, token)."""
    with contextlib.suppress(redis.ResponseError):  # (BUSYGROUP)
        r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    r.xreadgroup(GROUP, consumer, {q.keys.stream: ">"}, count=100)
    entries: Any = r.xrange(q.keys.stream)
    entry = next(e.decode() for e, f in entries if f[b"id"].decode() == job_id)
    token = f"tok-{job_id}-{consumer}"
    reply = start_entries(r, q.keys, consumer, [(entry, job_id)], token=token)
    assert reply[0] == b"run", reply
    return entry, token


def uf(key: str = "k", **kw: Any) -> Dedup:
    return Dedup(key=key, mode="until_finish", **kw)


# ---- until_start / until_finish ---------------------------------------------------------------

def test_until_start_folds_until_the_job_starts(q: Queue, r: redis.Redis) -> None:
    d = Dedup(key="user:42", mode="until_start")
    a = q.enqueue("x", {"n": 1}, dedup=d)
    b = q.enqueue("x", {"n": 2}, dedup=d)
    assert (a.status, b.status, b.job_id, b.state) == ("queued", "deduplicated", a.job_id,
                                                       "queued")
    info = q.get(a.job_id)
    assert info is not None and info.payload == {"n": 1}  # the first one's payload is kept
    assert (info.dedup_key, info.dedup_mode) == ("user:42", "until_start")
    assert holder(r, q, "user:42") == a.job_id
    start(r, q, a.job_id)
    assert holder(r, q, "user:42") is None  # freed by the start itself
    c = q.enqueue("x", {"n": 3}, dedup=d)
    assert c.status == "queued" and c.job_id != a.job_id
    assert holder(r, q, "user:42") == c.job_id


@pytest.mark.parametrize("end", ["completed", "dead", "cancel", "purge", "cancel_running"])
def test_until_finish_frees_the_key_at_each_end(q: Queue, r: redis.Redis, url: str,
                                                end: str) -> None:
    d = uf("order:7")
    a = q.enqueue("x", dedup=d)
    if end in ("completed", "dead", "cancel_running"):
        entry, token = start(r, q, a.job_id)
        # running: still folded (until_finish holds through the start)
        assert q.enqueue("x", dedup=d).job_id == a.job_id
        if end == "completed":
            assert finish(r, q, a.job_id, entry, token, "ok") == [b"completed"]
        elif end == "dead":
            assert finish(r, q, a.job_id, entry, token, "dead", "bad") == [b"failed"]
        else:
            assert q.cancel(a.job_id).code == "cancel_requested"
            assert holder(r, q, "order:7") == a.job_id  # not ended yet
            assert finish(r, q, a.job_id, entry, token, "cancel", "stop") == [b"cancelled"]
    elif end == "cancel":
        assert q.cancel(a.job_id).cancelled
    else:
        assert Admin.from_url(url).purge(q.name, "queued") == 1
    assert holder(r, q, "order:7") is None
    b = q.enqueue("x", dedup=d)
    assert b.status == "queued" and b.job_id != a.job_id


def test_until_finish_holds_through_a_retry(q: Queue, r: redis.Redis) -> None:
    a = q.enqueue("x", dedup=uf())
    entry, token = start(r, q, a.job_id)
    assert finish(r, q, a.job_id, entry, token, "retry", 60_000) == [b"retrying"]
    again = q.enqueue("x", dedup=uf())
    assert (again.status, again.job_id, again.state) == ("deduplicated", a.job_id, "retrying")


def test_a_key_is_freed_only_while_it_names_the_job(q: Queue, r: redis.Redis) -> None:
    """A job whose key was taken over (it started: until_start) ends later: the new holder
    keeps the key."""
    d = Dedup(key="k", mode="until_start")
    a = q.enqueue("x", dedup=d)
    entry, token = start(r, q, a.job_id)
    b = q.enqueue("x", dedup=d)
    assert b.status == "queued" and holder(r, q, "k") == b.job_id
    assert finish(r, q, a.job_id, entry, token, "dead", "bad") == [b"failed"]
    assert holder(r, q, "k") == b.job_id
    assert q.enqueue("x", dedup=d).job_id == b.job_id


def test_a_stale_key_does_not_block(q: Queue, r: redis.Redis) -> None:
    """A key left naming a job that is gone or past its window (written by hand here) is
    taken over by the next enqueue, never a lock that outlives its job."""
    r.set(q.keys.dedup("k"), "no-such-job")
    a = q.enqueue("x", dedup=uf())
    assert a.status == "queued" and holder(r, q, "k") == a.job_id


def test_lapsed_lease_keeps_the_semantics(q: Queue, r: redis.Redis) -> None:
    """A worker dies mid-job (its lease lapses) and another reclaims it: until_finish still
    folds while the job runs again, the dead worker's late finish is lost and frees nothing,
    and the second worker's completion frees the key."""
    a = q.enqueue("x", dedup=uf())
    entry, token1 = start(r, q, a.job_id, "c1")
    r.xclaim(q.keys.stream, GROUP, "c2", 0, [entry])  # the reclaim's takeover
    token2 = f"tok-{a.job_id}-c2"
    assert start_entries(r, q.keys, "c2", [(entry, a.job_id)], token=token2)[0] == b"run"
    assert q.get(a.job_id).attempts == 2  # type: ignore[union-attr]
    assert q.enqueue("x", dedup=uf()).job_id == a.job_id
    assert finish(r, q, a.job_id, entry, token1, "ok") == [b"lost"]
    assert holder(r, q, "k") == a.job_id
    assert finish(r, q, a.job_id, entry, token2, "ok") == [b"completed"]
    assert holder(r, q, "k") is None


def test_until_start_with_a_lapsed_lease(q: Queue, r: redis.Redis) -> None:
    d = Dedup(key="k", mode="until_start")
    a = q.enqueue("x", dedup=d)
    entry, _ = start(r, q, a.job_id, "c1")
    b = q.enqueue("x", dedup=d)  # a new job: a's window ended at its first start
    r.xclaim(q.keys.stream, GROUP, "c2", 0, [entry])
    assert start_entries(r, q.keys, "c2", [(entry, a.job_id)])[0] == b"run"
    assert holder(r, q, "k") == b.job_id  # the re-start of a frees nothing of b's


# ---- throttle ---------------------------------------------------------------------------------

def test_throttle_one_job_per_window(q: Queue, r: redis.Redis) -> None:
    d = Dedup(key="report", mode="throttle", ttl_s=0.3)
    a = q.enqueue("x", dedup=d)
    entry, token = start(r, q, a.job_id)
    assert finish(r, q, a.job_id, entry, token, "ok") == [b"completed"]
    # finished, but the window lasts: still folded into a
    b = q.enqueue("x", dedup=d)
    assert (b.status, b.job_id, b.state) == ("deduplicated", a.job_id, "completed")
    # the window ends with the key's TTL (the server's clock): polled, not slept
    c = wait_until(lambda: (lambda res: res if res.status == "queued" else None)(
        q.enqueue("x", dedup=d)), what="the throttle window to end")
    assert c.job_id != a.job_id


def test_throttle_into_a_job_whose_record_is_gone(q: Queue, r: redis.Redis) -> None:
    d = Dedup(key="k", mode="throttle", ttl_s=60)
    a = q.enqueue("x", dedup=d, result_ttl=0)
    entry, token = start(r, q, a.job_id)
    assert finish(r, q, a.job_id, entry, token, "ok") == [b"completed"]  # record deleted
    b = q.enqueue("x", dedup=d)
    assert (b.status, b.job_id, b.state) == ("deduplicated", a.job_id, "")


# ---- debounce ---------------------------------------------------------------------------------

def _due(r: redis.Redis, q: Queue, job_id: str) -> int:
    score = r.zscore(q.keys.delayed, job_id)
    assert score is not None
    return int(score)


def test_debounce_replaces_the_payload_and_pushes_the_start_back(q: Queue, r: redis.Redis
                                                                 ) -> None:
    d = Dedup(key="search:alice", mode="debounce", delay_ms=1000, max_wait_ms=60_000)
    a = q.enqueue("x", {"q": "a"}, dedup=d)
    assert a.status == "scheduled"
    created = int(r.hget(q.keys.job(a.job_id), "c"))  # type: ignore[arg-type]
    assert _due(r, q, a.job_id) == created + 1000
    wait_until(lambda: server_ms(r) >= created + 5, what="the server clock to move")
    b = q.enqueue("x", {"q": "al"}, dedup=d)
    assert (b.status, b.job_id, b.state) == ("deduplicated", a.job_id, "scheduled")
    info = q.get(a.job_id)
    assert info is not None and info.payload == {"q": "al"}
    due = _due(r, q, a.job_id)
    assert due >= created + 1005  # pushed back
    assert int(r.hget(q.keys.job(a.job_id), "due")) == due  # type: ignore[arg-type]


def test_debounce_max_wait_caps_the_push(q: Queue, r: redis.Redis) -> None:
    d = Dedup(key="k", mode="debounce", delay_ms=1000, max_wait_ms=1500)
    a = q.enqueue("x", {"v": 1}, dedup=d)
    created = int(r.hget(q.keys.job(a.job_id), "c"))  # type: ignore[arg-type]
    wait_until(lambda: server_ms(r) >= created + 600, what="600 ms of server time")
    assert q.enqueue("x", {"v": 2}, dedup=d).job_id == a.job_id
    assert _due(r, q, a.job_id) == created + 1500  # capped: now + 1000 is later


def test_debounce_max_wait_lets_the_job_run(url: str, qname: str, r: redis.Redis) -> None:
    """Enqueues every few ms, each pushing the start 300 ms back: max_wait_ms still starts
    the job, with the newest payload it had by then; the next enqueue makes a new job."""
    from helpers import eventually, fast

    from streamq import Worker

    reg = Registry()
    seen: list[Any] = []

    @reg.handler("x")
    def x(job: Any) -> None:
        seen.append(job.payload)

    d = Dedup(key="k", mode="debounce", delay_ms=300, max_wait_ms=800)
    q = Queue.from_url(url, qname)

    async def main() -> str:
        async with Worker(url, [qname], reg, fast()):
            first = q.enqueue("x", {"n": 0}, dedup=d).job_id
            n = 0
            while True:
                n += 1
                res = q.enqueue("x", {"n": n}, dedup=d)
                if res.job_id != first:
                    break
                await asyncio.sleep(0.01)
                assert n < 5000, "the debounced job never started"
            await eventually(lambda: seen and q.get(first).state == "completed",  # type: ignore[union-attr]
                             what="the handler")
            return first

    first = asyncio.run(main())
    info = q.get(first)
    assert info is not None and info.state == "completed" and seen[0] == info.payload
    q.close()


# ---- keep_last --------------------------------------------------------------------------------

def test_keep_last_replaces_while_waiting_and_holds_one_follow_up(q: Queue, r: redis.Redis
                                                                  ) -> None:
    d = Dedup(key="sync:acct", mode="keep_last")
    a = q.enqueue("x", {"v": 1}, dedup=d)
    b = q.enqueue("x", {"v": 2}, dedup=d)
    assert (b.status, b.job_id) == ("deduplicated", a.job_id)
    assert q.get(a.job_id).payload == {"v": 2}  # type: ignore[union-attr]
    entry, token = start(r, q, a.job_id)
    f = q.enqueue("x", {"v": 3}, dedup=d)  # a runs: a follow-up, held
    assert f.status == "scheduled" and f.job_id != a.job_id
    assert _due(r, q, f.job_id) > server_ms(r) + 3_600_000  # held (the TTL: a day)
    g = q.enqueue("x", {"v": 4}, dedup=d)
    assert (g.status, g.job_id, g.state) == ("deduplicated", f.job_id, "scheduled")
    assert q.get(f.job_id).payload == {"v": 4}  # type: ignore[union-attr]
    assert finish(r, q, a.job_id, entry, token, "ok") == [b"completed"]
    assert _due(r, q, f.job_id) <= server_ms(r)  # released: due now
    assert holder(r, q, "sync:acct") == f.job_id


def test_keep_last_follow_up_released_by_a_dead_letter(q: Queue, r: redis.Redis) -> None:
    d = Dedup(key="k", mode="keep_last")
    a = q.enqueue("x", dedup=d)
    entry, token = start(r, q, a.job_id)
    f = q.enqueue("x", dedup=d)
    assert finish(r, q, a.job_id, entry, token, "dead", "bad") == [b"failed"]
    assert _due(r, q, f.job_id) <= server_ms(r)


# ---- TTL backstop -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["until_start", "until_finish", "keep_last"])
def test_every_key_has_a_ttl_backstop(q: Queue, r: redis.Redis, mode: str) -> None:
    d = Dedup(key="k", mode=mode, ttl_s=0.3)  # type: ignore[arg-type]
    a = q.enqueue("x", dedup=d)
    assert 0 < r.pttl(q.keys.dedup("k")) <= 300
    # (polled by reading: keep_last's and debounce's folds refresh the TTL)
    wait_until(lambda: not r.exists(q.keys.dedup("k")), what="the backstop TTL to end")
    b = q.enqueue("x", dedup=d)
    assert b.status == "queued" and b.job_id != a.job_id


def test_default_backstop_is_a_day(q: Queue, r: redis.Redis) -> None:
    q.enqueue("x", dedup=uf())
    assert 86_000_000 < r.pttl(q.keys.dedup("k")) <= 86_400_000


# ---- repeat safety ----------------------------------------------------------------------------

def _call(q: Queue, p: prod.Prepared) -> Any:
    k, a = prod.enqueue_call(q.keys, q.config, [p])
    return SCRIPTS["enqueue"](q.client, k, a)


def test_a_repeated_call_that_created_the_job_answers_the_same(q: Queue, r: redis.Redis
                                                                ) -> None:
    p = prod.prepare(q.keys, q.config, "x", {"v": 1}, dedup=uf())
    first = prod.parse_enqueue(q.config, [p], _call(q, p), retried=False)
    again = prod.parse_enqueue(q.config, [p], _call(q, p), retried=True)
    assert first == again and first[0].status == "queued"
    assert r.hget(q.keys.stats, "enqueued") == b"1"


@pytest.mark.parametrize("mode", ["until_finish", "debounce", "keep_last", "throttle"])
def test_a_repeated_folded_call_writes_nothing_new(q: Queue, r: redis.Redis, mode: str) -> None:
    kw: dict[str, Any] = {"throttle": {"ttl_s": 60},
                          "debounce": {"delay_ms": 1000, "max_wait_ms": 60_000}}.get(mode, {})
    d = Dedup(key="k", mode=mode, **kw)  # type: ignore[arg-type]
    a = q.enqueue("x", {"v": 1}, dedup=d)
    p = prod.prepare(q.keys, q.config, "x", {"v": 2}, dedup=d)
    first = _call(q, p)
    before = (r.hgetall(q.keys.job(a.job_id)), r.zscore(q.keys.delayed, a.job_id),
              r.xlen(q.keys.events), r.hgetall(q.keys.stats))
    created = int(r.hget(q.keys.job(a.job_id), "c") or 0)
    if mode == "debounce":  # a repeat later in server time would push the due time again
        wait_until(lambda: server_ms(r) >= created + 5, what="the server clock to move")
    assert _call(q, p) == first
    after = (r.hgetall(q.keys.job(a.job_id)), r.zscore(q.keys.delayed, a.job_id),
             r.xlen(q.keys.events), r.hgetall(q.keys.stats))
    assert before == after
    assert first[0] == b"deduplicated" and first[1].decode() == a.job_id


# ---- events, stats, results -------------------------------------------------------------------

def test_deduplicated_event_and_counter(q: Queue, r: redis.Redis) -> None:
    a = q.enqueue("x", dedup=uf())
    b = q.enqueue("x", dedup=uf(), job_id="second")
    assert b.job_id == a.job_id and b.reason == "until_finish"
    evs = [f for _, f in r.xrange(q.keys.events)]  # type: ignore[union-attr]
    assert {b"job": a.job_id.encode(), b"ev": b"deduplicated", b"d": b"second"} in evs
    assert r.hget(q.keys.stats, "deduplicated") == b"1"
    assert not r.exists(q.keys.job("second"))


def test_plain_jobs_are_untouched(q: Queue, r: redis.Redis) -> None:
    a = q.enqueue("x")
    assert b"dk" not in r.hgetall(q.keys.job(a.job_id))
    info = q.get(a.job_id)
    assert info is not None and info.dedup_key is None and info.dedup_mode is None


# ---- every enqueue path -----------------------------------------------------------------------

def test_enqueue_many_folds_within_and_across_calls(q: Queue) -> None:
    d = uf()
    out = q.enqueue_many([{"type": "x", "dedup": d}, {"type": "x"}, {"type": "x", "dedup": d},
                          {"type": "x", "dedup": uf("other")}])
    assert [o.status for o in out] == ["queued", "queued", "deduplicated", "queued"]
    assert out[2].job_id == out[0].job_id
    assert q.enqueue_many([{"type": "x", "dedup": d}])[0].job_id == out[0].job_id


def test_self_batching_threads_make_one_job(q: Queue) -> None:
    results: list[Any] = []
    lock = threading.Lock()

    def one() -> None:
        res = q.enqueue("x", dedup=uf())
        with lock:
            results.append(res)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({res.job_id for res in results}) == 1
    assert sorted(res.status for res in results) == ["deduplicated"] * 15 + ["queued"]


async def test_async_queue(url: str, qname: str) -> None:
    async with AsyncQueue.from_url(url, qname) as q:
        d = Dedup(key="k", mode="debounce", delay_ms=5000, max_wait_ms=10_000)
        a, b = await asyncio.gather(q.enqueue("x", {"v": 1}, dedup=d),
                                    q.enqueue("x", {"v": 2}, dedup=d))
        assert a.job_id == b.job_id
        assert sorted((a.status, b.status)) == ["deduplicated", "scheduled"]


def test_typed_task(q: Queue) -> None:
    reg = Registry()

    @reg.task("greet")
    def greet(name: str) -> str:
        return name

    t = reg.tasks["greet"] if hasattr(reg, "tasks") else greet
    a = greet.options(dedup=uf("greet:bo")).enqueue_sync(q, name="bo")
    b = greet.options(dedup=uf("greet:bo")).enqueue_sync(q, name="bo")
    assert t is not None and (a.status, b.status, b.job_id) == ("queued", "deduplicated",
                                                                a.job_id)


# ---- sharded queues ---------------------------------------------------------------------------

def test_sharded_queue_keeps_a_key_and_its_jobs_in_one_shard(url: str, qname: str,
                                                             r: redis.Redis) -> None:
    cfg = QueueConfig(shards=4)
    with Queue.from_url(url, qname, cfg) as q:
        for key in ("a", "b", "c", "d", "e"):
            d = uf(key)
            first = q.enqueue("x", dedup=d)
            assert shard_of(first.job_id, 4) == shard_of(key, 4)
            assert all(q.enqueue("x", dedup=d).job_id == first.job_id for _ in range(3))
            assert q.get(first.job_id) is not None
            assert holder(r, q, key) == first.job_id
        many = q.enqueue_many([{"type": "x", "dedup": uf("z")} for _ in range(5)])
        assert len({m.job_id for m in many}) == 1
        wrong = next(f"id{i}" for i in range(100) if shard_of(f"id{i}", 4) != shard_of("a", 4))
        with pytest.raises(InvalidDedup, match="shard"):
            q.enqueue("x", job_id=wrong, dedup=uf("a"))


# ---- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [
    {"key": ""}, {"key": "a b"}, {"key": "x" * 201}, {"key": 5},
    {"key": "k", "mode": "nope"},
    {"key": "k", "mode": "throttle"},
    {"key": "k", "mode": "debounce", "delay_ms": 100},
    {"key": "k", "mode": "debounce", "delay_ms": 100, "max_wait_ms": 50},
    {"key": "k", "mode": "debounce", "delay_ms": 0, "max_wait_ms": 50},
    {"key": "k", "mode": "until_start", "delay_ms": 100},
    {"key": "k", "ttl_s": 0}, {"key": "k", "ttl_s": -1}, {"key": "k", "ttl_s": True},
])
def test_bad_dedup_is_refused(kw: dict[str, Any]) -> None:
    with pytest.raises(InvalidDedup) as err:
        Dedup(**kw)
    assert isinstance(err.value, InvalidArgument)


def test_bad_dedup_at_enqueue_writes_nothing(q: Queue, r: redis.Redis) -> None:
    d = Dedup(key="k", mode="debounce", delay_ms=10, max_wait_ms=20)
    with pytest.raises(InvalidDedup, match="delay"):
        q.enqueue("x", dedup=d, delay=5)
    with pytest.raises(InvalidDedup, match=r"streamq\.Dedup"):
        q.enqueue("x", dedup={"key": "k"})
    assert r.hget(q.keys.stats, "enqueued") is None


def test_a_dedup_key_of_the_wrong_type_refuses_the_call(q: Queue, r: redis.Redis) -> None:
    r.hset(q.keys.dedup("k"), "a", "b")
    with pytest.raises(Exception, match="WRONGTYPE"):
        q.enqueue_many([{"type": "x"}, {"type": "x", "dedup": uf()}])
    assert r.xlen(q.keys.stream) == 0  # nothing of the call was written


# ---- admin and dashboard show the key ----------------------------------------------------------

async def test_admin_and_dashboard_show_the_dedup_key(url: str, qname: str) -> None:
    import httpx

    from streamq.dashboard import DashboardConfig, create_app

    with Queue.from_url(url, qname) as q:
        a = q.enqueue("x", dedup=Dedup(key="user:<42>", mode="keep_last"))
    info = Admin.from_url(url).job(qname, a.job_id)
    assert (info.dedup_key, info.dedup_mode) == ("user:<42>", "keep_last")
    app = create_app(url, config=DashboardConfig(queues=(qname,), poll_interval_s=0.1))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://dash") as c:
        page = await c.get(f"/job?q={qname}&id={a.job_id}")
    assert page.status_code == 200
    assert "dedup key" in page.text and "user:&lt;42&gt;" in page.text
    assert "keep last" in page.text


# ---- with a real worker (fetch, claim or hand-off, whichever starts the job) ------------------

async def test_with_a_worker_until_start_and_until_finish(url: str, qname: str,
                                                          r: redis.Redis) -> None:
    from helpers import eventually, running

    reg = Registry()
    gate = threading.Event()

    @reg.handler("slow")
    def slow(job: Any) -> None:
        gate.wait(30)

    q = Queue.from_url(url, qname)
    try:
        async with running(url, qname, reg):
            s = Dedup(key="s", mode="until_start")
            f = uf("f")
            a = q.enqueue("slow", dedup=s)
            b = q.enqueue("slow", dedup=f)
            await eventually(lambda: all(q.get(j).state == "active"  # type: ignore[union-attr]
                                         for j in (a.job_id, b.job_id)), what="both running")
            assert holder(r, q, "s") is None  # freed by the start
            assert holder(r, q, "f") == b.job_id  # held while it runs
            again = q.enqueue("slow", dedup=f)
            assert (again.status, again.job_id, again.state) == ("deduplicated", b.job_id,
                                                                 "active")
            gate.set()
            await eventually(lambda: q.get(b.job_id).state == "completed",  # type: ignore[union-attr]
                             what="b to complete")
            assert holder(r, q, "f") is None
            c = q.enqueue("slow", dedup=f)
            assert c.status == "queued" and c.job_id != b.job_id
            await eventually(lambda: q.get(c.job_id).state == "completed",  # type: ignore[union-attr]
                             what="c to complete")
    finally:
        gate.set()
        q.close()


@pytest.mark.cluster
def test_sharded_queue_on_redis_cluster(cluster_url: str) -> None:
    """Each shard is its own slot: a key's jobs, its record and the key itself share the
    shard's hash tag, so the enqueue script never crosses slots."""
    import uuid

    cfg = QueueConfig(shards=3)
    with Queue.from_url(cluster_url, f"c-{uuid.uuid4().hex[:10]}", cfg) as q:
        firsts = {}
        for key in ("a", "b", "c", "d"):
            firsts[key] = q.enqueue("x", {"v": 1}, dedup=Dedup(key=key, mode="keep_last"))
        out = q.enqueue_many([{"type": "x", "payload": {"v": 2},
                               "dedup": Dedup(key=key, mode="keep_last")}
                              for key in ("a", "b", "c", "d")])
        assert [o.job_id for o in out] == [firsts[k].job_id for k in ("a", "b", "c", "d")]
        assert all(o.status == "deduplicated" for o in out)
        assert all(q.get(f.job_id).payload == {"v": 2}  # type: ignore[union-attr]
                   for f in firsts.values())
