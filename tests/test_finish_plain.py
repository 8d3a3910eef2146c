"""The record's 'z' flag (docs/key-layout.md): a start of a record that holds none of the rare
fields finish.lua acts on ('notify', 'cx', 'g', 'dk', 'pk', 'wk') marks it, so finish.lua reads
3 fields instead of 9; every script that writes one of them later removes the mark, and a
record without it (started by an older release, or one that has any of them) is read in full.
Whatever the mark says, the outcome a user sees is the same: these tests settle each kind of
record and check what happened."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from helpers import field, finish, start_entries, started, state

from streamq import Dedup, Queue, QueueConfig
from streamq._core.flow import JobRef, link_at
from streamq._core.keys import GROUP
from streamq._core.scripts import SCRIPTS


def _group(r: redis.Redis, q: Queue) -> None:
    r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)


def test_a_plain_started_record_is_marked_and_completes(r: redis.Redis, q: Queue) -> None:
    _group(r, q)
    entry, token = started(r, q, "j1")
    assert r.hget(q.keys.job("j1"), "z") == b""  # (the default result TTL)
    assert finish(r, q, "j1", entry, token, "ok") == [b"completed"]
    assert q.result("j1") == 42
    assert 0 < r.ttl(q.keys.job("j1")) <= 86400
    # a repeat (lost reply) answers the same
    assert finish(r, q, "j1", entry, token, "ok") == [b"completed"]


@pytest.mark.parametrize("ttl", [0, 600])
def test_the_mark_carries_the_result_ttl(r: redis.Redis, q: Queue, ttl: int) -> None:
    """'z' holds the record's 'x', which finish.lua then does not read: a fire-and-forget
    job's record is deleted on completion, another TTL is applied."""
    _group(r, q)
    q.enqueue("x", job_id="j1", result_ttl=ttl)
    r.xreadgroup(GROUP, "c1", {q.keys.stream: ">"}, count=10)
    raw: Any = r.xrange(q.keys.stream)
    entry = raw[-1][0].decode()
    assert start_entries(r, q.keys, "c1", [(entry, "j1")], token="t1")[0] == b"run"
    assert r.hget(q.keys.job("j1"), "z") == str(ttl).encode()
    assert finish(r, q, "j1", entry, "t1", "ok") == [b"completed"]
    if ttl == 0:
        assert not r.exists(q.keys.job("j1"))
    else:
        assert 0 < r.ttl(q.keys.job("j1")) <= ttl
        assert q.result("j1") == 42


def test_a_cancel_while_running_unmarks_the_record_and_ends_it_cancelled(
        r: redis.Redis, q: Queue) -> None:
    _group(r, q)
    entry, token = started(r, q, "j1")
    assert q.cancel("j1").code == "cancel_requested"
    assert r.hget(q.keys.job("j1"), "z") is None
    assert finish(r, q, "j1", entry, token, "retry") == [b"cancelled"]
    assert field(r, q.keys.job("j1"), "state") == b"cancelled"
    assert r.zcard(q.keys.delayed) == 0


def test_an_unmarked_record_with_cx_settles_cancelled(r: redis.Redis, q: Queue) -> None:
    """A record started by an older release (no mark) whose cancel was requested."""
    _group(r, q)
    entry, token = started(r, q, "old")
    key = q.keys.job("old")
    r.hdel(key, "z")
    r.hset(key, "cx", 1)
    assert finish(r, q, "old", entry, token, "dead", "reason") == [b"cancelled"]
    assert field(r, key, "state") == b"cancelled"
    assert r.xlen(q.keys.dead) == 0 and r.xlen(q.keys.stream) == 0


def test_an_unmarked_record_without_rare_fields_completes(r: redis.Redis, q: Queue) -> None:
    _group(r, q)
    entry, token = started(r, q, "old")
    r.hdel(q.keys.job("old"), "z")
    assert finish(r, q, "old", entry, token, "ok") == [b"completed"]
    assert q.result("old") == 42


