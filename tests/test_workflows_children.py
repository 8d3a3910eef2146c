"""Dynamic children (docs/workflows.md#dynamic-children): a handler adds children at run time
and raises WaitForChildren; it waits only while a child is pending, then runs again (the
attempt not counted) with their results."""

from __future__ import annotations

import threading
from typing import Any

import redis
from helpers import eventually, running, state

import streamq
from streamq import JobSpec, Queue, Registry, WaitForChildren


def _reg(q: Queue, runs: list[tuple[int, int]], gate: threading.Event | None = None,
         fail_kid: bool = False) -> Registry:
    reg = Registry()

    @reg.handler("parent", children=True, max_attempts=1)
    def parent(job: streamq.Job) -> Any:
        done = job.dependency_results()
        runs.append((job.attempt, len(done)))
        if not done:
            q.add_children(job.id, [JobSpec("kid", i, job_id=f"{job.id}-k{i}")
                                    for i in range(3)])
            if gate is not None:  # the children end before the parent settles
                assert gate.wait(30)
            raise WaitForChildren()
        return sorted(d.result for d in done)

    @reg.handler("kid")
    def kid(job: streamq.Job) -> Any:
        if fail_kid and job.payload == 1:
            raise streamq.Fail("kid failed")
        return job.payload * 10

    return reg


async def test_a_parent_waits_for_its_children_and_runs_again(url: str, q: Queue, qname: str,
                                                              r: redis.Redis) -> None:
    runs: list[tuple[int, int]] = []
    q.enqueue("parent", job_id="p")
    async with running(url, qname, _reg(q, runs)):
        await eventually(lambda: state(q, "p") == "completed", 30)
    assert q.result("p") == [0, 10, 20]
    assert runs == [(1, 0), (1, 3)]  # the re-run has the same attempt: not counted
    assert not r.exists(q.keys.deps("p"), q.keys.dep_results("p"))
    assert r.zcard(q.keys.waiting) == 0


async def test_children_that_ended_first_cannot_strand_the_parent(url: str, q: Queue,
                                                                  qname: str) -> None:
    runs: list[tuple[int, int]] = []
    gate = threading.Event()
    q.enqueue("parent", job_id="p")
    async with running(url, qname, _reg(q, runs, gate)):
        await eventually(lambda: all(state(q, f"p-k{i}") == "completed" for i in range(3)), 30)
        gate.set()  # every child ended while the parent still ran: no wait, a re-run now
        await eventually(lambda: state(q, "p") == "completed", 30)
    assert q.result("p") == [0, 10, 20]
    assert runs == [(1, 0), (1, 3)]


async def test_a_failed_child_dead_letters_the_parent_under_policy_fail(
        url: str, q: Queue, qname: str) -> None:
    runs: list[tuple[int, int]] = []
    q.enqueue("parent", job_id="p")
    async with running(url, qname, _reg(q, runs, fail_kid=True)):
        await eventually(lambda: state(q, "p") == "failed", 30)
    info = q.get("p")
    assert info is not None and info.reason == f"dependency {qname} p-k1 failed"
    assert runs == [(1, 0)]  # dead-lettered when it settled, never run again


def test_add_children_refuses_a_job_that_is_not_running(q: Queue) -> None:
    q.enqueue("parent", job_id="p")
    try:
        q.add_children("p", [JobSpec("kid", 1)])
    except streamq.InvalidArgument as exc:
        assert "not running" in str(exc)
    else:
        raise AssertionError("add_children on a queued job was accepted")


async def test_wait_for_children_without_any_is_a_dead_letter(url: str, q: Queue,
                                                              qname: str) -> None:
    reg = Registry()

    @reg.handler("lonely")
    def lonely(job: streamq.Job) -> Any:
        raise WaitForChildren()

    q.enqueue("lonely", job_id="l")
    async with running(url, qname, reg):
        await eventually(lambda: state(q, "l") == "failed", 30)
    info = q.get("l")
    assert info is not None and info.reason == "WaitForChildren without children"


async def test_wait_for_children_from_the_process_pool(url: str, q: Queue, qname: str) -> None:
    from test_pool import done, pool_worker

    async with pool_worker(url, qname):
        q.enqueue("spawner", {"url": url}, job_id="sp")
        info = await done(q, "sp")
    assert info.state == "completed" and info.result == {"attempt": 1, "kids": [0, 1]}


async def test_children_in_another_queue_resolve_through_the_outbox(url: str, q: Queue,
                                                                    qname: str) -> None:
    from helpers import fast

    from streamq import Worker

    other = f"{qname}-o"
    reg = Registry()

    @reg.handler("parent", children=True)
    def parent(job: streamq.Job) -> Any:
        done = job.dependency_results()
        if not done:
            q.add_children(job.id, [JobSpec("kid", i, queue=other, job_id=f"o{i}")
                                    for i in range(2)], policy="continue")
            raise WaitForChildren()
        return [(d.queue, d.result) for d in done]

    @reg.handler("kid")
    def kid(job: streamq.Job) -> Any:
        return job.payload + 1

    q.enqueue("parent", job_id="p")
    async with Worker(url, [qname, other], reg, fast()):
        await eventually(lambda: state(q, "p") == "completed", 30)
    assert q.result("p") == [[other, 1], [other, 2]]
