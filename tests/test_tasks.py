"""Typed tasks: enqueue with the function's own arguments (validated at enqueue), typed
results back, async and sync functions, the Job on request."""

from __future__ import annotations

import datetime as dt
import enum

import attrs
import pytest
from helpers import fast

from streamq import AsyncQueue, InvalidArgument, Job, Queue, Registry, RegistryError, Worker

registry = Registry()


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


@attrs.frozen
class Address:
    street: str
    city: str


@attrs.frozen
class Receipt:
    to: str
    words: int
    at: dt.date


@registry.task("email.send")
async def send_email(to: str, subject: str, priority: Priority = Priority.LOW,
                     cc: list[str] | None = None) -> Receipt:
    return Receipt(to, len(subject.split()) + len(cc or []), dt.date(2030, 1, 1))


@registry.task("label.print", max_attempts=2)
def print_label(job: Job, address: Address, copies: int) -> str:
    return f"{copies}x {address.street}, {address.city} (attempt {job.attempt})"


async def test_typed_round_trip(url: str, qname: str) -> None:
    async with AsyncQueue.from_url(url, qname) as q, Worker(url, [qname], registry, fast()):
        receipt = await send_email.enqueue_and_wait(q, to="a@b", subject="hello there",
                                                    priority=Priority.HIGH, cc=["c@d"])
        assert receipt == Receipt("a@b", 3, dt.date(2030, 1, 1))
        res = await print_label.enqueue(q, Address("Main St 1", "Oslo"), copies=2)
        label = await print_label.result(q, res.job_id, timeout=5)
        assert label == "2x Main St 1, Oslo (attempt 1)"
        info = await q.get(res.job_id)
        assert info is not None and info.payload == {
            "address": {"street": "Main St 1", "city": "Oslo"}, "copies": 2}


def test_sync_forms(url: str, qname: str) -> None:
    q = Queue.from_url(url, qname)
    r = send_email.options(delay=60, job_id="typed-1").enqueue_sync(q, "x@y", "hi")
    assert (r.job_id, r.status) == ("typed-1", "scheduled")
    info = q.get("typed-1")
    assert info is not None and info.payload == {"to": "x@y", "subject": "hi",
                                                 "priority": "low", "cc": None}


def test_wrong_arguments_are_refused_at_enqueue(url: str, qname: str) -> None:
    q = Queue.from_url(url, qname)
    with pytest.raises(InvalidArgument, match="missing a required argument: 'subject'"):
        send_email.enqueue_sync(q, to="a@b")  # type: ignore[call-arg]
    with pytest.raises(InvalidArgument, match="argument 'copies': expected int, got str '2'"):
        print_label.enqueue_sync(q, Address("s", "c"), copies="2")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="argument 'priority'"):
        send_email.enqueue_sync(q, "a@b", "s", priority="urgent")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="unexpected keyword argument 'job'"):
        print_label.enqueue_sync(q, Address("s", "c"), 1, job=None)  # type: ignore[call-arg]
    assert q.get("anything") is None


def test_the_function_is_still_callable() -> None:
    job = Job("i", "t", None, 3, 3, "q")
    assert print_label(job, Address("a", "b"), 1) == "1x a, b (attempt 3)"


def test_task_without_parentheses_is_refused() -> None:
    with pytest.raises(RegistryError, match=r"@registry.task\('f'\)"):
        @Registry().task  # type: ignore[arg-type]
        def f(x: int) -> int:
            return x
