"""Producer API: enqueue (now, delayed, dedup, bulk), validation, cancel, get, result, waiting."""

from __future__ import annotations

import asyncio
import datetime as dt
import math
import os
import threading
import time
from typing import Any

import pytest
import redis
from helpers import eventually, record
from sec_support import keys_of

from streamq import (
    AsyncQueue,
    InvalidArgument,
    InvalidJobId,
    InvalidQueueName,
    JobFailed,
    JobNotFound,
    Keys,
    MsgpackSerde,
    PayloadTooLarge,
    Queue,
    QueueConfig,
    QueueFull,
    ResultNotReady,
    SerializationError,
    WaitTimeout,
)
from streamq._core.scripts import SCRIPTS
from streamq._producer import prepare as prod


def test_enqueue_now_writes_record_and_stream_entry(q: Queue, r: redis.Redis) -> None:
    res = q.enqueue("email.send", {"to": "a@example.com"}, job_id="welcome-42")
    assert (res.job_id, res.status, res.state) == ("welcome-42", "queued", "queued")
    k = Keys(q.name)
    entries: Any = r.xrange(k.stream)
    assert len(entries) == 1 and entries[0][1] == {b"id": b"welcome-42"}
    rec = record(r, k.job("welcome-42"))
    assert rec[b"state"] == b"queued" and rec[b"entry"] == entries[0][0]
    info = q.get("welcome-42")
    assert info is not None and info.payload == {"to": "a@example.com"}
    assert info.type == "email.send" and info.attempts == 0 and info.state == "queued"


def test_generated_ids_are_unique(q: Queue) -> None:
    ids = {q.enqueue("t").job_id for _ in range(50)}
    assert len(ids) == 50


def test_duplicate_answers_existing_state_and_writes_nothing(q: Queue, r: redis.Redis) -> None:
    q.enqueue("t", {"v": 1}, job_id="d1")
    dup = q.enqueue("t", {"v": 2}, job_id="d1")
    assert (dup.status, dup.state) == ("duplicate", "queued")
    assert r.xlen(Keys(q.name).stream) == 1
    info = q.get("d1")
    assert info is not None and info.payload == {"v": 1}


def test_duplicate_of_completed_job_returns_its_result(q: Queue, r: redis.Redis) -> None:
    q.enqueue("t", job_id="done-1")
    r.hset(Keys(q.name).job("done-1"), mapping={"s": "c", "r": b'{"ok":1}'})
    dup = q.enqueue("t", job_id="done-1")
    assert dup.status == "duplicate" and dup.state == "completed" and dup.result == {"ok": 1}


def test_delay_schedules_on_server_clock(q: Queue, r: redis.Redis) -> None:
    before = r.time()
    res = q.enqueue("t", job_id="later", delay=30)
    assert res.status == "scheduled"
    k = Keys(q.name)
    due = r.zscore(k.delayed, "later")
    now_ms = before[0] * 1000 + before[1] // 1000
    assert due is not None and now_ms + 30_000 <= due <= now_ms + 31_000
    assert r.xlen(k.stream) == 0


