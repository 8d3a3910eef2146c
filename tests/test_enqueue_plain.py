"""enqueue.lua's plain batch (its header's F): a compact call whose jobs are all new, queued now,
without groups, priorities, dedup, search or a depth limit is written without the general
path's per-job work. It must write and answer exactly what the general path writes: the same
records (the entry id encoded in 'e'), stream entries, events, counts and hand-offs; a batch
that is not plain (an id twice, a record that exists, a key of the wrong type) is left to the
general path, or refused with nothing written."""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
import redis
from helpers import eventually, fast, records_untimed

from streamq import Job, Keys, Queue, QueueConfig, Registry, ScriptError, SearchConfig, Worker
from streamq._core.config import ALL_EVENTS
from streamq._core.scripts import SCRIPTS
from streamq._producer import prepare

# fields whose values depend on the time of the call (entry ids, creation and due times)
TIMED = {b"e", b"c", b"due", b"deadline"}


def _enc(entry: bytes) -> bytes:
    """_lib.lua's enc_entry: '<ms>-<seq>' as '<ms><seq, 3 digits>' when seq < 1000."""
    ms, seq = entry.split(b"-")
    return ms + seq.rjust(3, b"0") if len(seq) <= 3 else entry


def _batch(prefix: str, n: int, **opts: Any) -> list[dict[str, Any]]:
    return [{"type": "t", "payload": {"i": i}, "job_id": f"{prefix}{i}", **opts}
            for i in range(n)]


def _entries_match_records(r: redis.Redis, q: Queue) -> list[bytes]:
    """Every stream entry's job record names that entry ('e'); the entry ids in order."""
    ids: list[bytes] = []
    entries: Any = r.xrange(q.keys.stream)
    for eid, fields in entries:
        rec: Any = r.hget(q.keys.job(fields[b"id"].decode()), "e")
        assert rec == _enc(eid), (eid, rec)
        ids.append(eid)
    return ids


def _seven(r: redis.Redis) -> bool:
    info: Any = r.info("server")
    return tuple(int(x) for x in str(info["redis_version"]).split(".")[:2]) >= (7, 0)


def test_a_plain_batch_counts_its_entry_ids_from_one_ms(url: str, r: redis.Redis,
                                                        qname: str) -> None:
    """One call of 1,000 jobs: its entries share the first one's ms and count up (Redis 7.0+:
    XADD '<ms>-*'), and each record's 'e' is its entry's id, encoded."""
    if not _seven(r):
        pytest.skip("XADD '<ms>-*' needs Redis 7.0")
    with Queue.from_url(url, qname) as q:
        res = q.enqueue_many(_batch("j", prepare.MAX_BATCH))
        assert {x.status for x in res} == {"queued"}
        ids = _entries_match_records(r, q)
        assert len(ids) == prepare.MAX_BATCH
        assert len({e.split(b"-")[0] for e in ids}) == 1
        first = int(ids[0].split(b"-")[1])
        assert [int(e.split(b"-")[1]) for e in ids] == list(range(first, first + len(ids)))


def test_sequence_numbers_past_999_keep_the_entry_id_as_it_is(url: str, r: redis.Redis,
                                                              qname: str) -> None:
    """A stream whose last id is ahead of the clock at sequence 990: '*' continues it; from
    sequence 1000 on 'e' holds the id as it is (enc_entry's other form)."""
    with Queue.from_url(url, qname) as q:
        ahead = int(r.time()[0]) * 1000 + 3_600_000
        r.xadd(q.keys.stream, {"id": "x"}, id=f"{ahead}-990")
        r.xtrim(q.keys.stream, maxlen=0)  # (the last id stays)
        res = q.enqueue_many(_batch("j", 30))
        assert {x.status for x in res} == {"queued"}
        ids = _entries_match_records(r, q)
        assert [int(e.split(b"-")[1]) for e in ids] == list(range(991, 1021))
        assert r.hget(q.keys.job("j29"), "e") == f"{ahead}-1020".encode()


