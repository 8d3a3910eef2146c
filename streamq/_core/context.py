"""The worker context: shared resources (a DB pool, an HTTP client) that startup hooks build
once per process and every handler reads as ``job.ctx``."""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


class Context(dict[str, Any]):
    """A mapping of shared resources, also readable as attributes: a startup hook writes
    ``ctx["db"] = pool`` (or ``ctx.db = pool``), a handler reads ``job.ctx.db`` or, typed,
    ``job.ctx.get_as("db", Pool)``."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            has = ", ".join(sorted(self)) or "nothing"
            raise AttributeError(f"the worker context has no {name!r} (it has: {has}); a"
                                 f" startup hook (@registry.on_startup) sets ctx.{name}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def __delattr__(self, name: str) -> None:
        try:
            del self[name]
        except KeyError:
            raise AttributeError(name) from None

    def get_as(self, key: str, cls: type[T]) -> T:
        """``self[key]``, checked to be a ``cls`` (a type checker then knows its type)."""
        try:
            value = self[key]
        except KeyError:
            raise KeyError(f"the worker context has no {key!r} (it has:"
                           f" {', '.join(sorted(self)) or 'nothing'}); a startup hook"
                           f" (@registry.on_startup) sets it") from None
        if not isinstance(value, cls):
            raise TypeError(f"the worker context's {key!r} is a {type(value).__name__},"
                            f" not a {cls.__name__}")
        return value
