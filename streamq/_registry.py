"""Handler registry: job type (and version) -> code. Workers run nothing that is not here."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from ._config import RetryPolicy
from ._errors import InvalidArgument, RegistryError

F = TypeVar("F", bound=Callable[..., Any])
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._:/-]{0,199}")


@attrs.frozen
class HandlerSpec:
    name: str
    fn: Callable[..., Any]
    is_async: bool
    version: int | None = None
    """None accepts any version of the job type without a more specific handler."""
    max_attempts: int | None = None
    timeout_s: float | None = None
    retry: RetryPolicy | None = None


class Registry:
    """Maps job types to handlers.

    ``@registry.handler("email.send", max_attempts=5, timeout=30)``
    """

    def __init__(self) -> None:
        self._handlers: dict[tuple[str, int | None], HandlerSpec] = {}

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        version: int | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> HandlerSpec:
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise RegistryError(f"invalid job type name {name!r}")
        if (name, version) in self._handlers:
            raise RegistryError(f"a handler for {name!r} (version {version}) is already registered")
        if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
            raise InvalidArgument(f"max_attempts must be a positive integer, got {max_attempts!r}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or not timeout > 0):
            raise InvalidArgument(f"timeout must be a positive number of seconds, got {timeout!r}")
        spec = HandlerSpec(name, fn, inspect.iscoroutinefunction(fn), version, max_attempts,
                           float(timeout) if timeout is not None else None, retry)
        self._handlers[(name, version)] = spec
        return spec

    def handler(
        self,
        name: str,
        *,
        version: int | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
    ) -> Callable[[F], F]:
        """Decorator form of :meth:`register`; async functions run on the loop, sync in threads."""

        def deco(fn: F) -> F:
            self.register(name, fn, version=version, max_attempts=max_attempts, timeout=timeout,
                          retry=retry)
            return fn

        return deco

    def get(self, name: str, version: int = 1) -> HandlerSpec | None:
        return self._handlers.get((name, version)) or self._handlers.get((name, None))

    def names(self) -> list[str]:
        return sorted({n for n, _ in self._handlers})
