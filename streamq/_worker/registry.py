"""Handler registry: job type (and version) -> code. Workers run nothing that is not here."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from .tasks import TaskDecorator

import attrs

from .._core.config import RetryPolicy
from .._core.context import Context
from .._core.errors import Fail, InvalidArgument, RateLimited, RegistryError, Retry
from .lifecycle import Hook, Lifecycle, check_hook

F = TypeVar("F", bound=Callable[..., Any])
H = TypeVar("H", bound=Hook)
Errors = type[BaseException] | tuple[type[BaseException], ...]
"""An exception type or a tuple of them (``retry_on=``, ``fail_on=``)."""
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
    retry_on: tuple[type[BaseException], ...] | None = None
    """Only these exceptions retry (None: any); another one dead-letters the job at once."""
    fail_on: tuple[type[BaseException], ...] = ()
    """These exceptions dead-letter the job at once (checked before ``retry_on``)."""
    isolation: str | None = None
    """``"process"``: runs in the worker's process pool (a child process; ``timeout`` is a
    hard limit); None: where the worker's ``pool`` says."""
    children: bool = False
    """The handler adds children (``Queue.add_children``): the worker reads the job's
    dependency results before each run (``job.dependency_results()``)."""


def error_types(what: str, value: Any) -> tuple[type[BaseException], ...] | None:
    """``retry_on=`` / ``fail_on=``: an exception class or a non-empty tuple (or list) of
    them, as ``except`` takes; None stays None. Raises InvalidArgument."""
    if value is None:
        return None
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not items:
        raise InvalidArgument(f"{what} needs at least one exception class, got {value!r}"
                              " (for no retries at all, give max_attempts=1)")
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise InvalidArgument(f"{what} takes exception classes (ConnectionError or"
                                  f" (ConnectionError, TimeoutError)), got {item!r}")
        if issubclass(item, (Retry, Fail, RateLimited)):
            raise InvalidArgument(f"{what}: {item.__name__} already says what happens to the"
                                  " job; leave it out")
    return items


def check_isolation(value: Any) -> None:
    if value not in (None, "process"):
        raise InvalidArgument(f"isolation must be None (where the worker's pool says) or"
                              f" 'process' (a child process of the worker's pool), got {value!r}")


def check_handler(name: str, fn: Any) -> None:
    """Refuse what cannot be called with one ``Job``, at registration rather than at run time."""
    if not callable(fn):
        raise RegistryError(
            f"the handler of {name!r} must be a function taking a Job, got"
            f" {type(fn).__name__} {fn!r}: write registry.register({name!r}, my_function)")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # a builtin or extension callable without a signature: judged at run time
    try:
        sig.bind(None)
    except TypeError:
        fn_name = getattr(fn, "__name__", type(fn).__name__)
        params = ", ".join(str(p.replace(annotation=p.empty)) for p in sig.parameters.values())
        raise RegistryError(
            f"the handler of {name!r} cannot be called with one Job: {fn_name}({params});"
            f" write def {fn_name}(job: Job) -> ... and read the arguments from job.payload"
        ) from None


_FOUND_MAX = 10_000
"""(type, version) pairs ``Registry.found`` keeps (versions come from job data)."""


