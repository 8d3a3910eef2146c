"""finish.lua deletes settled entries below the oldest pending one by trimming (XTRIM MINID)
and the ones above it one by one: whatever the order jobs finish in, the stream holds exactly
the entries still pending, across stream nodes (100 entries each by default)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import start_entries
from sec_support import AclServer, rule_for, tenant_rule_from_docs

from streamq import Queue
from streamq._core.keys import GROUP, Keys
from streamq._core.scripts import SCRIPTS


def _started(q: Queue, r: redis.Redis, n: int) -> dict[str, tuple[str, str]]:
    """n jobs enqueued, read by consumer A and started: job id -> (entry, token)."""
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    ids = [f"j{i}" for i in range(n)]
    q.enqueue_many([{"type": "t", "payload": i, "job_id": j} for i, j in enumerate(ids)])
    got: Any = r.xreadgroup(GROUP, "A", {k.stream: ">"}, count=n)
    pairs = [(e.decode(), f[b"id"].decode()) for e, f in got[0][1]]
    out: dict[str, tuple[str, str]] = {}
    for i in range(0, len(pairs), 50):
        part = pairs[i:i + 50]
        reply = start_entries(r, k, "A", part)
        for j, (entry, job) in enumerate(part):
            assert reply[7 * j] == b"run"
            out[job] = (entry, reply[7 * j + 1].decode())
    return out


def _finish(r: redis.Redis, k: Keys, done: list[tuple[str, str, str]]) -> list[Any]:
    keys = [k.stream, k.delayed, k.dead, k.stats, k.events] + [k.job(j) for j, _, _ in done]
    args: list[Any] = [GROUP, 0, 3600, 1000, "", len(done)]
    for job, entry, token in done:
        args += [job, entry, token, "ok", b"", 0, ""]
    return list(SCRIPTS["finish"](r, keys, args))


def _entries(r: redis.Redis, k: Keys) -> set[str]:
    got: Any = r.xrange(k.stream)
    return {e.decode() for e, _ in got}


def _pending(r: redis.Redis, k: Keys) -> set[str]:
    got: Any = r.xpending_range(k.stream, GROUP, "-", "+", 1000)
    return {p["message_id"].decode() for p in got}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_stream_holds_exactly_the_pending_entries_whatever_the_finish_order(
        q: Queue, r: redis.Redis, seed: int) -> None:
    k = q.keys
    jobs = _started(q, r, 260)  # three stream nodes
    order = list(jobs)
    rnd = random.Random(seed)
    # mostly oldest first (a drain), with stragglers that finish late
    order.sort(key=lambda j: int(j[1:]) + (rnd.random() < 0.1) * rnd.randint(20, 200))
    left = set(jobs)
    while order:
        size = rnd.randint(1, 60)
        batch, order = order[:size], order[size:]
        rnd.shuffle(batch)
        out = _finish(r, k, [(j, *jobs[j]) for j in batch])
        assert out == [b"completed"] * len(batch)
        left -= set(batch)
        live = {jobs[j][0] for j in left}
        assert _pending(r, k) == live
        assert _entries(r, k) == live
        assert r.xlen(k.stream) == len(live)
    assert r.xlen(k.stream) == 0
    assert r.hget(k.stats, "completed") == b"260"


def test_a_settled_entry_already_gone_and_one_above_the_oldest_pending(
        q: Queue, r: redis.Redis) -> None:
    k = q.keys
    jobs = _started(q, r, 8)
    e = {j: jobs[j][0] for j in jobs}
    r.xdel(k.stream, e["j1"])  # gone from the stream, still pending (a ghost)
    # j0 keeps running; j1 (gone), j2 and j5 settle: below nothing, all above j0
    out = _finish(r, k, [(j, *jobs[j]) for j in ("j5", "j1", "j2")])
    assert out == [b"completed"] * 3
    live = {e[j] for j in ("j0", "j3", "j4", "j6", "j7")}
    assert _entries(r, k) == live and _pending(r, k) == live
    # j0 and j4 settle: j0 below the new oldest pending (j3), j4 above it
    assert _finish(r, k, [(j, *jobs[j]) for j in ("j4", "j0")]) == [b"completed"] * 2
    live = {e[j] for j in ("j3", "j6", "j7")}
    assert _entries(r, k) == live and _pending(r, k) == live
    # a repeated call (its reply was lost) deletes nothing more
    assert _finish(r, k, [(j, *jobs[j]) for j in ("j4", "j0")]) == [b"completed"] * 2
    assert _entries(r, k) == live
    # the last ones: nothing pending after them
    assert _finish(r, k, [(j, *jobs[j]) for j in ("j7", "j3", "j6")]) == [b"completed"] * 3
    assert r.xlen(k.stream) == 0 and _pending(r, k) == set()


def test_an_acknowledged_entry_left_below_the_oldest_pending_is_trimmed(
        q: Queue, r: redis.Redis) -> None:
    """An entry acknowledged without being deleted (by hand, or an older tool) is live work
    for nobody: the next finish that trims past it deletes it too."""
    k = q.keys
    jobs = _started(q, r, 4)
    e = {j: jobs[j][0] for j in jobs}
    r.xack(k.stream, GROUP, e["j0"])
    assert _finish(r, k, [("j1", *jobs["j1"])]) == [b"completed"]
    live = {e["j2"], e["j3"]}
    assert _entries(r, k) == live and _pending(r, k) == live


def _started_some(q: Queue, r: redis.Redis, n: int, read: int
                  ) -> tuple[dict[str, tuple[str, str]], set[str]]:
    """n jobs enqueued, the first `read` read by consumer A and started; also the entries
    never delivered."""
    k = q.keys
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    q.enqueue_many([{"type": "t", "payload": i, "job_id": f"j{i}"} for i in range(n)])
    got: Any = r.xreadgroup(GROUP, "A", {k.stream: ">"}, count=read)
    pairs = [(e.decode(), f[b"id"].decode()) for e, f in got[0][1]]
    reply = start_entries(r, k, "A", pairs)
    jobs = {job: (entry, reply[7 * j + 1].decode()) for j, (entry, job) in enumerate(pairs)}
    return jobs, _entries(r, k) - {e for e, _ in jobs.values()}


def test_with_nothing_pending_after_it_a_finish_keeps_the_undelivered_entries(
        q: Queue, r: redis.Redis) -> None:
    k = q.keys
    jobs, undelivered = _started_some(q, r, 130, 110)  # past the first stream node
    order = list(jobs)
    random.Random(7).shuffle(order)
    assert _finish(r, k, [(j, *jobs[j]) for j in order]) == [b"completed"] * 110
    assert _pending(r, k) == set() and _entries(r, k) == undelivered
    assert r.xlen(k.stream) == 20
    # and they are read and settled as usual
    got: Any = r.xreadgroup(GROUP, "A", {k.stream: ">"}, count=100)
    pairs = [(e.decode(), f[b"id"].decode()) for e, f in got[0][1]]
    assert {e for e, _ in pairs} == undelivered
    reply = start_entries(r, k, "A", pairs)
    done = [(job, entry, reply[7 * j + 1].decode()) for j, (entry, job) in enumerate(pairs)]
    assert _finish(r, k, done) == [b"completed"] * 20
    assert r.xlen(k.stream) == 0


def test_with_nothing_pending_an_id_the_call_did_not_acknowledge_is_deleted_by_id(
        q: Queue, r: redis.Redis) -> None:
    k = q.keys
    jobs, undelivered = _started_some(q, r, 6, 3)
    r.xack(k.stream, GROUP, jobs["j2"][0])  # no longer pending (acknowledged by hand)
    assert _finish(r, k, [(j, *jobs[j]) for j in ("j2", "j0", "j1")]) == [b"completed"] * 3
    assert _pending(r, k) == set() and _entries(r, k) == undelivered


def test_an_entry_that_was_never_delivered_never_widens_the_trim(q: Queue, r: redis.Redis
                                                                 ) -> None:
    """A caller naming an entry it was not delivered (a bug) gets that entry deleted, as by
    XDEL, and nothing else: the trim only ever covers entries the call acknowledged."""
    k = q.keys
    jobs, undelivered = _started_some(q, r, 6, 2)
    later = sorted(undelivered, key=lambda e: tuple(map(int, e.split("-"))))
    r.xack(k.stream, GROUP, jobs["j1"][0])  # nothing pending after the call but j0
    out = _finish(r, k, [("j0", *jobs["j0"]), ("j1", later[2], jobs["j1"][1])])
    assert out == [b"completed"] * 2
    assert _entries(r, k) == {jobs["j1"][0]} | set(later) - {later[2]}


def test_a_tenant_whose_acl_rule_predates_xtrim_still_settles(tmp_path: Path) -> None:
    """The per-tenant rule of docs/security.md before XTRIM was in it: finish.lua falls back
    to XDEL, and the stream still ends empty."""
    rule = rule_for(tenant_rule_from_docs(), "old", "pw-old").replace(" +xtrim", "")
    assert "xtrim" not in rule
    with AclServer(tmp_path, [rule]) as server:
        client = redis.Redis.from_url(server.url("old", "pw-old"), protocol=2)
        with Queue.from_url(server.url("old", "pw-old"), "old") as q:
            k = q.keys
            jobs, undelivered = _started_some(q, client, 8, 5)
            done = [(j, *jobs[j]) for j in ("j3", "j1")]  # j0 still pending: the MINID path
            assert _finish(client, k, done) == [b"completed"] * 2
            done = [(j, *jobs[j]) for j in ("j0", "j2", "j4")]  # none pending after it
            assert _finish(client, k, done) == [b"completed"] * 3
            assert _entries(client, k) == undelivered
        client.close()
        denied = [e for e in server.admin().acl_log() if e["object"] != "client|setinfo"]
        assert {e["object"] for e in denied} == {"xtrim"}