def test_run_at_in_the_past_queues_now_and_future_schedules(q: Queue) -> None:
    past = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    future = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    assert q.enqueue("t", run_at=past).status == "queued"
    res = q.enqueue("t", run_at=future)
    info = q.get(res.job_id)
    assert res.status == "scheduled" and info is not None and info.due_at is not None
    assert abs((info.due_at - future).total_seconds()) < 0.01


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"job_id": ""}, InvalidJobId),
        ({"job_id": "has space"}, InvalidJobId),
        ({"job_id": "x" * 201}, InvalidJobId),
        ({"job_id": "{brace}"}, InvalidJobId),
        ({"delay": -1}, InvalidArgument),
        ({"delay": math.nan}, InvalidArgument),
        ({"delay": math.inf}, InvalidArgument),
        ({"delay": True}, InvalidArgument),
        ({"delay": "10"}, InvalidArgument),
        ({"run_at": dt.datetime(2030, 1, 1)}, InvalidArgument),  # naive
        ({"delay": 1, "run_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)},
         InvalidArgument),
        ({"result_ttl": -0.5}, InvalidArgument),  # (0 is fire-and-forget)
        ({"result_ttl": -5}, InvalidArgument),
        ({"result_ttl": math.inf}, InvalidArgument),
        ({"result_ttl": math.nan}, InvalidArgument),
        ({"max_attempts": 0}, InvalidArgument),
        ({"max_attempts": True}, InvalidArgument),
        ({"deadline": 0}, InvalidArgument),
        ({"headers": {"a": 1}}, InvalidArgument),
        ({"version": 0}, InvalidArgument),
    ],
)
def test_bad_options_raise_typed_errors_and_write_nothing(
    q: Queue, r: redis.Redis, options: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        q.enqueue("t", {"x": 1}, **options)
    assert keys_of(r, q.name) == set()


@pytest.mark.parametrize("job_type", ["", "has space", "x" * 201, None])
def test_bad_job_type_is_rejected(q: Queue, job_type: Any) -> None:
    with pytest.raises(InvalidArgument):
        q.enqueue(job_type)


def test_bad_queue_names_are_rejected(url: str) -> None:
    for name in ["", "a{b}", "with space", "x" * 129]:
        with pytest.raises(InvalidQueueName):
            Queue.from_url(url, name)


def test_unserialisable_payload_is_a_typed_error(q: Queue, r: redis.Redis) -> None:
    with pytest.raises(SerializationError):
        q.enqueue("t", {"x": object()})
    with pytest.raises(SerializationError):
        q.enqueue("t", {"x": math.nan})
    assert keys_of(r, q.name) == set()


def test_payload_size_limit(url: str, qname: str, r: redis.Redis) -> None:
    queue = Queue.from_url(url, qname, QueueConfig(max_payload_bytes=1000))
    queue.enqueue("t", "a" * 500)
    with pytest.raises(PayloadTooLarge, match="max_payload_bytes"):
        queue.enqueue("t", "a" * 2000)
    assert r.xlen(queue.keys.stream) == 1


def test_max_depth_rejects_with_queue_full(url: str, qname: str) -> None:
    queue = Queue.from_url(url, qname, QueueConfig(max_depth=3))
    for i in range(2):
        queue.enqueue("t", job_id=f"n{i}")
    queue.enqueue("t", job_id="d", delay=60)  # delayed jobs count too
    with pytest.raises(QueueFull):
        queue.enqueue("t", job_id="over")
    assert queue.get("over") is None
    results = queue.enqueue_many([{"type": "t", "job_id": "b1"}, {"type": "t", "job_id": "n0"}])
    assert [x.status for x in results] == ["rejected", "duplicate"]
    assert results[0].reason == "queue full"


def test_enqueue_many_spans_batches_and_reports_each_job(q: Queue, r: redis.Redis) -> None:
    jobs: list[dict[str, Any]] = [{"type": "t", "payload": {"i": i}, "job_id": f"b{i}"}
                                  for i in range(2500)]
    jobs.append({"type": "t", "job_id": "b7"})  # duplicate inside the same call
    jobs.append({"type": "t", "job_id": "late", "delay": 60})
    results = q.enqueue_many(jobs)
    assert len(results) == 2502
    assert sum(x.status == "queued" for x in results) == 2500
    assert results[2500].status == "duplicate" and results[2501].status == "scheduled"
    assert r.xlen(q.keys.stream) == 2500 and r.zcard(q.keys.delayed) == 1


def test_enqueue_many_same_id_twice_in_one_fresh_batch(q: Queue, r: redis.Redis) -> None:
    # a batch of new ids skips the per-job existence check: a repeated id must still be caught
    results = q.enqueue_many([{"type": "t", "job_id": "twice", "payload": 1},
                              {"type": "t", "job_id": "other"},
                              {"type": "t", "job_id": "twice", "payload": 2}])
    assert [x.status for x in results] == ["queued", "queued", "duplicate"]
    assert r.xlen(q.keys.stream) == 2
    info = q.get("twice")
    assert info is not None and info.payload == 1


def test_enqueue_many_validates_everything_before_writing(q: Queue, r: redis.Redis) -> None:
    with pytest.raises(InvalidArgument, match="job #1"):
        q.enqueue_many([{"type": "t"}, {"type": "t", "delay": -1}])
    with pytest.raises(InvalidArgument, match="unknown keys"):
        q.enqueue_many([{"type": "t", "paylod": 1}])
    assert keys_of(r, q.name) == set()


def test_cancel_queued_scheduled_and_finished(q: Queue, r: redis.Redis) -> None:
    q.enqueue("t", job_id="c-queued")
    q.enqueue("t", job_id="c-sched", delay=60)
    res = q.cancel("c-queued")
    assert res.cancelled and res.state == "queued"
    assert r.xlen(q.keys.stream) == 0
    res = q.cancel("c-sched")
    assert res.cancelled and res.state == "scheduled"
    assert r.zcard(q.keys.delayed) == 0
    again = q.cancel("c-sched")
    assert not again.cancelled and again.state == "cancelled" and "only" in again.reason
    missing = q.cancel("nope")
    assert not missing.cancelled and "not found" in missing.reason
    info = q.get("c-queued")
    assert info is not None and info.state == "cancelled"
    with pytest.raises(JobFailed) as exc:
        q.result("c-queued")
    assert exc.value.state == "cancelled"


def test_result_of_unknown_and_unfinished_jobs(q: Queue) -> None:
    assert q.get("missing") is None
    with pytest.raises(JobNotFound):
        q.result("missing")
    q.enqueue("t", job_id="pending")
    with pytest.raises(ResultNotReady):
        q.result("pending")
    with pytest.raises(WaitTimeout):
        q.result("pending", timeout=0.1)


def test_enqueue_and_wait_times_out_without_a_worker(q: Queue) -> None:
    with pytest.raises(WaitTimeout) as exc:
        q.enqueue_and_wait("t", {"x": 1}, job_id="w1", timeout=0.2)
    assert exc.value.job_id == "w1"
    info = q.get("w1")
    assert info is not None and info.state == "queued"  # the job goes on


def test_retried_enqueue_reports_the_original_outcome(q: Queue) -> None:
    """A client retry after a dropped reply must not report the job as a duplicate."""
    prepared = [prod.prepare(q.keys, q.config, "t", {"a": 1}, job_id="retry-me")]
    keys, args = prod.enqueue_call(q.keys, q.config, prepared)
    SCRIPTS["enqueue"](q.client, keys, args)  # the first try went through; its reply was lost
    reply = SCRIPTS["enqueue"](q.client, keys, args)
    (res,) = prod.parse_enqueue(q.config, prepared, reply, retried=True)
    assert (res.status, res.state) == ("queued", "queued")
    other = q.enqueue("t", {"a": 1}, job_id="retry-me")  # a genuinely second enqueue
    assert other.status == "duplicate"


async def test_async_queue_same_api(url: str, qname: str) -> None:
    async with AsyncQueue.from_url(url, qname) as aq:
        res = await aq.enqueue("t", {"n": 1}, job_id="a1")
        assert res.status == "queued"
        assert (await aq.enqueue("t", job_id="a1")).status == "duplicate"
        results = await aq.enqueue_many([{"type": "t"} for _ in range(1500)])
        assert all(x.status == "queued" for x in results)
        info = await aq.get("a1")
        assert info is not None and info.payload == {"n": 1}
        assert (await aq.cancel("a1")).cancelled
        with pytest.raises(WaitTimeout):
            await aq.enqueue_and_wait("t", timeout=0.1)
        with pytest.raises(JobNotFound):
            await aq.result("nope")


def test_bulk_enqueue_survives_a_flushed_script_cache(q: Queue, r: redis.Redis) -> None:
    """A restarted Redis has no scripts: the pipelined path loads and resends (NOSCRIPT)."""
    r.script_flush()
    results = q.enqueue_many([{"type": "t", "job_id": f"n{i}"} for i in range(2500)])
    assert [x.status for x in results] == ["queued"] * 2500
    r.script_flush()
    assert q.enqueue("t", job_id="single").status == "queued"
    assert r.xlen(q.keys.stream) == 2501


@pytest.mark.parametrize("use_async", [False, True])
def test_bulk_enqueue_resends_only_the_batches_that_met_noscript(
        q: Queue, r: redis.Redis, url: str, monkeypatch: pytest.MonkeyPatch,
        use_async: bool) -> None:
    """After a restart, another producer can load the script between two batches of one
    pipeline: the first meets NOSCRIPT, the later ones run. Only the first is sent again,
    so the caller's own jobs are never answered as 'duplicate' (and none is written twice)."""
    script = SCRIPTS["enqueue"]
    packed = script._packed
    sent: list[int] = []

    def first_batch_unknown(calls: Any) -> list[bytes]:
        out = packed(calls)
        sent.append(len(out))
        if len(sent) == 1:  # as if the script was loaded only after the first call ran
            out[0] = out[0].replace(script.sha.encode(), b"0" * 40)
        return out

    r.script_load(script.source)
    monkeypatch.setattr(script, "_packed", first_batch_unknown)
    jobs = [{"type": "t", "job_id": f"p{i}"} for i in range(2500)]
    if use_async:
        async def go() -> list[Any]:
            async with AsyncQueue.from_url(url, q.name) as aq:
                return await aq.enqueue_many(jobs)
        results = asyncio.run(go())
    else:
        results = q.enqueue_many(jobs)
    assert [x.status for x in results] == ["queued"] * 2500
    assert sent == [3, 1]  # three batches, then the one that met NOSCRIPT
    assert r.xlen(q.keys.stream) == 2500


def test_row_envelope_template_builds_the_same_bytes_as_prepare() -> None:
    """Spark's fast path wraps JSON text in an envelope template: byte for byte what the
    serde makes of the same job (so dedup's 'mine' and every reader see one format)."""
    import json

    keys, cfg = Keys("tpl"), QueueConfig()
    tpl = prod.row_template(cfg, "image.process", 1795396407266)
    assert tpl is not None
    payloads: list[Any] = [{"path": 'a"\\é', "n": None, "l": [1, 2.5]}, None, [], "x", 3]
    for payload in payloads:
        text = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        fast = prod.prepare_row_json(keys, cfg, tpl, "image.process", "row-1", text, 2.5)
        slow = prod.prepare_row(keys, cfg, "image.process", payload, "row-1", 2.5,
                                1795396407266)
        assert fast == slow
    assert prod.row_template(QueueConfig(serde=MsgpackSerde()), "t", 1) is None
    with pytest.raises(InvalidArgument):
        prod.prepare_row_json(keys, cfg, tpl, "t", "bad id", "1", None)


async def test_concurrent_waiters_share_one_subscription(url: str, qname: str,
                                                        r: redis.Redis) -> None:
    """enqueue_and_wait opens no subscription per call: every waiter of a queue object is woken
    through one channel and one connection."""
    from streamq import AsyncQueue, Job, Registry, Worker

    reg = Registry()

    @reg.handler("double")
    async def double(job: Job) -> int:
        await asyncio.sleep(0.05)
        return int(job.payload) * 2

    async with AsyncQueue.from_url(url, qname) as aq, Worker(url, [qname], reg):
        waits = [asyncio.create_task(aq.enqueue_and_wait("double", i, timeout=30))
                 for i in range(500)]
        pattern = f"streamq:{{{qname}}}:wait:*"  # (the worker listens on ':cancel')
        await eventually(lambda: r.pubsub_channels(pattern), what="the shared subscription")
        assert await asyncio.gather(*waits) == [2 * i for i in range(500)]
        channels: Any = r.pubsub_channels(pattern)
        assert len(channels) == 1 and b":wait:" in channels[0]
        numsub: Any = r.pubsub_numsub(channels[0])
        assert numsub[0][1] == 1  # one subscriber connection for 500 waiters


def test_sync_waiters_from_many_threads_share_one_subscription(url: str, qname: str,
                                                               r: redis.Redis) -> None:
    from concurrent.futures import ThreadPoolExecutor

    q = Queue.from_url(url, qname)
    with echo_worker(url, qname), ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda i: q.enqueue_and_wait("echo", i, timeout=30),
                                range(200)))
        channels: Any = r.pubsub_channels(f"streamq:{{{qname}}}:wait:*")
        assert len(channels) == 1
    assert results == list(range(200))
    q.close()
    assert r.pubsub_channels(f"streamq:{{{qname}}}:wait:*") == []  # closed with the queue