class Registry:
    """Maps job types to handlers.

    ``@registry.handler("email.send", max_attempts=5, timeout=30)``
    """

    def __init__(self) -> None:
        self._handlers: dict[tuple[str, int | None], HandlerSpec] = {}
        self._found: dict[tuple[str, int], HandlerSpec] = {}
        self.found: Mapping[tuple[str, int], HandlerSpec] = self._found
        """What ``get`` answered, by (type, version): read it first for a lookup per job
        without a call (a miss: ask ``get``). Emptied when a handler is registered."""
        self.lifecycle = Lifecycle()
        """The startup and shutdown hooks, and the context they build (lifecycle.py)."""

    @property
    def ctx(self) -> Context:
        """The worker context the startup hooks fill; handlers read it as ``job.ctx``."""
        return self.lifecycle.ctx

    def on_startup(self, fn: H) -> H:
        """Decorate a function ``(ctx: Context) -> None`` (sync or async) that builds shared
        resources into ``ctx`` once per process, before the first job of its first worker
        (``streamq worker`` and an embedded Worker alike). One that raises stops the worker's
        start with :class:`~streamq.StartupFailed`. Hooks run in the order registered."""
        check_hook("on_startup", fn)
        self.lifecycle.startup.append(fn)
        return fn

    def on_shutdown(self, fn: H) -> H:
        """Decorate a function ``(ctx: Context) -> None`` (sync or async) that releases what
        the startup hooks built: it runs once per process, when its last worker stops, after
        that worker's last job was settled or handed back. Every shutdown hook runs, even
        when an earlier one raised (logged)."""
        check_hook("on_shutdown", fn)
        self.lifecycle.shutdown.append(fn)
        return fn

    def register(
        self,
        name: str,
        fn: Callable[..., Any],
        *,
        version: int | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        retry_on: Errors | None = None,
        fail_on: Errors | None = None,
        isolation: str | None = None,
        children: bool = False,
    ) -> HandlerSpec:
        """Register ``fn`` for jobs of type ``name``. ``retry_on``: only these exceptions
        retry, any other one dead-letters the job at once; ``fail_on``: these dead-letter it
        at once (checked first). Both take an exception class or a tuple of them; a timeout
        is a ``TimeoutError``. ``isolation="process"``: run it in a child process of the
        worker's process pool (docs/production.md#isolated-handlers-the-process-pool).
        ``children=True``: the handler adds children and raises WaitForChildren; each run
        gets the job's dependency results (docs/workflows.md#dynamic-children)."""
        if callable(name) and isinstance(fn, str):
            raise RegistryError(
                f"register() takes the job type first: write registry.register({fn!r},"
                f" {getattr(name, '__name__', 'handler')})")
        if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
            raise RegistryError(f"invalid job type name {name!r}: 1-200 of A-Z a-z 0-9 . _ : / -,"
                                " starting with a letter, digit or _")
        check_handler(name, fn)
        if (name, version) in self._handlers:
            raise RegistryError(f"a handler for {name!r} (version {version}) is already registered")
        if max_attempts is not None and (not isinstance(max_attempts, int) or max_attempts < 1):
            raise InvalidArgument(f"max_attempts must be a positive integer, got {max_attempts!r}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or not timeout > 0):
            raise InvalidArgument(f"timeout must be a positive number of seconds, got {timeout!r}")
        check_isolation(isolation)
        retrying = error_types("retry_on", retry_on)
        failing = error_types("fail_on", fail_on) or ()
        both = set(retrying or ()) & set(failing)
        if both:
            raise InvalidArgument(f"{', '.join(sorted(t.__name__ for t in both))} in both"
                                  " retry_on and fail_on: give each exception one rule")
        spec = HandlerSpec(name, fn, inspect.iscoroutinefunction(fn), version, max_attempts,
                           float(timeout) if timeout is not None else None, retry, retrying,
                           failing, isolation, bool(children))
        self._handlers[(name, version)] = spec
        self._found.clear()
        return spec

    def handler(
        self,
        name: str,
        *,
        version: int | None = None,
        max_attempts: int | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        retry_on: Errors | None = None,
        fail_on: Errors | None = None,
        isolation: str | None = None,
        children: bool = False,
    ) -> Callable[[F], F]:
        """Decorator form of :meth:`register`; async functions run on the loop, sync in threads."""
        if callable(name):
            fn_name = getattr(name, "__name__", "handler")
            raise RegistryError(
                f"@registry.handler needs the job type: write @registry.handler({fn_name!r})"
                f" above def {fn_name}(job), not @registry.handler")
        if not isinstance(name, str):
            raise RegistryError(f"@registry.handler takes the job type (a str), got {name!r}")

        error_types("retry_on", retry_on)  # bad rules fail here, not at decoration
        error_types("fail_on", fail_on)
        check_isolation(isolation)

        def deco(fn: F) -> F:
            self.register(name, fn, version=version, max_attempts=max_attempts, timeout=timeout,
                          retry=retry, retry_on=retry_on, fail_on=fail_on,
                          isolation=isolation, children=children)
            return fn

        return deco

    def task(self, name: str, *, version: int | None = None, max_attempts: int | None = None,
             timeout: float | None = None, retry: RetryPolicy | None = None,
             retry_on: Errors | None = None, fail_on: Errors | None = None,
             isolation: str | None = None) -> TaskDecorator:
        """Register a function with typed parameters as a typed task (``Task``): enqueue it
        with its own arguments, get its return type back. A parameter annotated ``Job`` (or
        named ``job``) receives the Job."""
        from .tasks import TaskDecorator

        if callable(name):
            fn_name = getattr(name, "__name__", "task")
            raise RegistryError(f"@registry.task needs the job type: write"
                                f" @registry.task({fn_name!r})")
        error_types("retry_on", retry_on)
        error_types("fail_on", fail_on)
        check_isolation(isolation)
        return TaskDecorator(self, name, {"version": version, "max_attempts": max_attempts,
                                          "timeout": timeout, "retry": retry,
                                          "retry_on": retry_on, "fail_on": fail_on,
                                          "isolation": isolation})

    def get(self, name: str, version: int = 1) -> HandlerSpec | None:
        got = self._handlers.get((name, version)) or self._handlers.get((name, None))
        if got is not None and len(self._found) < _FOUND_MAX:
            self._found[(name, version)] = got
        return got

    def names(self) -> list[str]:
        return sorted({n for n, _ in self._handlers})

    def specs(self) -> list[HandlerSpec]:
        return list(self._handlers.values())
