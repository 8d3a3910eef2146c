"""Retries of idempotent client calls across dropped connections (tenacity).

The first try runs directly (no retry machinery on the hot path); only after a transient
failure does tenacity take over, telling the call it is a retry so it can recognise its own
earlier write (see the enqueue and cancel reply parsing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

T = TypeVar("T")
TRANSIENT = (RedisConnectionError, RedisTimeoutError)  # BusyLoadingError included
RETRIES = 4
"""Further tries after a transient failure, with exponential backoff and jitter (≈ 3 s in all)."""


def _policy() -> dict[str, object]:
    return {
        "stop": stop_after_attempt(RETRIES),
        "wait": wait_exponential_jitter(multiplier=0.1, max=2.0),
        "retry": retry_if_exception_type(TRANSIENT),
        "reraise": True,
    }


def call(fn: Callable[[bool], T]) -> T:
    """Run ``fn(retried)``; on a transient error, retry it with ``retried=True``."""
    try:
        return fn(False)
    except TRANSIENT:
        pass
    for attempt in Retrying(**_policy()):  # type: ignore[arg-type]
        with attempt:
            return fn(True)
    raise AssertionError("unreachable")  # pragma: no cover


async def acall(fn: Callable[[bool], Awaitable[T]]) -> T:
    try:
        return await fn(False)
    except TRANSIENT:
        pass
    async for attempt in AsyncRetrying(**_policy()):  # type: ignore[arg-type]
        with attempt:
            return await fn(True)
    raise AssertionError("unreachable")  # pragma: no cover
