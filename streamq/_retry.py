"""Retries of idempotent client calls across dropped connections (tenacity)."""

from __future__ import annotations

from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

TRANSIENT = (RedisConnectionError, RedisTimeoutError)  # BusyLoadingError included


def retrying(attempts: int = 5) -> Retrying:
    return Retrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(initial=0.05, max=2.0),
        retry=retry_if_exception_type(TRANSIENT),
        reraise=True,
    )


def async_retrying(attempts: int = 5) -> AsyncRetrying:
    return AsyncRetrying(
        stop=stop_after_attempt(attempts),
        wait=wait_exponential_jitter(initial=0.05, max=2.0),
        retry=retry_if_exception_type(TRANSIENT),
        reraise=True,
    )
