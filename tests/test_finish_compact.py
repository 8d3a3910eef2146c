"""finish.lua's compact form (its header; streamq/_worker/settle.py): a call whose attempts all
share their outcome, delay or reason and error type sends those once and 4 arguments per job
instead of 7. It settles exactly as the full form does, the arguments after the attempts
(group defaults, the recent list's length) included, and a repeat answers the same."""

from __future__ import annotations

from typing import Any

import pytest
import redis
from helpers import start_entries, state

from streamq import Queue, QueueConfig
from streamq._core.keys import GROUP
from streamq._core.scripts import SCRIPTS

IDS = ["a", "b", "c"]


def _started(r: redis.Redis, q: Queue) -> list[tuple[str, str, str]]:
    """Three jobs (two of one group), started: (id, entry, token) each."""
    r.xgroup_create(q.keys.stream, GROUP, id="0", mkstream=True)
    for j in IDS:
        q.enqueue("x", job_id=j, group="g1" if j != "c" else None)
    r.xreadgroup(GROUP, "c1", {q.keys.stream: ">"}, count=10)
    raw: Any = r.xrange(q.keys.stream)
    entries = [(e.decode(), f[b"id"].decode()) for e, f in raw]
    reply = start_entries(r, q.keys, "c1", entries)
    assert reply.count(b"run") == 2  # (group limit 1: the second of g1 waits)
    out = []
    for e, j in entries:
        tok: Any = r.hget(q.keys.job(j), "k")
        if tok is not None:
            out.append((j, e, tok.decode()))
    return out


def _call(r: redis.Redis, q: Queue, jobs: list[tuple[str, str, str]], outcome: str,
          data: list[bytes], extra: Any, etype: str, compact: bool) -> Any:
    k = q.keys
    keys = [k.stream, k.delayed, k.dead, k.stats, k.events, *(k.job(j) for j, _, _ in jobs),
            *k.group_keys, k.finished("c1"), k.recent]
    args: list[Any] = [GROUP, "1000", 3600, 1000, ""]
    if compact:
        args += [-len(jobs), outcome, extra, etype, len(k.job("").encode())]
        if any(data):
            args.append(1)
            for (_j, e, t), d in zip(jobs, data, strict=True):
                args += [e, t, d]  # (each job id read from its key)
        else:  # every result None: no data sent
            args.append(0)
            for _j, e, t in jobs:
                args += [e, t]
    else:
        args.append(len(jobs))
        for (j, e, t), d in zip(jobs, data, strict=True):
            args += [j, e, t, outcome, d, extra, etype]
    args += [QueueConfig(group_concurrency=1).group_arg, 1]
    return SCRIPTS["finish"](r, keys, args)


def _seen(r: redis.Redis, q: Queue) -> dict[str, Any]:
    k = q.keys
    recs = {}
    for j in IDS:
        h: Any = r.hgetall(k.job(j))
        # (times and tokens differ between the two queues' runs)
        recs[j] = {f: v.split(b":")[0] if f == b"ft" else v for f, v in h.items()
                   if f not in (b"k", b"a", b"c", b"f", b"e", b"due", b"errors", b"gw")}
    recent: Any = r.lrange(k.recent, 0, -1)
    return {"records": recs, "stats": r.hgetall(k.stats), "inflight": r.zcard(k.group_inflight),
            "delayed": r.zcard(k.delayed), "stream": r.xlen(k.stream),
            "recent": len(recent), "pending": r.xpending(k.stream, GROUP)["pending"]}


@pytest.mark.parametrize("outcome", ["ok", "ok-none", "retry"])
def test_the_compact_form_settles_as_the_full_one(r: redis.Redis, url: str, qname: str,
                                                  outcome: str) -> None:
    """'ok-none': every handler returned None, so the compact form sends no data."""
    none = outcome == "ok-none"
    outcome = "ok" if none else outcome
    cfg = QueueConfig(group_concurrency=1)
    seen = []
    for compact in (False, True):
        with Queue.from_url(url, f"{qname}-{compact}", cfg) as q:
            jobs = _started(r, q)
            data = ([b"", b""] if none else [b"1", b""]) if outcome == "ok" else \
                [b'{"type": "E"}'] * 2
            extra, etype = (0, "") if outcome == "ok" else (1000, "E")
            out = _call(r, q, jobs, outcome, data, extra, etype, compact)
            want = [b"completed"] * 2 if outcome == "ok" else [b"retrying"] * 2
            assert out[:2] == want
            # a repeat (lost reply) answers the same and writes nothing more
            assert _call(r, q, jobs, outcome, data, extra, etype, compact)[:2] == want
            seen.append(_seen(r, q))
    assert seen[0] == seen[1]
    if outcome == "ok":
        # the group's slot freed and its next job admitted (ARGV[T]); the recent list kept
        # to its length (ARGV[T + 1])
        assert seen[1]["inflight"] == 1 and seen[1]["recent"] == 1


@pytest.mark.parametrize("compact", [False, True])
def test_the_compact_form_hands_a_released_job_to_its_caller(r: redis.Redis, url: str,
                                                             qname: str, compact: bool) -> None:
    """The hand-off arguments after the attempts (ARGV[T + 2 ..]) are read at the compact
    form's offset: the parent both dependencies release is started for the caller."""
    with Queue.from_url(url, qname) as q:
        k = q.keys
        r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
        jobs = []
        for j in ("a", "b"):
            q.enqueue("x", job_id=j)
            r.xreadgroup(GROUP, "c1", {k.stream: ">"}, count=10)
            raw: Any = r.xrange(k.stream)
            entry = raw[-1][0].decode()
            assert start_entries(r, k, "c1", [(entry, j)], token=f"tok-{j}")[0] == b"run"
            jobs.append((j, entry, f"tok-{j}"))
        q.enqueue("x", job_id="p", depends_on=["a", "b"])
        keys = [k.stream, k.delayed, k.dead, k.stats, k.events, *(k.job(j) for j, _, _ in jobs),
                *k.group_keys, k.finished("c1"), k.recent]
        args: list[Any] = [GROUP, "1000", 3600, 1000, ""]
        if compact:
            args += [-2, "ok", 0, "", len(k.job("").encode()), 0]
            for _j, e, t in jobs:
                args += [e, t]
        else:
            args.append(2)
            for j, e, t in jobs:
                args += [j, e, t, "ok", b"", 0, ""]
        args += [QueueConfig().group_arg, 100, "c1", k.job(""), "pfx-", 4]
        out = SCRIPTS["finish"](r, keys, args)
        assert out[:2] == [b"completed", b"completed"]
        row = out[2:]
        assert len(row) == 10 and row[1] == b"p" and row[2] == b"run"
        assert row[3].startswith(b"pfx-h")
        assert r.hget(k.job("p"), "k") == row[3] and state(q, "p") == "active"