def test_sync_waiters_read_the_subscription_themselves_and_hand_it_over(
        url: str, qname: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sync Queue starts no thread for its waiters: the waiting callers read the shared
    subscription in turn, each handing it over when its own message came. Every one of 32
    threads' 300 calls returns from its message (the result rides in it), none from a
    re-read of the record, which a waiter left without a reader would fall back to."""
    from concurrent.futures import ThreadPoolExecutor

    q = Queue.from_url(url, qname)
    reads: list[str] = []
    info = q._info
    def counted(job_id: str) -> Any:
        reads.append(job_id)
        return info(job_id)

    monkeypatch.setattr(q, "_info", counted)
    with echo_worker(url, qname):
        before = {t.name for t in threading.enumerate()}
        assert q.enqueue_and_wait("echo", -1, timeout=30) == -1
        assert {t.name for t in threading.enumerate()} - before == set()
        with ThreadPoolExecutor(32) as pool:
            results = list(pool.map(lambda i: q.enqueue_and_wait("echo", i, timeout=30),
                                    range(300)))
    assert results == list(range(300))
    assert reads == []
    q.close()


def test_a_sync_waiter_survives_its_subscription_being_killed(url: str, qname: str,
                                                              r: redis.Redis) -> None:
    q = Queue.from_url(url, qname)
    with echo_worker(url, qname):
        assert q.enqueue_and_wait("echo", 1, timeout=30) == 1
        r.client_kill_filter(_type="pubsub")  # every subscriber connection of this server
        assert q.enqueue_and_wait("echo", 2, timeout=30) == 2  # found closed, made again
        channels: Any = r.pubsub_channels(f"streamq:{{{qname}}}:wait:*")
        assert len(channels) == 1 and r.pubsub_numsub(channels[0])[0][1] == 1
    q.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_subscribes_on_its_own_connection(url: str, qname: str,
                                                         r: redis.Redis) -> None:
    """A queue used before a fork (a pre-forking server): the child's waits read a
    subscription of their own, never the parent's socket; the parent's go on working."""
    q = Queue.from_url(url, qname)
    with echo_worker(url, qname):
        assert q.enqueue_and_wait("echo", "parent", timeout=30) == "parent"
        channel = q._waiters.channel  # type: ignore[union-attr]
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only if all went right
            ok = False
            try:
                ok = q.enqueue_and_wait("echo", "child", timeout=30) == "child" and \
                    redis.Redis.from_url(url).pubsub_numsub(channel)[0][1] == 2
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert q.enqueue_and_wait("echo", "again", timeout=30) == "again"
    q.close()


def test_a_lone_callers_connection_killed_is_replaced(url: str, qname: str,
                                                      r: redis.Redis) -> None:
    """Script calls of a blocking Queue go over one kept connection while no other thread
    uses it; killed under it, the call is retried on a new one and the job is there."""
    q = Queue.from_url(url, qname)
    from streamq._core.scripts import SyncKept

    q.enqueue("t", job_id="a")
    kept = SyncKept.of(q.client)
    assert kept is not None and kept.conn is not None
    kept.conn.send_command("CLIENT", "ID")
    first = kept.conn.read_response()
    r.client_kill_filter(_id=first)
    assert q.enqueue("t", job_id="b").status == "queued"
    assert kept.conn is not None
    kept.conn.send_command("CLIENT", "ID")
    assert kept.conn.read_response() != first  # a new connection
    assert q.enqueue("t", job_id="c").status == "queued"
    assert {q.get(j).state for j in "abc"} == {"queued"}  # type: ignore[union-attr]
    q.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_enqueues_on_its_own_connection(url: str, qname: str) -> None:
    """Parent and child enqueue at the same time through one Queue object made before the
    fork: each reads its own answers (the child's ids exist already: 'duplicate'; the
    parent's are new: 'queued')."""
    q = Queue.from_url(url, qname)
    q.enqueue_many([{"type": "t", "job_id": f"old-{i}"} for i in range(300)])
    pid = os.fork()
    if pid == 0:
        ok = False
        try:
            ok = all(q.enqueue("t", job_id=f"old-{i}").status == "duplicate"
                     for i in range(300))
        finally:
            os._exit(0 if ok else 1)
    answers = [q.enqueue("t", job_id=f"new-{i}").status for i in range(300)]
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert answers == ["queued"] * 300
    q.close()


async def test_a_waiter_survives_its_subscription_being_killed(url: str, qname: str,
                                                               r: redis.Redis) -> None:
    from streamq import AsyncQueue, Job, Registry, Worker

    reg = Registry()
    gate = asyncio.Event()

    @reg.handler("slow")
    async def slow(job: Job) -> str:
        await gate.wait()
        return "done"

    async with AsyncQueue.from_url(url, qname) as aq, Worker(url, [qname], reg):
        wait = asyncio.create_task(aq.enqueue_and_wait("slow", timeout=30))
        await asyncio.sleep(0.1)
        r.client_kill_filter(_type="pubsub")  # every subscriber connection of this server
        gate.set()
        assert await wait == "done"
        assert await aq.enqueue_and_wait("slow", timeout=30) == "done"  # subscribed again


def test_a_waiter_of_the_previous_release_is_still_woken(url: str, qname: str,
                                                         r: redis.Redis) -> None:
    """Rolling upgrade: an old producer subscribes to the job's own done channel; the new
    scripts publish '<state> <id>' there, which wakes it like before."""
    q = Queue.from_url(url, qname)
    ps = r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    ps.subscribe(q.keys.done_channel("old-1"))
    q.enqueue("echo", 7, job_id="old-1", notify=q.keys.done_channel("old-1"))
    with echo_worker(url, qname):
        msg = None
        for _ in range(100):
            msg = ps.get_message(timeout=0.1)
            if msg:
                break
    assert msg is not None and msg["data"] == b"completed old-1"
    assert q.result("old-1") == 7
    ps.close()
    q.close()


def test_small_results_ride_in_the_waiter_message(url: str, qname: str,
                                                   r: redis.Redis) -> None:
    """A completed job's result of at most 1 KB comes in the waiter message (one read of the
    record less per enqueue_and_wait); a bigger one, and every message to a channel of the
    previous release (a plain hex tag), stays '<state> <id>'. Each waiter gets its result."""
    q = Queue.from_url(url, qname)
    new_channel = q.keys.waiter_channel("r" + "ab" * 8)
    old_channel = q.keys.waiter_channel("ab" * 8)
    ps = r.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    ps.subscribe(new_channel, old_channel)
    q.enqueue("echo", "hi", job_id="small", notify=new_channel)
    q.enqueue("echo", None, job_id="none", notify=new_channel)
    q.enqueue("echo", "x" * 2000, job_id="big", notify=new_channel)
    q.enqueue("echo", "hi", job_id="old", notify=old_channel)
    got: dict[bytes, bytes] = {}
    with echo_worker(url, qname):
        deadline = time.monotonic() + 10
        while len(got) < 4 and time.monotonic() < deadline:
            msg = ps.get_message(timeout=0.1)
            if msg:
                got[msg["data"].split(b" ")[1]] = msg["data"]
        assert got == {b"small": b'completed small ="hi"', b"none": b"completed none =",
                       b"big": b"completed big", b"old": b"completed old"}
        assert q.enqueue_and_wait("echo", "hi", timeout=30) == "hi"
        assert q.enqueue_and_wait("echo", None, timeout=30) is None
        assert q.enqueue_and_wait("echo", "x" * 2000, timeout=30) == "x" * 2000
    ps.close()
    q.close()


def echo_worker(url: str, qname: str) -> Any:
    """A worker with an ``echo`` handler on a thread of its own (for the sync tests)."""
    from helpers import fast
    from sec_support import ThreadWorker

    from streamq import Job, Registry

    reg = Registry()

    @reg.handler("echo")
    async def echo(job: Job) -> Any:
        return job.payload

    return ThreadWorker(url, [qname], reg, fast())


def _evalsha_calls(r: redis.Redis) -> int:
    stats: Any = r.info("commandstats")
    return int(stats.get("cmdstat_evalsha", {}).get("calls", 0))


async def test_concurrent_enqueues_gather_into_few_script_calls(url: str, qname: str,
                                                                r: redis.Redis) -> None:
    """100 coroutines enqueueing at once share script calls; each gets its own job's answer,
    a refusal included (a full queue fails only the jobs it refuses)."""
    from streamq import AsyncQueue, QueueFull

    async with AsyncQueue.from_url(url, qname, QueueConfig(max_depth=150)) as aq:
        await aq.enqueue("t", job_id="dup")
        before = _evalsha_calls(r)

        async def one(i: int) -> Any:
            try:
                return await aq.enqueue("t", {"i": i}, job_id="dup" if i == 7 else f"j{i}")
            except QueueFull as exc:
                return exc

        results = await asyncio.gather(*(one(i) for i in range(200)))
        calls = _evalsha_calls(r) - before
    assert calls <= 20, f"{calls} script calls for 200 concurrent enqueues"
    assert results[7].status == "duplicate"
    accepted = [x for x in results if not isinstance(x, QueueFull) and x.status == "queued"]
    refused = [x for x in results if isinstance(x, QueueFull)]
    assert len(accepted) == 149 and len(refused) == 50  # 150 deep: "dup" and 149 new ones
    assert {x.job_id for x in accepted} <= {f"j{i}" for i in range(200)}
    assert r.xlen(Keys(qname).stream) == 150


def test_concurrent_sync_enqueues_from_threads_gather_too(url: str, qname: str,
                                                          r: redis.Redis) -> None:
    from concurrent.futures import ThreadPoolExecutor

    q = Queue.from_url(url, qname)
    q.enqueue("t", job_id="warm")
    before = _evalsha_calls(r)
    with ThreadPoolExecutor(32) as pool:
        results = list(pool.map(lambda i: q.enqueue("t", i, job_id=f"s{i}"), range(640)))
    calls = _evalsha_calls(r) - before
    q.close()
    assert [x.job_id for x in results] == [f"s{i}" for i in range(640)]
    assert all(x.status == "queued" for x in results)
    assert calls < 640, "threads enqueueing at once must share script calls"
    assert r.xlen(Keys(qname).stream) == 641


async def test_a_fire_and_forget_job_leaves_nothing_behind(url: str, qname: str,
                                                           r: redis.Redis) -> None:
    from helpers import fast

    from streamq import Job, Registry, Worker

    reg = Registry()
    ran: list[str] = []

    @reg.handler("ping")
    async def ping(job: Job) -> str:
        ran.append(job.id)
        return "pong"

    q = Queue.from_url(url, qname)
    q.enqueue("ping", job_id="ff", result_ttl=0)
    q.enqueue("ping", job_id="kept")
    with pytest.raises(InvalidArgument, match="result_ttl=0"):
        q.enqueue_and_wait("ping", timeout=1, result_ttl=0)
    async with Worker(url, [qname], reg, fast()):
        await eventually(lambda: q.get("kept") is not None
                         and q.get("kept").state == "completed"  # type: ignore[union-attr]
                         and "ff" in ran, what="both jobs to run")
        await eventually(lambda: not r.exists(q.keys.job("ff")), what="the record deleted")
    assert r.xlen(q.keys.stream) == 0 and q.get("ff") is None
    q.close()


def test_enqueue_calls_of_two_configs_on_one_queue_keep_their_own_settings() -> None:
    """enqueue_call builds its fixed keys and arguments once per config object and shard:
    a second config on the same queue (other events, depth, group defaults) gets its own."""
    keys = Keys("cfgs")
    a = QueueConfig()
    b = QueueConfig(events_maxlen=0, max_depth=7, group_concurrency=3)
    p = prod.prepare_plain(keys, a, "t", None, {})
    for cfg in (a, b, a):
        k, args = prod.enqueue_call(keys, cfg, [p], handoff=True)
        assert args[:3] == [cfg.events_arg, cfg.max_depth, keys.wake_channel]
        assert cfg.group_arg in args
        assert k[-3:] == [keys.tickets, keys.paused, keys.dead]
    assert prod.enqueue_call(keys, b, [p])[1][0] == "0"
    other = keys.of_shard(1)
    k, _ = prod.enqueue_call(keys, a, [p._replace(shard=1)])
    assert k[0] == other.stream