def test_a_dependency_linked_while_running_releases_its_parent(r: redis.Redis, q: Queue) -> None:
    """link.lua writes 'pk' into the running child and removes the mark: the child's
    completion resolves the parent, with or without the mark ever having been there."""
    _group(r, q)
    for child in ("c1", "c2"):
        entry, token = started(r, q, child)
        assert r.hget(q.keys.job(child), "z") == b""
        if child == "c2":
            r.hdel(q.keys.job(child), "z")  # (started by an older release)
        q.enqueue("collect", job_id=f"p-{child}", depends_on=[child])
        assert r.hget(q.keys.job(child), "pk") is not None
        assert r.hget(q.keys.job(child), "z") is None
        assert state(q, f"p-{child}") == "waiting"
        assert finish(r, q, child, entry, token, "ok") == [b"completed"]
        assert state(q, f"p-{child}") == "queued"


def test_records_with_rare_fields_are_not_marked(r: redis.Redis, q: Queue) -> None:
    _group(r, q)
    q.enqueue("x", job_id="g1", group="acct-1")
    q.enqueue("x", job_id="d1", dedup=Dedup(key="k1"))
    raw: Any = r.xrange(q.keys.stream)
    entries = [(e.decode(), f[b"id"].decode()) for e, f in raw]
    r.xreadgroup(GROUP, "c1", {q.keys.stream: ">"}, count=10)
    reply = start_entries(r, q.keys, "c1", entries)
    assert reply.count(b"run") == 2
    at = {j: e for e, j in entries}
    for job_id in ("g1", "d1"):
        assert r.hget(q.keys.job(job_id), "z") is None
        assert _finish_ok(r, q, job_id, at[job_id]) == [b"completed"]
    # the group's slot and the dedup key were freed by the completions
    assert r.zcard(q.keys.group_inflight) == 0
    q.enqueue("x", job_id="d2", dedup=Dedup(key="k1"))
    assert state(q, "d2") == "queued"


def _finish_ok(r: redis.Redis, q: Queue, job_id: str, entry: str) -> list[bytes]:
    """finish.lua's 'ok' with the group keys (so a grouped job frees its slot)."""
    k = q.keys
    tok: Any = r.hget(k.job(job_id), "k")
    assert tok is not None
    keys = [k.stream, k.delayed, k.dead, k.stats, k.events, k.job(job_id), *k.group_keys]
    out: list[bytes] = SCRIPTS["finish"](r, keys, [
        GROUP, "1000", 3600, 1000, "", 1, job_id, entry, tok.decode(), "ok", b"42", 1000, "",
        QueueConfig().group_arg])
    return out


def test_an_older_producers_link_unmarks_the_running_child(r: redis.Redis, q: Queue) -> None:
    """link.lua (older producers' edge, one per call) writes 'pk' and removes the mark."""
    _group(r, q)
    started(r, q, "c1")
    call = link_at(q.keys.prefix, 0, q.keys.job("p"), "p", JobRef(q.name, "c1"), 0)
    assert SCRIPTS[call.script](r, call.keys, call.args)[0] == b"linked"
    assert r.hget(q.keys.job("c1"), "pk") is not None
    assert r.hget(q.keys.job("c1"), "z") is None


def test_a_record_with_a_long_value_is_not_marked(r: redis.Redis, q: Queue) -> None:
    """A record with a value over 64 bytes is a hashtable, where one more field costs memory
    for the record's life: it is not marked, and settles as before."""
    _group(r, q)
    q.enqueue("x", {"pad": "p" * 200}, job_id="big")
    r.xreadgroup(GROUP, "c1", {q.keys.stream: ">"}, count=10)
    raw: Any = r.xrange(q.keys.stream)
    entry = raw[-1][0].decode()
    assert start_entries(r, q.keys, "c1", [(entry, "big")], token="t1")[0] == b"run"
    assert r.hget(q.keys.job("big"), "z") is None
    assert finish(r, q, "big", entry, "t1", "ok") == [b"completed"]
    assert q.result("big") == 42
