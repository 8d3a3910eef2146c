"""Which server errors are transient, in one place, and retries of idempotent client calls.

A transient error says "not now": the connection dropped or timed out, or the server answered
OOM (``maxmemory``), READONLY (a failover in progress), BUSY (a slow script), LOADING (a
restart), MISCONF, TRYAGAIN, CLUSTERDOWN or MASTERDOWN, or a Redis Cluster redirect (``MOVED``,
``ASK``) still stood after the client followed it (the slot map is changing: a failover or a
reshard; the call did not run), or redis-py's cluster client gave up following redirects
(``TTL exhausted``: a slot mid-migration). The same call may succeed later, so
callers retry it (idempotent calls) or keep what they hold and try again (background loops).
Every other error is permanent for that call: a bug, a corrupted key, a refused permission.
One of them is told apart here too (:func:`layout_changed`): ``STREAMQ_LAYOUT <n>``, a shard
frozen by a reshard refusing a job routed by an old count (enqueue.lua; nothing was written):
never retried as it is, the producer re-reads the layout and re-routes (docs/scaling.md).

``call``/``acall`` retry an idempotent call across transient errors with tenacity. The first try
runs directly (no retry machinery on the hot path); only after a transient failure does tenacity
take over, telling the call it is a retry so it can recognise its own earlier write (see the
enqueue and cancel reply parsing). ``each``/``aeach`` do the same for a call made of several
independent parts (a bulk enqueue's script calls, one per shard): only the parts that failed
transiently are tried again, and each part keeps its own outcome.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

from redis.exceptions import (
    AskError,
    ClusterDownError,
    ClusterError,
    MasterDownError,
    MovedError,
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

from .errors import LayoutChanged

T = TypeVar("T")
TRANSIENT = (RedisConnectionError, RedisTimeoutError)  # BusyLoadingError (LOADING) included
"""Errors that are transient by their type alone (connection level). Use :func:`transient`
to classify any exception, server replies included."""
_TRANSIENT_REPLIES = (OutOfMemoryError, ReadOnlyError, TryAgainError, ClusterDownError,
                      MasterDownError, MovedError, AskError)
"""Server replies that say "not now". A MOVED or ASK that reaches a caller stood after the
client followed it (``nodes.py`` follows each a few rounds, refreshing the slot map): the slot
map is changing (a failover not yet agreed on, a reshard in progress) and the call did not
run, so the same call may succeed later."""
_TRANSIENT_CODES = frozenset({"OOM", "READONLY", "BUSY", "LOADING", "MISCONF", "TRYAGAIN",
                              "CLUSTERDOWN", "MASTERDOWN", "NOREPLICAS", "UNBLOCKED"})
_CODE_RE = re.compile(r"(?:^|-|^user_script:\d+: |caused error: \(?'?)("
                      + "|".join(sorted(_TRANSIENT_CODES)) + r") ")
_LAYOUT_RE = re.compile(r"(?:^|[\s:'(\"-])STREAMQ_LAYOUT (\d+)")
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
            # a script's redis.call error keeps the server's code first (Redis 7; after
            # "user_script:N: " when a write meets READONLY mid-script) or quotes it as
            # "-CODE ..." inside ERR Error running script (Redis 6.2); a pipeline wraps
            # it as "Command # 1 (...) of pipeline caused error: ('CODE ...',)"
            return _CODE_RE.search(str(cur)) is not None
        cur = cur.__cause__
        seen += 1
    return False


def layout_changed(exc: BaseException, queue: str) -> LayoutChanged | None:
    """``exc`` (or the server error it wraps) as LayoutChanged when it is a shard's refusal of
    a job routed by another shard count (``STREAMQ_LAYOUT <count>``: the call wrote nothing),
    else None. Such an error is not transient: the same call would be refused again."""
    seen = 0
    cur: BaseException | None = exc
    while cur is not None and seen < 4:
        if isinstance(cur, LayoutChanged):
            return cur
        if isinstance(cur, ResponseError):
            m = _LAYOUT_RE.search(str(cur))
            return LayoutChanged(queue, int(m.group(1))) if m else None
        cur = cur.__cause__
        seen += 1
    return None


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


class _Again(Exception):
    """Some parts of an ``each`` call failed transiently (the first such error is the cause)."""


def _step(out: list[T | Exception], todo: list[int], got: Sequence[T | Exception]) -> None:
    """File ``got`` (the outcomes of the parts ``todo``) into ``out``; keep in ``todo`` the
    parts to try again (a transient error); raise _Again while there are some."""
    again: list[int] = []
    first: Exception | None = None
    for i, x in zip(list(todo), got, strict=True):
        out[i] = x
        if isinstance(x, Exception) and transient(x):
            again.append(i)
            first = first or x
    todo[:] = again
    if first is not None:
        raise _Again() from first


def each(fn: Callable[[list[int], bool], Sequence[T | Exception]], n: int
         ) -> list[T | Exception]:
    """Parts ``0..n-1`` of an idempotent call: ``fn(parts, retried)`` runs the given parts and
    returns each one's outcome (its value, or its own error). The parts that failed
    transiently are run again (with ``retried=True``) on :func:`call`'s policy, the others are
    kept; returns every part's last outcome."""
    out: list[T | Exception] = [_Again()] * n
    todo = list(range(n))
    with contextlib.suppress(_Again):
        call(lambda retried: _step(out, todo, fn(list(todo), retried)))
    return out


async def aeach(fn: Callable[[list[int], bool], Awaitable[Sequence[T | Exception]]], n: int
                ) -> list[T | Exception]:
    """:func:`each` for an awaitable ``fn``."""
    out: list[T | Exception] = [_Again()] * n
    todo = list(range(n))

    async def once(retried: bool) -> None:
        _step(out, todo, await fn(list(todo), retried))

    with contextlib.suppress(_Again):
        await acall(once)
    return out
