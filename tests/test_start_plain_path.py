"""start_entry's short path (_lib.lua): a queued record of exactly the three fields enqueue.lua
writes for a default job ('s' 'q', 'b', 'e') whose 'e' is the entry read starts without the
general path's table; finish.lua's short path completes an 'ok' of a record with 'z'. These
tests pin what both paths write and answer: the same as the general path, and the records
just outside the short paths (another 'e', a long body, an entry id kept as it is) still get
the general path's answers."""

from __future__ import annotations

from typing import Any

import redis
from helpers import finish, start_entries

from streamq import Queue
from streamq._core.config import QueueConfig
from streamq._core.keys import GROUP, Keys
from streamq._core.scripts import SCRIPTS
from streamq._worker.calls import claim_call, claim_rows


def _claim(r: redis.Redis, k: Keys, first: int = 16, n: int = 10) -> list[list[Any]]:
    reply = SCRIPTS["claim"](r, *claim_call(k, "c1", QueueConfig(), "pfx", first, n))
    assert reply[0] == b"ok"
    return [[lv, e.encode(), j.encode(), c.encode(), t.encode(), *rest]
            for lv, e, j, c, t, *rest in claim_rows(reply, "pfx", first)]


def _rec(r: redis.Redis, key: str) -> dict[bytes, bytes]:
    h: Any = r.hgetall(key)
    return dict(h)


def test_a_default_job_starts_as_the_general_path_starts_it(r: redis.Redis, q: Queue) -> None:
    k = q.keys
    q.enqueue("t", {"i": 1}, job_id="fast")
    q.enqueue("t", {"i": 1}, job_id="slow")
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    fast0 = _rec(r, k.job("fast"))
    assert set(fast0) == {b"s", b"b", b"e"}
    # 'c' (created) equal to the entry's time: the same job for the general path
    e = fast0[b"e"].decode()
    slow_e = _rec(r, k.job("slow"))[b"e"].decode()
    r.hset(k.job("slow"), "c", slow_e[:-3])
    rows = _claim(r, k)
    assert [row[2] for row in rows] == [b"fast", b"slow"]
    for row in rows:
        _lv, entry, jid, code, token, attempt, data, deadline, wait, age = row
        assert code == b"run" and attempt == 1 and deadline == 0
        assert data == fast0[b"b"] and wait == age and wait >= 0
        rec = _rec(r, k.job(jid.decode()))
        assert rec[b"s"] == b"a" and rec[b"n"] == b"1" and rec[b"k"] == token
        assert rec[b"o"] == b"c1" and rec[b"z"] == b"" and int(rec[b"a"]) > 0
    fast, slow = _rec(r, k.job("fast")), _rec(r, k.job("slow"))
    assert fast[b"e"] == e.encode()
    del slow[b"c"]
    assert set(fast) == set(slow)
    assert {f: v for f, v in fast.items() if f not in (b"k", b"e", b"a")} == \
        {f: v for f, v in slow.items() if f not in (b"k", b"e", b"a")}
    # completed by finish.lua's short path, and a repeat answers the same
    for row in rows:
        jid, entry, token = row[2].decode(), row[1].decode(), row[4].decode()
        assert finish(r, q, jid, entry, token, "ok") == [b"completed"]
        assert finish(r, q, jid, entry, token, "ok") == [b"completed"]
        assert q.result(jid) == 42
        assert 0 < r.ttl(k.job(jid)) <= 86400
    assert finish(r, q, "fast", rows[0][1].decode(), "another", "ok") == [b"lost"]


def test_a_long_body_is_not_marked_and_completes(r: redis.Redis, q: Queue) -> None:
    k = q.keys
    q.enqueue("t", {"pad": "x" * 100}, job_id="big")
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    (row,) = _claim(r, k)
    assert row[3] == b"run" and row[5] == 1
    rec = _rec(r, k.job("big"))
    assert b"z" not in rec and rec[b"s"] == b"a" and rec[b"k"] == row[4]
    assert finish(r, q, "big", row[1].decode(), row[4].decode(), "ok") == [b"completed"]
    assert q.result("big") == 42


def test_a_record_naming_another_entry_is_skipped(r: redis.Redis, q: Queue) -> None:
    k = q.keys
    q.enqueue("t", job_id="j1")
    q.enqueue("t", job_id="j2")
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    other = _rec(r, k.job("j2"))[b"e"]
    r.hset(k.job("j1"), "e", other)  # (j1's entry is now a ghost of another delivery)
    rows = _claim(r, k, n=1)
    assert rows[0][2] == b"j1" and rows[0][3] == b"skip" and rows[0][6] == b"queued"
    assert _rec(r, k.job("j1"))[b"s"] == b"q"
    assert r.xpending(k.stream, GROUP)["pending"] == 0


def test_an_entry_id_kept_as_it_is_starts(r: redis.Redis, q: Queue) -> None:
    """A sequence number over 999: 'e' holds the id as Redis writes it."""
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    r.xadd(k.stream, {"id": "j9"}, id="1700000000000-1000")
    r.hset(k.job("j9"), mapping={"s": "q", "b": "t {}", "e": "1700000000000-1000"})
    (row,) = _claim(r, k)
    assert row[3] == b"run" and row[5] == 1 and row[6] == b"t {}" and row[8] == row[9] > 0
    assert _rec(r, k.job("j9"))[b"z"] == b""


def test_a_start_seen_again_answers_the_same(r: redis.Redis, q: Queue) -> None:
    k = q.keys
    q.enqueue("t", job_id="j1")
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    r.xreadgroup(GROUP, "c1", {k.stream: ">"}, count=10)
    raw: Any = r.xrange(k.stream)
    entry = raw[-1][0].decode()
    one = start_entries(r, k, "c1", [(entry, "j1")], token="t1")
    two = start_entries(r, k, "c1", [(entry, "j1")], token="t1")
    assert one[0] == two[0] == b"run" and one[1:4] == two[1:4]
    assert _rec(r, k.job("j1"))[b"n"] == b"1"
