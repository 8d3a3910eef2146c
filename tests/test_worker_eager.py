"""Eager start (streamq/_worker/eager.py): a job's first step runs in the fetch step; a job that
ends there gets no task, one that waits goes on in a task of its own. What users rely on: the
outcome of every kind of handler, cancel and timeout of one that waits, the job's own task as
the current task (asyncio.timeout, TaskGroup), and contextvars that never leak between jobs."""

from __future__ import annotations

import asyncio
import contextvars
from typing import Any

import pytest
from helpers import eventually, finished, running, state

from streamq import Job, Queue, Registry
from streamq._worker import eager

pytestmark = pytest.mark.skipif(not eager.AVAILABLE, reason="no asyncio._enter_task here")

_seen: contextvars.ContextVar[str] = contextvars.ContextVar("test_eager_seen", default="")


async def test_jobs_that_end_without_awaiting_get_no_task(url: str, q: Queue) -> None:
    reg = Registry()
    made: list[str] = []

    @reg.handler("sum")
    async def add(job: Job) -> int:  # never awaits: ends in its first step
        return int(job.payload["a"]) + int(job.payload["b"])

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        made.append(getattr(coro, "__qualname__", type(coro).__name__))
        return asyncio.Task(coro, loop=loop, **kw)

    ids = [x.job_id for x in q.enqueue_many([{"type": "sum", "payload": {"a": i, "b": 1}}
                                             for i in range(200)])]
    loop = asyncio.get_running_loop()
    loop.set_task_factory(factory)
    try:
        async with running(url, q.name, reg, concurrency=20) as w:
            await eventually(lambda: finished(q, *ids), what="jobs to finish")
            assert not w._tasks and not w._jobs  # nothing left tracked
    finally:
        loop.set_task_factory(None)
    assert [q.result(i) for i in ids] == [i + 1 for i in range(200)]
    assert w.stats.completed == 200
    assert not [m for m in made if "_run_job" in m]  # no task per job
    assert made.count("_Carry") <= 2  # one parked carrier, never used


async def test_a_job_that_awaits_runs_on_in_its_own_task(url: str, q: Queue) -> None:
    reg = Registry()
    tasks: dict[str, tuple[Any, Any]] = {}

    @reg.handler("wait")
    async def wait(job: Job) -> str:
        before = asyncio.current_task()
        async with asyncio.timeout(5):  # entered before the first await: binds to the job
            await asyncio.sleep(0.05)
        tasks[job.id] = (before, asyncio.current_task())
        return "ok"

    ids = [x.job_id for x in q.enqueue_many([{"type": "wait"} for _ in range(30)])]
    async with running(url, q.name, reg, concurrency=10) as w:
        await eventually(lambda: finished(q, *ids), what="jobs to finish")
        loops = set(w._loops)
    await asyncio.sleep(0)  # (the parked carrier's cancel from stop() runs)
    assert not [t for t in asyncio.all_tasks() if type(t.get_coro()).__name__ == "_Carry"]
    assert all(q.result(i) == "ok" for i in ids)
    befores = {id(b) for b, _a in tasks.values()}
    assert len(befores) == 30  # each job its own task, the same before and after its await
    assert all(b is a and b not in loops for b, a in tasks.values())


async def test_a_handler_that_raises_before_its_first_await(url: str, q: Queue) -> None:
    reg = Registry()

    @reg.handler("boom", max_attempts=1)
    async def boom(job: Job) -> None:
        raise ValueError(f"bad {job.payload}")

    @reg.handler("own_cancel", max_attempts=1)
    async def own_cancel(job: Job) -> None:
        raise asyncio.CancelledError  # its own: a failure, not a worker stop

    q.enqueue("boom", 7, job_id="b")
    q.enqueue("own_cancel", job_id="c")
    async with running(url, q.name, reg):
        await eventually(lambda: finished(q, "b", "c"), what="jobs to fail")
    info = q.get("b")
    assert info is not None and info.state == "failed"
    assert info.error is not None and "bad 7" in info.error["message"]
    assert state(q, "c") == "failed"


async def test_cancel_of_a_job_waiting_after_its_eager_step(url: str, q: Queue) -> None:
    reg = Registry()
    began = asyncio.Event()
    ended: list[str] = []

    @reg.handler("long")
    async def long(job: Job) -> None:
        began.set()
        try:
            await asyncio.sleep(60)
        finally:
            ended.append(job.id)

    @reg.handler("timed", timeout=0.2, max_attempts=1)
    async def timed(job: Job) -> None:
        await asyncio.sleep(60)

    q.enqueue("long", job_id="L")
    q.enqueue("timed", job_id="T")
    async with running(url, q.name, reg):
        await asyncio.wait_for(began.wait(), 10)
        await asyncio.to_thread(q.cancel, "L")
        await eventually(lambda: finished(q, "L", "T"), what="cancel and timeout")
    assert state(q, "L") == "cancelled" and ended == ["L"]
    info = q.get("T")
    assert info is not None and info.state == "failed" and "timed out" in str(info.error)


async def test_a_timeout_entered_eagerly_cancels_the_job_not_the_worker(url: str,
                                                                        q: Queue) -> None:
    reg = Registry()

    @reg.handler("deadline", max_attempts=1)
    async def deadline(job: Job) -> None:
        async with asyncio.timeout(0.1):  # entered in the eager step; fires once it waits
            await asyncio.sleep(60)

    @reg.handler("after")
    async def after(job: Job) -> str:
        return "fetched"

    q.enqueue("deadline", job_id="d")
    async with running(url, q.name, reg):
        await eventually(lambda: finished(q, "d"), what="the timeout")
        q.enqueue("after", job_id="a")  # the fetch loop still runs
        await eventually(lambda: finished(q, "a"), what="a later job")
    assert state(q, "d") == "failed" and q.result("a") == "fetched"


