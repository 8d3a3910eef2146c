"""A large fan-in's producer (issue #29, docs/workflows.md#costs): edges linked a few hundred
per link_many.lua call, ended ones resolved in that call (parent in the same slot) or applied
from its answer (resolve_many.lua), never one script call per edge."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Generator
from typing import Any

import pytest
from helpers import eventually, fast, state

import streamq
from streamq import JobRef, JobSpec, Queue, Registry, chord, group
from streamq._core.driver import Call, drive
from streamq._core.flow import LINK_BATCH, link, link_call
from streamq._producer.flows import enqueue_flow

N = 2_000


def _reg(calls: list[str]) -> Registry:
    reg = Registry()

    @reg.handler("num")
    def num(job: streamq.Job) -> Any:
        return int(job.payload)

    @reg.handler("collect")
    def collect(job: streamq.Job) -> Any:
        calls.append(job.id)
        return [(d.index, d.state, d.result) for d in job.dependency_results()]

    return reg


def _just(step: list[Any]) -> Generator[list[Any], list[Any], list[Any]]:
    r = yield step
    return r


def _steps(client: Any, op: Any, before: Any = None, upto: int | None = None,
           cut: int | None = None, replies: list[Any] | None = None) -> Any:
    """Drive a sans-IO op step by step: ``before(step)`` before each step is sent (and each
    step's replies appended to ``replies``); with
    ``upto`` only its first ``upto`` steps, then of the next one its first ``cut`` calls (a
    producer that died there). Returns the op's value when it ran to its end."""
    step = next(op)
    k = 0
    while True:
        if upto is not None and k == upto:
            if cut:
                drive(client, _just(step[:cut]))
            return None
        if before is not None:
            before(step)
        r = drive(client, _just(step))
        if replies is not None:
            replies.append(r)
        try:
            step = op.send(r)
        except StopIteration as stop:
            return stop.value
        k += 1


def _scripts(step: list[Any]) -> list[str]:
    return [c.script for c in step if isinstance(c, Call)]


def _flow(other: str | None) -> Any:
    return chord(group(JobSpec("num", i) for i in range(N)), JobSpec("collect", queue=other))


def _every_result(q: Queue, cb: str) -> None:
    res = q.result(cb)
    assert [tuple(r) for r in res] == [(i, "completed", i) for i in range(N)]


@pytest.mark.parametrize("where", ["same slot", "other slot"])
async def test_a_large_chord_whose_children_end_while_it_is_linked_runs_its_callback_once(
        url: str, q: Queue, qname: str, where: str) -> None:
    # the worker runs from the first enqueue; the producer's link step waits until some
    # children have completed (so that part of the edges meet an ended child: resolved in
    # link_many.lua, or through its answer for a callback in another slot) and the rest not
    other = f"{qname}-cb" if where == "other slot" else None
    calls: list[str] = []
    seen: list[list[str]] = []
    done = threading.Event()

    def before(step: list[Any]) -> None:
        names = _scripts(step)
        seen.append(names)
        if "link_many" in names:
            done.wait(120)

    queues = [qname] + ([other] if other else [])
    async with streamq.Worker(url, queues, _reg(calls), fast(concurrency=50)):
        op = enqueue_flow(q.keys, q.config, _flow(other), "big")
        replies: list[Any] = []
        task = asyncio.create_task(asyncio.to_thread(_steps, q.client, op, before, None,
                                                     None, replies))
        await eventually(lambda: state(q, f"big.{N // 2}") == "completed", 120)
        done.set()
        out = await task
        cbq = Queue.from_url(url, other) if other else q
        await eventually(lambda: state(cbq, f"big.{N}") == "completed", 120)
        _every_result(cbq, f"big.{N}")
        await eventually(lambda: q.client.xlen(q.keys.outbox) == 0, 60)
    assert calls == [f"big.{N}"]
    assert out.job_ids[-1] == f"big.{N}"
    # per-edge answers: big.1000 (at least) had ended before its edge was linked: resolved
    # in link_many.lua (same slot) or answered with its message's value (other slot)
    (at,) = [i for i, names in enumerate(seen) if "link_many" in names]
    answers = [a for r in replies[at] for a in r]
    kinds = {a[0] for a in answers}
    assert len(answers) == N
    assert (b"ended" if other else b"resolved") in kinds
    assert kinds <= {b"linked", b"ended", b"resolved"}
    assert not any(b"missing" in a for a in answers)  # (every child was written first)
    assert any("resolve_many" in s for s in seen) == bool(other)
    links = [s for s in seen if "link_many" in s]
    assert len(links) == 1 and len(links[0]) == -(-N // LINK_BATCH)  # N edges, one slot
    assert not any("link" in s or "resolve" in s for s in seen)  # no per-edge script
    # nothing of the fan-in left behind: no parents SET (no outbox message: above)
    assert not q.client.exists(*(q.keys.parents(f"big.{i}") for i in range(0, N, 97)))


@pytest.mark.parametrize(("cut", "where"), [(0, "same slot"), (2, "same slot"),
                                            (2, "other slot")])
async def test_a_repeated_enqueue_flow_after_a_crash_half_way_converges(
        url: str, q: Queue, qname: str, cut: int, where: str) -> None:
    # the first producer dies after the waiting job and the children were written, before its
    # link step (cut 0) or after two of its link_many calls (cut 2); the children run and end
    # meanwhile; the same flow_id again writes no job twice and links what is missing
    other = f"{qname}-cb" if where == "other slot" else None
    cbq = Queue.from_url(url, other) if other else q
    calls: list[str] = []
    seen: list[list[str]] = []
    op = enqueue_flow(q.keys, q.config, _flow(other), "rep")
    # (another queue: its shard count is read first, a step of its own)
    _steps(q.client, op, lambda s: seen.append(_scripts(s)), upto=3 if other else 2, cut=cut)
    assert [s for s in seen if s] == [["wait"], ["enqueue", "enqueue"]]
    queues = [qname] + ([other] if other else [])
    async with streamq.Worker(url, queues, _reg(calls), fast(concurrency=50)):
        await eventually(lambda: state(q, f"rep.{N - 1}") == "completed", 120)
        assert state(cbq, f"rep.{N}") == "waiting"
        again = q.enqueue_flow(_flow(other), flow_id="rep")
        assert again.job_ids == [f"rep.{i}" for i in range(N + 1)]
        await eventually(lambda: state(cbq, f"rep.{N}") == "completed", 120)
        _every_result(cbq, f"rep.{N}")
    assert calls == [f"rep.{N}"]


def test_link_many_answers_per_edge(q: Queue, qname: str) -> None:
    other = f"{qname}-o"  # (no job in it: its child c is missing)
    q.enqueue("num", 1, job_id="a")
    q.enqueue("num", 2, job_id="b")
    q.cancel("b")
    deps = [JobRef(qname, "a"), JobRef(qname, "b", "continue"), JobRef(other, "c", "ignore")]
    # the waiting job only (its producer died before its link step)
    op = enqueue_flow(q.keys, q.config, chord(group([JobSpec("num", 0, job_id="z")]),
                                               JobSpec("collect", job_id="p")), "f")
    _steps(q.client, op, upto=1)  # (wait.lua for p, waiting for z only)
    pk = q.keys.job("p")
    # p waits for z; link p's edges to a, b and c as a producer would (indices 1..3)
    q.client.sadd(q.keys.deps("p"), *(f"{'fci'[i]}{i + 1} {d.queue} {d.job_id}"
                                      for i, d in enumerate(deps)))
    shards = {qname: 1, other: 1}
    edges = [link_call(q.keys.prefix, shards, pk, "p", d, i + 1) for i, d in enumerate(deps)]
    raw = {}
    for c in edges:  # each child's slot: its own link_many call
        box = c.keys[2]
        raw[c.args[0]] = drive(q.client, _just([Call("link_many", [box, *c.keys[:2]],
                                                     list(c.args))]))[0][0]
    assert raw["a"] == [b"linked", b"queued"]
    assert raw["b"][:2] == [b"resolved", b"cancelled"] and raw["b"][2] == 1  # recorded
    assert raw["c"][0] == b"ended" and raw["c"][2:] == [b"missing", b"m"]
    assert q.client.sismember(q.keys.parents("a"), f"f1 {pk} p")
    assert q.client.hget(q.keys.job("a"), "pk") is not None
    assert q.client.hget(q.keys.dep_results("p"), f"2 {qname} b") == b"x"
    # the whole op: the same answers as states, a repeat is a no-op for b; c's message (its
    # value from the answer, no re-read) is applied and deleted
    states = drive(q.client, link(edges))
    assert states == ["queued", "cancelled", "missing"]
    assert q.client.hget(q.keys.dep_results("p"), f"3 {other} c") == b"m"
    assert q.client.smembers(q.keys.deps("p")) == {b"f1 " + qname.encode() + b" a",
                                                   b"f0 " + qname.encode() + b" z"}
    assert state(q, "p") == "waiting"


def test_messages_of_link_and_link_many_are_applied_by_either_relay(q: Queue, qname: str
                                                                     ) -> None:
    # rolling upgrade: an older producer's link.lua and a newer one's link_many.lua write the
    # same outbox message, which an older relay (resolve.lua per message) and a newer one
    # (resolve_many.lua per parent) both apply
    from streamq._core.flow import relay
    from streamq._core.keys import Keys

    other = f"{qname}-o"
    ok_ = Keys(other, q.keys.prefix)
    deps = [JobRef(other, f"gone{i}", "continue") for i in range(4)]
    q.enqueue("num", 0, job_id="held")  # (queued: the waiting job keeps waiting for it)
    q.enqueue("collect", job_id="p", depends_on=[JobRef(qname, "held"), *deps])
    pk = q.keys.job("p")
    # the edges again, unapplied: two by link.lua, two by link_many.lua (each its message)
    edges = [link_call(q.keys.prefix, {other: 1}, pk, "p", d, i + 1) for i, d in enumerate(deps)]
    for c in edges[:2]:
        (a,) = drive(q.client, _just([c]))
        assert a[0] == b"ended" and a[2] == b"missing"
    (many,) = drive(q.client, _just([Call("link_many", [ok_.outbox, *edges[2].keys[:2],
                                                         *edges[3].keys[:2]],
                                          [*edges[2].args, *edges[3].args])]))
    assert [m[0] for m in many] == [b"ended", b"ended"]
    q.client.hdel(q.keys.dep_results("p"), *(f"{i + 1} {other} gone{i}" for i in range(4)))
    q.client.sadd(q.keys.deps("p"), *(f"c{i + 1} {other} gone{i}" for i in range(4)))
    # an older relay: resolve.lua for each message of the outbox
    entries: Any = q.client.xrange(ok_.outbox)
    assert len(entries) == 4
    old = [e for e in entries if e[1][b"m"].endswith((b"gone0", b"gone2"))]
    for _eid, f in old:
        assert drive(q.client, _just([Call("resolve", [f[b"p"].decode()],
                                           [f[b"i"].decode(), f[b"m"].decode(),
                                            f[b"v"].decode()])]))[0] == 1
        q.client.xdel(ok_.outbox, _eid)
    # a newer relay (resolve_many.lua) for the rest: gone1 and gone3 recorded, the repeats of
    # gone0 and gone2 no-ops
    drive(q.client, relay(ok_))
    assert q.client.xlen(ok_.outbox) == 0
    assert q.client.smembers(q.keys.deps("p")) == {f"f0 {qname} held".encode()}
    assert q.client.hlen(q.keys.dep_results("p")) == 4
    assert state(q, "p") == "waiting"
