"""Misuse of the registry and the worker is refused where it is written, with a message that
says what to write instead (no Redis needed)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from streamq import InvalidArgument, Job, Registry, RegistryError, Worker


def test_handler_without_parentheses_is_refused() -> None:
    reg = Registry()
    with pytest.raises(RegistryError) as exc:
        @reg.handler  # type: ignore[arg-type]
        async def send_email(job: Job) -> None: ...
    assert "@registry.handler('send_email')" in str(exc.value)
    assert reg.names() == []


def test_handler_name_must_be_a_string() -> None:
    with pytest.raises(RegistryError, match="job type"):
        Registry().handler(42)  # type: ignore[arg-type]


def test_register_refuses_what_is_not_callable() -> None:
    with pytest.raises(RegistryError) as exc:
        Registry().register("x", "not callable")  # type: ignore[arg-type]
    assert "must be a function taking a Job" in str(exc.value)
    assert "registry.register('x', my_function)" in str(exc.value)


def test_register_with_arguments_swapped_says_so() -> None:
    def send(job: Job) -> None: ...

    with pytest.raises(RegistryError, match=r"register\('email.send', send\)"):
        Registry().register(send, "email.send")  # type: ignore[arg-type]


@pytest.mark.parametrize("fn", [
    lambda: None,
    lambda job, extra: None,
    lambda *, job: None,
])
def test_a_handler_that_cannot_take_a_job_is_refused(fn: Any) -> None:
    with pytest.raises(RegistryError, match="cannot be called with one Job"):
        Registry().register("x", fn)


def test_signature_message_names_the_function_and_the_fix() -> None:
    reg = Registry()
    with pytest.raises(RegistryError) as exc:
        @reg.handler("email.send")
        async def send_email(to: str, subject: str) -> None: ...
    msg = str(exc.value)
    assert "send_email(to, subject)" in msg
    assert "def send_email(job: Job)" in msg


class _Callable:
    def __call__(self, job: Job) -> int:
        return 1


@pytest.mark.parametrize("fn", [
    lambda job: None,
    lambda job, retries=3: None,
    lambda *args: None,
    lambda job, **kw: None,
    functools.partial(lambda extra, job: None, 1),
    _Callable(),
    print,  # a builtin: no complaint about what cannot be inspected
])
def test_callables_that_take_one_job_are_accepted(fn: Any) -> None:
    Registry().register("x", fn)


def test_worker_refuses_a_string_for_queues() -> None:
    with pytest.raises(InvalidArgument) as exc:
        Worker("redis://127.0.0.1:1/0", "emails", Registry())
    assert "Worker(url, ['emails'], registry)" in str(exc.value)
    with pytest.raises(InvalidArgument):
        Worker("redis://127.0.0.1:1/0", 7, Registry())  # type: ignore[arg-type]


def test_a_handler_registered_after_a_lookup_is_found() -> None:
    """``Registry.found`` (the worker's lookup per job without a call) keeps what ``get``
    answered, and forgets it when a handler is registered: a version registered later wins
    over the any-version handler found before."""
    reg = Registry()

    @reg.handler("t")
    async def any_version(job: Job) -> None: ...

    spec = reg.get("t", 2)
    assert spec is not None and spec.fn is any_version and reg.found[("t", 2)] is spec

    @reg.handler("t", version=2)
    async def second(job: Job) -> None: ...

    assert ("t", 2) not in reg.found
    got = reg.get("t", 2)
    assert got is not None and got.fn is second and reg.found[("t", 2)] is got
    assert reg.get("nope") is None and ("nope", 1) not in reg.found