async def test_contextvars_set_in_a_handler_do_not_leak(url: str, q: Queue) -> None:
    reg = Registry()
    saw: dict[str, str] = {}

    @reg.handler("ctx")
    async def ctx(job: Job) -> None:
        saw[job.id] = _seen.get()
        _seen.set(job.id)  # set in the eager step
        if job.payload:
            await asyncio.sleep(0.01)
            assert _seen.get() == job.id  # still its own after the wait

    ids = [x.job_id for x in q.enqueue_many([{"type": "ctx", "payload": i % 2}
                                             for i in range(40)])]
    async with running(url, q.name, reg, concurrency=5):
        await eventually(lambda: finished(q, *ids), what="jobs to finish")
        assert _seen.get() == ""
    assert all(state(q, i) == "completed" for i in ids)
    assert set(saw.values()) == {""}  # no job saw another's value


async def test_contextvars_do_not_reach_a_job_handed_over_by_a_settling_call(
        url: str, qname: str) -> None:
    """A chain's next step is started for this worker by its dependency's finish.lua and
    launched from that job's own settling call: it still starts from a clean context."""
    from helpers import fast

    from streamq import JobSpec, Worker, chain

    reg = Registry()
    saw: dict[str, str] = {}

    @reg.handler("step")
    async def step(job: Job) -> None:
        saw[job.id] = _seen.get()
        _seen.set(job.id)

    async with Worker(url, [qname], reg, fast(concurrency=1)) as w:
        with Queue.from_url(url, qname) as q:
            await asyncio.sleep(0.2)  # idle: the steps after the first are handed over
            q.enqueue_flow(chain(*(JobSpec("step") for _ in range(6))), flow_id="f")
            await eventually(lambda: finished(q, "f.5"), 30.0, "chain done")
        assert w.stats.handed_over >= 1
    assert saw == {f"f.{i}": "" for i in range(6)}


async def test_a_job_that_cancels_its_own_task_and_ends_spoils_no_later_job(
        url: str, q: Queue) -> None:
    reg = Registry()

    @reg.handler("self_cancel")
    async def self_cancel(job: Job) -> int:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()  # its own task, then it returns without awaiting: it still completes
        return 1

    @reg.handler("wait")
    async def wait(job: Job) -> int:
        await asyncio.sleep(0.01)
        return 2

    ids = [x.job_id for x in q.enqueue_many([{"type": "self_cancel"}, {"type": "wait"},
                                             {"type": "self_cancel"}, {"type": "wait"},
                                             {"type": "wait"}])]
    async with running(url, q.name, reg, concurrency=8):
        await eventually(lambda: finished(q, *ids), what="jobs to finish")
    assert [q.result(i) for i in ids] == [1, 2, 1, 2, 2]


async def test_without_enter_task_each_job_gets_a_task_as_before(
        url: str, q: Queue, monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter without asyncio's _enter_task: the worker makes a task per job."""
    from streamq._worker import running as running_module  # (the worker's job running)

    monkeypatch.setattr(running_module, "EAGER", False)
    reg = Registry()
    made: list[str] = []

    @reg.handler("mixed")
    async def mixed(job: Job) -> int:
        _seen.set(job.id)
        if job.payload:
            await asyncio.sleep(0.01)
        return int(job.payload)

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        made.append(getattr(coro, "__qualname__", type(coro).__name__))
        return asyncio.Task(coro, loop=loop, **kw)

    ids = [x.job_id for x in q.enqueue_many([{"type": "mixed", "payload": i % 2}
                                             for i in range(20)])]
    loop = asyncio.get_running_loop()
    loop.set_task_factory(factory)
    try:
        async with running(url, q.name, reg, concurrency=5):
            await eventually(lambda: finished(q, *ids), what="jobs to finish")
    finally:
        loop.set_task_factory(None)
    assert [q.result(i) for i in ids] == [i % 2 for i in range(20)]
    assert sum("_run_job" in m for m in made) == 20 and "_Carry" not in made
    assert _seen.get() == ""


async def test_resumed_carries_a_started_coroutine_on_with_its_value_and_its_cancel() -> None:
    """A batch runs each attempt's first step itself (Carrier.first_step); an attempt that
    waits is carried on by a coroutine awaiting eager.Resumed: it gets what it waited for,
    its value comes back, and a cancel of its task reaches it where it waits."""
    loop = asyncio.get_running_loop()
    seen: list[str] = []

    async def attempt(gate: asyncio.Future[int]) -> int:
        try:
            got = await gate
        except asyncio.CancelledError:
            seen.append("cancelled where it waited")
            raise
        return got + 1

    async def rest(coro: Any, waiting: Any) -> Any:
        return await eager.Resumed(coro, waiting)

    def started(gate: asyncio.Future[int]) -> eager.Carrier:
        carrier = eager.Carrier(loop)
        coro, ctx = attempt(gate), contextvars.copy_context()
        outer = asyncio.current_task()
        assert outer is not None
        eager.leave_task(loop, outer)  # (no task may be current for a first step)
        try:
            waits, waiting = carrier.first_step(loop, coro, ctx)
        finally:
            eager.enter_task(loop, outer)
        assert waits and waiting is gate
        carrier.carry(rest(coro, waiting), ctx)
        return carrier

    gate: asyncio.Future[int] = loop.create_future()
    carrier = started(gate)
    gate.set_result(41)
    task: Any = carrier.task  # (its value is the carried coroutine's)
    assert await task == 42
    other: asyncio.Future[int] = loop.create_future()
    carrier = started(other)
    await asyncio.sleep(0)  # (the carrier waits on the attempt's future now)
    carrier.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await carrier.task
    assert seen == ["cancelled where it waited"] and other.cancelled()