SHAPES: dict[str, tuple[dict[str, Any], QueueConfig]] = {
    "plain": ({}, QueueConfig()),
    "options": ({"max_attempts": 3, "result_ttl": 60, "headers": {"h": "v"}}, QueueConfig()),
    "deadline": ({"deadline": 30}, QueueConfig()),
    "events": ({}, QueueConfig(event_kinds=ALL_EVENTS)),
    "no-handoff": ({}, QueueConfig(handoff=False)),
    "delay-0": ({"delay": 0}, QueueConfig()),
    "delayed": ({"delay": 30, "max_attempts": 2}, QueueConfig()),
    "delayed-events": ({"delay": 30}, QueueConfig(event_kinds=ALL_EVENTS)),
    "run-at": ({"run_at": dt.datetime(2300, 1, 1, tzinfo=dt.UTC)}, QueueConfig()),
    "run-at-past": ({"run_at": dt.datetime(2001, 1, 1, tzinfo=dt.UTC)}, QueueConfig()),
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_plain_batch_writes_what_the_general_path_writes(
        url: str, r: redis.Redis, qname: str, shape: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    opts, cfg = SHAPES[shape]
    n = 25
    with Queue.from_url(url, qname + "p", cfg) as qp, Queue.from_url(url, qname + "g", cfg) as qg:
        plain = qp.enqueue_many(_batch("j", n, **opts))
        again = qp.enqueue_many(_batch("j", n, **opts))  # a repeat: the general path
        with monkeypatch.context() as m:  # the full form: the general path
            m.setattr(prepare, "_compact", lambda args, n: None)
            general = qg.enqueue_many(_batch("j", n, **opts))
            general_again = qg.enqueue_many(_batch("j", n, **opts))
        ids = [f"j{i}" for i in range(n)]
        assert [(x.status, x.state) for x in plain] == [(x.status, x.state) for x in general]
        later = shape in ("delayed", "delayed-events", "run-at")
        assert {x.status for x in plain} == {"scheduled" if later else "queued"}
        assert [(x.status, x.state) for x in again] == [
            (x.status, x.state) for x in general_again]
        assert records_untimed(r, qp, ids, TIMED) == records_untimed(r, qg, ids, TIMED)
        assert r.hgetall(qp.keys.stats) == r.hgetall(qg.keys.stats)
        assert r.xlen(qp.keys.stream) == r.xlen(qg.keys.stream) == (0 if later else n)
        assert r.zcard(qp.keys.delayed) == r.zcard(qg.keys.delayed) == (n if later else 0)
        for j in ids:  # the due time as accept() makes it: the call's time and the delay
            h: Any = r.hgetall(qp.keys.job(j))
            if shape.startswith("delayed"):
                assert int(h[b"due"]) == int(h[b"c"]) + 30_000
                assert r.zscore(qp.keys.delayed, j) == int(h[b"due"])
            elif shape == "run-at":
                assert int(h[b"due"]) == int(dt.datetime(2300, 1, 1, tzinfo=dt.UTC
                                                          ).timestamp() * 1000)
        evp: Any = r.xrange(qp.keys.events)
        evg: Any = r.xrange(qg.keys.events)
        assert [f[b"ev"] for _, f in evp] == [f[b"ev"] for _, f in evg]
        if shape in ("events", "delayed-events"):
            assert r.xlen(qp.keys.events) == n
        _entries_match_records(r, qp)
        if shape == "deadline":
            for j in ids:
                assert r.hget(qp.keys.job(j), "deadline") is not None


def test_an_id_twice_or_a_record_that_exists_goes_the_general_way(
        url: str, r: redis.Redis, qname: str) -> None:
    """A batch with an id twice is sent in the full form (the compact form's ids are
    distinct: the plain batch relies on it); a record that exists sends the call on."""
    with Queue.from_url(url, qname) as q:
        for jobs, compact in ((_batch("a", 3) + _batch("a", 1), False), (_batch("a", 4), True)):
            _, args = prepare.enqueue_call(q.keys, q.config, prepare.prepare_many(
                q.keys, q.config, jobs))
            assert str(args[3]).startswith("=") is compact
        twice = q.enqueue_many(_batch("a", 3) + _batch("a", 1))
        assert [x.status for x in twice] == ["queued"] * 3 + ["duplicate"]
        assert r.xlen(q.keys.stream) == 3
        q.enqueue("t", {"i": 0}, job_id="b0")
        mixed = q.enqueue_many(_batch("b", 3))
        assert [x.status for x in mixed] == ["duplicate", "queued", "queued"]
        assert r.xlen(q.keys.stream) == 6
        assert r.hget(q.keys.stats, "enqueued") == b"6"
        assert r.hget(q.keys.stats, "duplicates") == b"2"
        _entries_match_records(r, q)


@pytest.mark.parametrize("key", ["stream", "stats", "events"])
def test_a_key_of_the_wrong_type_refuses_the_call_with_nothing_written(
        url: str, r: redis.Redis, qname: str, key: str) -> None:
    cfg = QueueConfig(event_kinds=ALL_EVENTS)
    with Queue.from_url(url, qname, cfg) as q:
        k = getattr(q.keys, key)
        r.set(k, "x")
        with pytest.raises(ScriptError, match="WRONGTYPE"):
            q.enqueue_many(_batch("j", 5))
        assert r.exists(*[q.keys.job(f"j{i}") for i in range(5)]) == 0
        others = [x for x in (q.keys.stream, q.keys.stats, q.keys.events) if x != k]
        assert r.exists(*others) == 0


async def test_a_plain_batch_hands_jobs_to_an_idle_worker(url: str, qname: str) -> None:
    reg = Registry()

    @reg.handler("t")
    async def t(job: Job) -> Any:
        return job.payload

    r = redis.Redis.from_url(url)
    async with Worker(url, [qname], reg, fast()) as w:
        await eventually(lambda: int(r.zcard(Keys(qname).tickets)) == 1, what="a ticket")
        with Queue.from_url(url, qname) as q:
            res = await asyncio.to_thread(q.enqueue_many, _batch("j", 5))
            assert {x.status for x in res} == {"queued"}
        await eventually(lambda: w.stats.completed == 5, what="5 completed")
        assert w.stats.handed_over == 1


def test_a_plain_batch_answers_its_count(url: str, r: redis.Redis, qname: str) -> None:
    """One integer, not a status per job; a repeat of the call is answered per job."""
    with Queue.from_url(url, qname) as q:
        batch = prepare.prepare_many(q.keys, q.config, _batch("j", 4))
        call = prepare.enqueue_call(q.keys, q.config, batch, handoff=True)
        assert SCRIPTS["enqueue"](r, *call) == 4
        again = SCRIPTS["enqueue"](r, *call)
        assert again[::5] == [b"duplicate"] * 4 and again[4::5] == [1] * 4
        assert [x.status for x in prepare.parse_enqueue(q.config, batch, 4, retried=False)] == [
            "queued"] * 4


GROUPLESS: dict[str, tuple[dict[str, Any], QueueConfig]] = {
    "plain": ({}, QueueConfig()),
    "options": ({"max_attempts": 2}, QueueConfig()),
    "max-depth": ({}, QueueConfig(max_depth=100)),
    "priority": ({"priority": 0}, QueueConfig()),
    "delayed": ({"delay": 30}, QueueConfig()),
    "search": ({}, QueueConfig(search=SearchConfig())),
}


@pytest.mark.parametrize("shape", sorted(GROUPLESS))
def test_a_call_without_groups_sends_no_group_per_job(url: str, r: redis.Redis, qname: str,
                                                      shape: str) -> None:
    """With the hand-off keys (and so the group keys), a call none of whose jobs has a group
    sends the group defaults but no '' per job; enqueue.lua answers and writes as it does for
    the call with them (an older producer's form), a repeat of it too."""
    opts, cfg = GROUPLESS[shape]
    n = 4
    with Queue.from_url(url, qname + "a", cfg) as qa, Queue.from_url(url, qname + "b", cfg) as qb:
        calls = []
        for q in (qa, qb):
            batch = prepare.prepare_many(q.keys, cfg, _batch("j", n, **opts))
            calls.append(prepare.enqueue_call(q.keys, cfg, batch, handoff=True))
        (ka, aa), (kb, ab) = calls
        at = ab.index(cfg.group_arg) + 1
        assert at == len(ab) or ab[at] != ""
        ab[at:at] = [""] * n  # the older form: every job's group, ''
        replies = [SCRIPTS["enqueue"](r, ka, aa), SCRIPTS["enqueue"](r, kb, ab)]
        assert replies[0] == replies[1]
        again = [SCRIPTS["enqueue"](r, ka, aa), SCRIPTS["enqueue"](r, kb, ab)]
        assert again[0] == again[1] and again[0][::5] == [b"duplicate"] * n
        ids = [f"j{i}" for i in range(n)]
        assert records_untimed(r, qa, ids, TIMED) == records_untimed(r, qb, ids, TIMED)
        assert all(b"g" not in h for h in records_untimed(r, qa, ids, TIMED))
        for key in ("stream", "delayed", "stats"):
            assert r.type(getattr(qa.keys, key)) == r.type(getattr(qb.keys, key))
        assert r.hgetall(qa.keys.stats) == r.hgetall(qb.keys.stats)


def test_a_scheduled_plain_batch_answers_minus_its_count_and_wakes_once(
        url: str, r: redis.Redis, qname: str) -> None:
    """Every job scheduled: -N; the wake channel is published once for the call (the jobs
    share their due time), then not again while an earlier job waits."""
    with Queue.from_url(url, qname) as q:
        sub = r.pubsub()  # type: ignore[no-untyped-call]
        sub.subscribe(q.keys.wake_channel)
        first: Any = sub.get_message(timeout=5)
        assert first["type"] == "subscribe"
        batch = prepare.prepare_many(q.keys, q.config, _batch("j", 5, delay=60))
        assert SCRIPTS["enqueue"](r, *prepare.enqueue_call(q.keys, q.config, batch)) == -5
        got = [x.status for x in prepare.parse_enqueue(q.config, batch, -5, retried=False)]
        assert got == ["scheduled"] * 5
        assert [x.status for x in q.enqueue_many(_batch("k", 5, delay=120))] == [
            "scheduled"] * 5
        r.publish(q.keys.wake_channel, "end")  # (the last message: nothing after it)
        wakes = []
        while True:
            m: Any = sub.get_message(timeout=5)
            assert m is not None
            if m["data"] == b"end":
                break
            wakes.append(m["data"])
        due: Any = r.hget(q.keys.job("j0"), "due")
        assert wakes == [due]
        sub.close()


def test_before_redis_7_each_entry_id_is_read_from_its_reply(url: str, r: redis.Redis,
                                                              qname: str) -> None:
    """Redis 6.2 has no XADD '<ms>-*': there every job takes '*' and 'e' is parsed from each
    reply (the script as it runs there, the version check forced)."""
    src = SCRIPTS["enqueue"].source
    old = "(redis.REDIS_VERSION_NUM or 0) >= 0x070000"
    assert src.count(old) == 1
    six = src.replace(old, "false")
    with Queue.from_url(url, qname) as q:
        batch = prepare.prepare_many(q.keys, q.config, _batch("j", 50))
        keys, args = prepare.enqueue_call(q.keys, q.config, batch, handoff=True)
        assert r.eval(six, len(keys), *keys, *args) == 50
        assert len(_entries_match_records(r, q)) == 50
