"""What type checkers accept and refuse for typed tasks (checked by mypy in CI:
pyproject's [tool.mypy] files). A refused call carries `# type: ignore[...]`; with
warn_unused_ignores (strict), a call that stopped being refused fails the check."""

from __future__ import annotations

from typing import assert_type

from streamq import AsyncQueue, EnqueueResult, Job, Queue, Registry, Task

registry = Registry()


@registry.task("email.send")
async def send_email(to: str, subject: str, urgent: bool = False) -> dict[str, str]:
    return {"to": to}


@registry.task("math.add")
def add(a: int, b: int) -> int:
    return a + b


@registry.task("report.render")
def render(job: Job, report_id: int) -> str:  # the Job first: handed in, not enqueued
    return f"{report_id} on attempt {job.attempt}"


def handles(t: Task[..., int]) -> None: ...


handles(add)


async def accepted(aq: AsyncQueue, q: Queue) -> None:
    assert_type(await send_email.enqueue(aq, to="a@b", subject="hi"), EnqueueResult)
    assert_type(await send_email.enqueue(aq, "a@b", "hi", True), EnqueueResult)
    assert_type(add.enqueue_sync(q, 1, b=2), EnqueueResult)
    assert_type(await add.enqueue_and_wait(aq, 1, 2), int)
    assert_type(add.enqueue_and_wait_sync(q, 1, 2), int)
    assert_type(await send_email.result(aq, "job-1"), dict[str, str])
    assert_type(add.options(delay=10).enqueue_sync(q, 1, 2), EnqueueResult)
    assert_type(render.enqueue_sync(q, report_id=7), EnqueueResult)
    assert_type(await render.result(aq, "job-2"), str)


async def refused(aq: AsyncQueue, q: Queue) -> None:
    await send_email.enqueue(aq, to="a@b")  # type: ignore[call-arg]
    await send_email.enqueue(aq, to=1, subject="hi")  # type: ignore[arg-type]
    await send_email.enqueue(aq, to="a@b", subject="hi", bcc="x")  # type: ignore[call-arg]
    add.enqueue_sync(q, "1", 2)  # type: ignore[arg-type]
    add.enqueue_sync(aq, 1, 2)  # type: ignore[arg-type]
    await add.enqueue(q, 1, 2)  # type: ignore[arg-type]
    text: str = add.enqueue_and_wait_sync(q, 1, 2)  # type: ignore[assignment]
    render.enqueue_sync(q, "7")  # type: ignore[arg-type]
    render.enqueue_sync(q, 7, 8)  # type: ignore[call-arg]  # the Job is not enqueued
    del text
