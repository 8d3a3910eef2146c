"""Which server errors are transient, in one place, and retries of idempotent client calls.

A transient error says "not now": the connection dropped or timed out, or the server answered
OOM (``maxmemory``), READONLY (a failover in progress), BUSY (a slow script), LOADING (a
restart), MISCONF, TRYAGAIN, CLUSTERDOWN or MASTERDOWN, or redis-py's cluster client gave up
following redirects (``TTL exhausted``: a slot mid-migration). The same call may succeed later, so
callers retry it (idempotent calls) or keep what they hold and try again (background loops).
Every other error is permanent for that call: a bug, a corrupted key, a refused permission.

``call``/``acall`` retry an idempotent call across transient errors with tenacity. The first try
runs directly (no retry machinery on the hot path); only after a transient failure does tenacity
take over, telling the call it is a retry so it can recognise its own earlier write (see the
enqueue and cancel reply parsing).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import TypeVar

from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    MasterDownError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from tenacity import (
    AsyncRetrying,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

T = TypeVar("T")
TRANSIENT = (RedisConnectionError, RedisTimeoutError)  # BusyLoadingError (LOADING) included
"""Errors that are transient by their type alone (connection level). Use :func:`transient`
to classify any exception, server replies included."""
_TRANSIENT_REPLIES = (OutOfMemoryError, ReadOnlyError, TryAgainError, ClusterDownError,
                      MasterDownError)
_TRANSIENT_CODES = frozenset({"OOM", "READONLY", "BUSY", "LOADING", "MISCONF", "TRYAGAIN",
                              "CLUSTERDOWN", "MASTERDOWN", "NOREPLICAS", "UNBLOCKED"})
_CODE_RE = re.compile(r"(?:^|-|caused error: \(?'?)(" + "|".join(sorted(_TRANSIENT_CODES))
                      + r") ")
RETRIES = 4
"""Further tries after a transient failure, with exponential backoff and jitter (≈ 3 s in all)."""


def transient(exc: BaseException) -> bool:
    """True when ``exc`` (or the server error it wraps, e.g. inside a ScriptError) is one that
    the same call may not meet again later. The one classification used everywhere."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 4:  # a ScriptError wraps the server's ResponseError
        if isinstance(cur, (*TRANSIENT, *_TRANSIENT_REPLIES)):
            return True
        if isinstance(cur, ClusterError) and "TTL exhausted" in str(cur):
            # redis-py gave up following MOVED/ASK/TRYAGAIN (a slot being migrated): every
            # try was refused before it ran, so the call may be made again later
            return True
        if isinstance(cur, ResponseError):
            # a script's redis.call error keeps the server's code first (Redis 7) or quotes
            # it as "-CODE ..." inside ERR Error running script (Redis 6.2); a pipeline wraps
            # it as "Command # 1 (...) of pipeline caused error: ('CODE ...',)"
            return _CODE_RE.search(str(cur)) is not None
        cur = cur.__cause__
        seen += 1
    return False


def _policy() -> dict[str, object]:
    return {
        "stop": stop_after_attempt(RETRIES),
        "wait": wait_exponential_jitter(multiplier=0.1, max=2.0),
        "retry": retry_if_exception(transient),
        "reraise": True,
    }


def call(fn: Callable[[bool], T]) -> T:
    """Run ``fn(retried)``; on a transient error, retry it with ``retried=True``."""
    try:
        return fn(False)
    except Exception as exc:
        if not transient(exc):
            raise
    for attempt in Retrying(**_policy()):  # type: ignore[arg-type]
        with attempt:
            return fn(True)
    raise AssertionError("unreachable")  # pragma: no cover


async def acall(fn: Callable[[bool], Awaitable[T]]) -> T:
    try:
        return await fn(False)
    except Exception as exc:
        if not transient(exc):
            raise
    async for attempt in AsyncRetrying(**_policy()):  # type: ignore[arg-type]
        with attempt:
            return await fn(True)
    raise AssertionError("unreachable")  # pragma: no cover
