"""Typed tasks: ``@registry.task("email.send")`` turns a function with typed parameters into
a handle whose ``enqueue`` takes the function's own arguments (checked by type checkers
through ParamSpec, structured and validated by cattrs at enqueue), and whose results come back
as the function's return type."""

from __future__ import annotations

import datetime as dt
import decimal
import inspect
import typing
import uuid
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, TypeVar, overload

import attrs
import cattrs

from .._core.errors import InvalidArgument, InvalidPayload
from .._core.model import EnqueueResult, Job
from .._producer.flows import JobSpec

if TYPE_CHECKING:
    from .._producer.queue import AsyncQueue, Queue

P = ParamSpec("P")
R = TypeVar("R")

_conv = cattrs.Converter()


def _time_hook(cls: Any) -> Callable[[Any, Any], Any]:
    def structure(value: Any, _: Any) -> Any:
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            return cls.fromisoformat(value) if hasattr(cls, "fromisoformat") else cls(value)
        raise TypeError(f"expected {cls.__name__} or its text, got {type(value).__name__}")

    return structure


for _cls in (dt.datetime, dt.date, dt.time, uuid.UUID, decimal.Decimal):
    _conv.register_structure_hook(_cls, _time_hook(_cls))
    _conv.register_unstructure_hook(_cls, lambda v: v)  # the serde encodes them


def _structure(value: Any, hint: Any, where: str) -> Any:
    if hint is Any or hint is inspect.Parameter.empty:
        return value
    if isinstance(hint, type) and type(value) is hint:
        return value  # already the annotated type (an attrs instance, an enum member ...)
    try:
        return _conv.structure(value, hint)
    except Exception as exc:  # noqa: BLE001 - cattrs raises many types (ClassValidationError ...)
        detail = "; ".join(str(e) for e in getattr(exc, "exceptions", ())) or str(exc)
        raise InvalidArgument(f"{where}: expected {getattr(hint, '__name__', hint)}, got"
                              f" {value!r} ({detail})") from None


def _strict(value: Any, hint: Any, where: str) -> Any:
    """Refuse what the annotation does not describe (cattrs converts leniently: "1" -> 1)."""
    if isinstance(hint, type) and hint in (int, float, str, bool) and not (
            (isinstance(value, hint) and not (hint is int and isinstance(value, bool)))
            or (hint is float and type(value) is int)):
        raise InvalidArgument(f"{where}: expected {hint.__name__}, got"
                              f" {type(value).__name__} {value!r}")
    return _structure(value, hint, where)


@attrs.frozen
class TaskOptions:
    """Enqueue options for one call (``task.options(delay=60).enqueue(...)``)."""

    options: dict[str, Any] = attrs.field(factory=dict)


class Task(Generic[P, R]):
    """A typed handle on a registered handler. Enqueue with the function's own arguments:
    ``await send_email.enqueue(queue, to="a@b", subject="hi")`` (an ``AsyncQueue``) or
    ``send_email.enqueue_sync(queue, ...)`` (a ``Queue``)."""

    def __init__(self, name: str, fn: Callable[..., Any], options: dict[str, Any] | None = None
                 ) -> None:
        self.name = name
        self.fn = fn
        self._sig = inspect.signature(fn)
        self._hints = typing.get_type_hints(fn)
        first = next(iter(self._sig.parameters.values()), None)
        self._job_param = first.name if first is not None and (
            self._hints.get(first.name) is Job or first.name == "job") else None
        """The first parameter, when it is annotated Job (or named job): it gets the Job."""
        self._params = {n: p for n, p in self._sig.parameters.items()
                        if n != self._job_param}
        """The parameters that come from the payload."""
        self._options = dict(options or {})

    def options(self, **options: Any) -> Task[P, R]:
        """The same task with enqueue options (delay, run_at, job_id, max_attempts, ...)."""
        return Task(self.name, self.fn, {**self._options, **options})

    def payload(self, *args: P.args, **kwargs: P.kwargs) -> dict[str, Any]:
        """The arguments, checked against the signature and annotations, as plain data."""
        sig = self._sig.replace(parameters=list(self._params.values()))
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError as exc:
            raise InvalidArgument(f"{self.name}: {exc}") from None
        bound.apply_defaults()
        out: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            hint = self._hints.get(name, Any)
            checked = _strict(value, hint, f"{self.name}: argument {name!r}")
            out[name] = _conv.unstructure(checked, hint if hint is not Any else None)
        return out

    def spec(self, *args: P.args, **kwargs: P.kwargs) -> JobSpec:
        """This task's job as a flow node (``streamq.chain``, ``group``, ``chord``), with the
        options given by ``.options(...)`` (``queue=``, ``job_id=`` among them)."""
        opts = dict(self._options)
        queue, job_id = opts.pop("queue", None), opts.pop("job_id", None)
        return JobSpec(self.name, self.payload(*args, **kwargs), queue=queue, job_id=job_id,
                       **opts)

    async def enqueue(self, queue: AsyncQueue, *args: P.args, **kwargs: P.kwargs) -> EnqueueResult:
        r: EnqueueResult = await queue.enqueue(self.name, self.payload(*args, **kwargs),
                                               **self._options)
        return r

    def enqueue_sync(self, queue: Queue, *args: P.args, **kwargs: P.kwargs) -> EnqueueResult:
        r: EnqueueResult = queue.enqueue(self.name, self.payload(*args, **kwargs),
                                         **self._options)
        return r

    async def enqueue_and_wait(self, queue: AsyncQueue, *args: P.args, **kwargs: P.kwargs) -> R:
        """Enqueue and wait for the typed result; the wait is ``options(timeout=...)``
        (default 30 s)."""
        opts = dict(self._options)
        timeout = opts.pop("timeout", 30.0)
        raw = await queue.enqueue_and_wait(self.name, self.payload(*args, **kwargs),
                                           timeout=timeout, **opts)
        return self.structure_result(raw)

    def enqueue_and_wait_sync(self, queue: Queue, *args: P.args, **kwargs: P.kwargs) -> R:
        opts = dict(self._options)
        timeout = opts.pop("timeout", 30.0)
        raw = queue.enqueue_and_wait(self.name, self.payload(*args, **kwargs),
                                     timeout=timeout, **opts)
        return self.structure_result(raw)

    async def result(self, queue: AsyncQueue, job_id: str, *, timeout: float | None = None) -> R:
        return self.structure_result(await queue.result(job_id, timeout=timeout))

    def result_sync(self, queue: Queue, job_id: str, *, timeout: float | None = None) -> R:
        return self.structure_result(queue.result(job_id, timeout=timeout))

    def structure_result(self, raw: Any) -> R:
        hint = self._hints.get("return", Any)
        if inspect.iscoroutinefunction(self.fn) and typing.get_origin(hint) is Awaitable:
            hint = typing.get_args(hint)[0]
        value: R = _structure(raw, hint, f"{self.name}: result")
        return value

    # the handler the registry runs

    def _arguments(self, job: Job) -> dict[str, Any]:
        """The function's arguments from the payload. Raises InvalidPayload (the job is
        dead-lettered at once: the same payload would fail every attempt)."""
        payload = job.payload
        if not isinstance(payload, dict):
            raise InvalidPayload(f"{self.name}: the payload must be a mapping of arguments,"
                                 f" got {type(payload).__name__}")
        kinds = {p.kind for p in self._params.values()}
        if inspect.Parameter.VAR_KEYWORD not in kinds:
            unknown = sorted(str(k) for k in payload if k not in self._params)
            if unknown:
                raise InvalidPayload(f"{self.name}: unexpected argument(s) {', '.join(unknown)}"
                                     f" (it takes {', '.join(self._params) or 'none'})")
        missing = [n for n, p in self._params.items() if n not in payload
                   and p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        if missing:
            raise InvalidPayload(f"{self.name}: missing argument(s) {', '.join(missing)}")
        try:
            kwargs = {name: _structure(value, self._hints.get(name, Any),
                                       f"{self.name}: argument {name!r}")
                      for name, value in payload.items()}
        except InvalidArgument as exc:
            raise InvalidPayload(str(exc)) from None
        if self._job_param:
            kwargs[self._job_param] = job
        return kwargs

    def _unstructure(self, value: Any) -> Any:
        return _conv.unstructure(value)

    def handler(self) -> Callable[[Job], Any]:
        if inspect.iscoroutinefunction(self.fn):
            async def run_async(job: Job) -> Any:
                return self._unstructure(await self.fn(**self._arguments(job)))

            run_async.__name__ = getattr(self.fn, "__name__", self.name)
            run_async.__module__ = getattr(self.fn, "__module__", run_async.__module__)
            return run_async

        def run(job: Job) -> Any:
            return self._unstructure(self.fn(**self._arguments(job)))

        run.__name__ = getattr(self.fn, "__name__", self.name)
        # (the function's module: a process pool finds the registry there, pool.py)
        run.__module__ = getattr(self.fn, "__module__", run.__module__)
        return run

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the function itself (in tests, or inline)."""
        return self.fn(*args, **kwargs)


class TaskDecorator:
    """What ``@registry.task(name, ...)`` returns: registers the function it decorates."""

    def __init__(self, registry: Any, name: str, options: dict[str, Any]) -> None:
        self._registry = registry
        self._name = name
        self._options = options

    @overload
    def __call__(self, fn: Callable[Concatenate[Job, P], Awaitable[R]]) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[Concatenate[Job, P], R]) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R]) -> Task[P, R]: ...

    def __call__(self, fn: Callable[..., Any]) -> Task[Any, Any]:
        from .._core.errors import RegistryError

        if not callable(fn):
            raise RegistryError(f"@registry.task({self._name!r}) decorates a function, got"
                                f" {fn!r}")
        try:
            t: Task[Any, Any] = Task(self._name, fn)
        except NameError as exc:
            raise RegistryError(f"@registry.task({self._name!r}): cannot resolve the"
                                f" annotations of {getattr(fn, '__name__', fn)}: {exc}") from None
        self._registry.register(self._name, t.handler(), **self._options)
        return t
