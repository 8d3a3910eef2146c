"""The process pool (``WorkerConfig(pool="process")`` or ``isolation="process"`` on a handler):
isolated handlers run in child processes (child.py), one job at a time each.

The parent keeps everything that must not depend on handler code: the job's lease (the
LeaseKeeper's thread renews it, so a CPU-bound handler never loses it), the timeout (a hard
limit: the child is killed with SIGKILL and replaced, the attempt fails with TimeoutError),
and the outcome (a handler's exception comes back as its class, message and traceback and is
raised again here, so retry rules, Fail, Retry and RateLimited settle as in-process). A child
that dies mid-job fails only that job's attempt with its exit cause (:class:`ProcessDied`);
its slot gets a fresh child. ``max_jobs_per_child`` and ``max_memory_per_child_mb`` retire a
child between jobs. A stop kills what still runs after the grace period (the worker hands
those jobs back, uncounted) and reaps every child: none outlives the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import json
import logging
import os
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import attrs

from .._core import telemetry as tel
from .._core.errors import ProcessDied, StartupFailed
from .._core.model import Job
from .child import frame, split
from .invoke import Expired
from .registry import Registry

log = logging.getLogger("streamq.worker")
_REAP_S = 5.0
"""How long a child told to exit (after its shutdown hooks) has before it is killed."""
_POLL_CANCEL_S = 0.25
_WHO = "of a process pool child"
_ENTRY = "import sys; from streamq._worker.child import main; sys.exit(main(sys.argv))"


@attrs.frozen
class Encoded:
    """A result the child already encoded in the queue's serde (``data``), or the reason it
    could not (``error``): attempt.py settles it without encoding it again."""

    data: bytes
    error: str = ""


def exit_cause(code: int | None) -> str:
    """'worker process died: signal 9 (SIGKILL)' or '... exited with code 3'."""
    if code is None:
        return "worker process died (exit status unknown)"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"worker process died: signal {-code} ({name})"
    return f"worker process died: exited with code {code}"


class _RemoteTraceback(Exception):
    """The handler's traceback in the child, shown as the cause of the error raised here."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _remote_str(self: BaseException) -> str:
    return str(getattr(self, "_remote_message", ""))


_CLASSES: dict[tuple[str, str], type[BaseException]] = {}


def _as_raised(cls: type[BaseException] | None, name: str, module: str
               ) -> type[BaseException]:
    """A class raised here for an exception of class ``cls`` in a child (None: a class this
    process never imported): a subclass, so ``isinstance`` (fail_on, retry_on, Retry …) sees
    the original class, with the same name and module, whose ``str`` is the child's."""
    key = (module, name if cls is None else cls.__qualname__)
    made = _CLASSES.get(key)
    if made is None:
        base = cls if cls is not None else Exception
        ns = {"__str__": _remote_str, "__module__": module, "__qualname__": key[1],
              "__init__": lambda self, *a, **k: None}
        try:
            made = type(name, (base,), ns)
        except TypeError:  # a class that cannot be subclassed
            made = type(name, (Exception,), ns)
        _CLASSES[key] = made
    return made


def rebuild(header: dict[str, Any]) -> BaseException:
    """The exception a child reported, as an instance raised here (never imports a module:
    a class is looked up among those this process already loaded)."""
    module, qualname = str(header.get("module", "")), str(header.get("qualname", ""))
    name = str(header.get("name", "Exception"))
    # (a script's classes are __mp_main__'s in a child, __main__'s here: child.py)
    cls: Any = sys.modules.get("__main__" if module == "__mp_main__" else module)
    for part in qualname.split("."):
        cls = getattr(cls, part, None) if cls is not None else None
    if not (isinstance(cls, type) and issubclass(cls, BaseException)):
        cls = None
    made = _as_raised(cls, name, module)
    exc = made.__new__(made)
    exc.args = tuple(header.get("args") or ())
    attrs_ = header.get("attrs")
    if isinstance(attrs_, dict):
        for k, v in attrs_.items():
            with contextlib.suppress(AttributeError, TypeError):
                setattr(exc, k, v)
    exc._remote_message = header.get("message", "")  # type: ignore[attr-defined]
    exc.__cause__ = _RemoteTraceback(header.get("traceback", ""))
    return exc


def registry_spec(registry: Registry) -> str | None:
    """``module:attribute`` naming ``registry`` in a module of its handlers (or
    ``/path/script.py:attribute`` for a script run as __main__), None when not found."""
    seen: set[str] = set()
    for spec in registry.specs():
        fn = inspect.unwrap(spec.fn)
        for obj in (fn, getattr(fn, "__self__", None)):
            mod_name = getattr(obj, "__module__", None)
            if not isinstance(mod_name, str) or mod_name in seen:
                continue
            seen.add(mod_name)
            module = sys.modules.get(mod_name)
            for attr, value in vars(module or object()).items():
                if value is registry:
                    if mod_name == "__main__":
                        path = getattr(module, "__file__", None)
                        return f"{os.path.abspath(path)}:{attr}" if path else None
                    return f"{mod_name}:{attr}"
    return None


def _expire(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_exception(Expired("; its process was killed"))


class _Watch:
    """Looks at a running job's cancel flag every quarter second (a plain flag, set on the
    event loop or the renewal thread) and tells the child once it is set."""

    def __init__(self, loop: asyncio.AbstractEventLoop, child: _Proc, job_id: str,
                 cancel: Any, fut: asyncio.Future[Any]) -> None:
        self._loop, self._child, self._id, self._cancel, self._fut = (loop, child, job_id,
                                                                        cancel, fut)
        self._handle: asyncio.TimerHandle | None = None
        if cancel is not None:
            self._handle = loop.call_later(_POLL_CANCEL_S, self._look)

    def _look(self) -> None:
        self._handle = None
        if self._fut.done():
            return
        if self._cancel.is_set():
            self._child.send(frame({"op": "cancel", "id": self._id}))
            return
        self._handle = self._loop.call_later(_POLL_CANCEL_S, self._look)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None


class _Frames(asyncio.Protocol):
    """The child's pipe: frames to ``on_frame`` as they arrive; EOF to ``on_eof``."""

    def __init__(self, proc: _Proc) -> None:
        self._proc = proc
        self._buf = bytearray()

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        while len(buf) >= 4:
            (n,) = struct.unpack_from(">I", buf)
            if len(buf) < 4 + n:
                return
            got = split(bytes(buf[4:4 + n]))
            del buf[:4 + n]
            self._proc.on_frame(got)

    def eof_received(self) -> bool | None:
        self._proc.on_eof()
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self._proc.on_eof()


class _Proc:
    """One child process and its pipes. ``expect()`` before a request: the future of the
    next frame that is not a report (reports go to ``on_report`` meanwhile)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self.proc = proc
        self.transport: asyncio.WriteTransport | None = None
        self.reader: asyncio.BaseTransport | None = None
        self.jobs = 0
        self.rss = 0
        self.eof = False
        self.waiter: asyncio.Future[tuple[dict[str, Any], bytes]] | None = None
        self.on_report: Callable[[dict[str, Any]], None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def expect(self) -> asyncio.Future[tuple[dict[str, Any], bytes]]:
        fut = self.waiter = asyncio.get_running_loop().create_future()
        if self.eof:
            fut.set_exception(asyncio.IncompleteReadError(b"", None))
        return fut

    def on_frame(self, got: tuple[dict[str, Any], bytes]) -> None:
        if got[0].get("op") == "report":
            if self.on_report is not None:
                self.on_report(got[0])
            return
        fut, self.waiter = self.waiter, None
        if fut is not None and not fut.done():
            fut.set_result(got)

    def on_eof(self) -> None:
        self.eof = True
        fut, self.waiter = self.waiter, None
        if fut is not None and not fut.done():
            fut.set_exception(asyncio.IncompleteReadError(b"", None))

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError, OSError):
            self.proc.kill()

    async def reap(self, within_s: float) -> int | None:
        """Wait (polling, off the event loop's back) for the exit; kill it at the end."""
        end = time.monotonic() + within_s
        while self.proc.poll() is None and time.monotonic() < end:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # (a Popen has no awaitable exit; it is short)
        if self.proc.poll() is None:
            self.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(2.0)
        for t in (self.transport, self.reader):
            if t is not None:
                t.close()
        return self.proc.returncode


class ProcessPool:
    """Up to ``size`` children, each running one job at a time."""

    def __init__(self, size: int, registry: str, serde: Any, *,
                 max_jobs_per_child: int | None = None,
                 max_memory_per_child_mb: float | None = None,
                 start_timeout_s: float = 60.0, names: list[str] | None = None) -> None:
        self.size = size
        self.names = list(names or [])
        """Job types the children must have (the parent's registry's)."""
        self.registry = registry
        self._serde = serde
        try:
            self._serde_blob = json.dumps(serde_ref(serde)).encode()
        except (TypeError, ValueError) as exc:
            raise StartupFailed(_WHO, TypeError(
                f"the queue's serde {serde!r} cannot be sent to the pool's children (it is"
                f" sent as its configuration, by reference): {exc}")) from exc
        self.max_jobs = max_jobs_per_child
        self.max_rss = (int(max_memory_per_child_mb * 1024 * 1024)
                        if max_memory_per_child_mb is not None else None)
        self.start_timeout_s = start_timeout_s
        self._idle: list[_Proc] = []
        self._live: set[_Proc] = set()
        self._slots = asyncio.Semaphore(size)
        self._retiring: set[asyncio.Task[Any]] = set()
        self._starting = 0
        """Replacements being started in the background, not yet in ``_live``."""
        self._refilling = 0
        """Replacements being started in the background (``_refill``), until ready."""
        self._changed = asyncio.Event()
        self._closed = False
        self.started = 0
        """Children started (replacements included)."""
        self.recycled = 0
        """Children retired between jobs (max_jobs_per_child, max_memory_per_child_mb)."""
        self.killed = 0
        """Children killed at a timeout, or at a stop after the grace period."""
        self.died = 0
        """Children that died mid-job (a signal, os._exit, an OOM kill)."""
        self.metrics = tel.PoolCounts(size)
        """The figures of the ``streamq.pool.*`` instruments (docs/observability.md)."""

    def pids(self) -> list[int]:
        """Process ids of the live children."""
        return sorted(p.pid for p in self._live)

    async def start(self) -> None:
        """Start every child (in parallel); raises StartupFailed when one cannot start."""
        made = await asyncio.gather(*(self._spawn() for _ in range(self.size)),
                                    return_exceptions=True)
        errors = [m for m in made if isinstance(m, BaseException)]
        for m in made:
            if isinstance(m, _Proc):
                self._idle.append(m)
        if errors:
            await self.close()
            raise errors[0]
        log.info("process pool: %d children started (%s)", self.size,
                 ", ".join(map(str, self.pids())))

    async def _spawn(self, refill: bool = False) -> _Proc:
        """A new child, ready. ``refill``: one counted in ``_starting`` until it is live."""
        loop = asyncio.get_running_loop()
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        try:
            # fork+exec of a fresh interpreter (safe beside threads: nothing runs in between)
            proc = subprocess.Popen(  # noqa: ASYNC220 - returns once the child is exec'd
                [sys.executable, "-c", _ENTRY, str(to_child_r), str(from_child_w)],
                pass_fds=(to_child_r, from_child_w), stdin=subprocess.DEVNULL, close_fds=True)
        except BaseException:
            for fd in (to_child_r, to_child_w, from_child_r, from_child_w):
                os.close(fd)
            if refill:
                self._starting -= 1
            raise
        os.close(to_child_r)
        os.close(from_child_w)
        child = _Proc(proc)
        self._live.add(child)
        if refill:
            self._starting -= 1
        self.started += 1
        self.metrics.counts["started"] += 1
        try:
            rpipe = os.fdopen(from_child_r, "rb", buffering=0)
            wpipe = os.fdopen(to_child_w, "wb", buffering=0)
            child.reader, _ = await loop.connect_read_pipe(lambda: _Frames(child), rpipe)
            child.transport, _ = await loop.connect_write_pipe(asyncio.Protocol, wpipe)
            ready = child.expect()
            child.send(frame({"op": "hello", "registry": self.registry, "path": sys.path,
                              "log_level": logging.getLogger().getEffectiveLevel()},
                             self._serde_blob))
            try:
                header, _ = await asyncio.wait_for(ready, self.start_timeout_s)
            except (asyncio.IncompleteReadError, ConnectionError):
                code = await child.reap(_REAP_S)
                raise StartupFailed(_WHO, ProcessDied(
                    f"a pool child did not start: {exit_cause(code)}")) from None
            except TimeoutError:
                raise StartupFailed(_WHO, TimeoutError(
                    f"a pool child did not start within {self.start_timeout_s:g} s")) from None
            if header.get("op") != "ready":
                raise StartupFailed(f"{_WHO} ({self.registry})", RuntimeError(
                    f"{header.get('message', '?')}\n{header.get('traceback', '')}"))
            missing = sorted(set(self.names) - set(header.get("names") or ()))
            if missing:
                raise StartupFailed(f"{_WHO} ({self.registry})", LookupError(
                    f"the registry the children import has no handler for"
                    f" {', '.join(missing)}: is {self.registry!r} the worker's registry?"))
        except BaseException:
            child.kill()
            await child.reap(_REAP_S)
            self._live.discard(child)
            raise
        return child

    async def _take(self) -> _Proc:
        """An idle child; or the replacement being started; or a new one."""
        while True:
            while self._idle:
                child = self._idle.pop()
                if child.proc.poll() is None and not child.eof:
                    return child
                self._live.discard(child)  # died while idle: not this job's fault
                self.died += 1
                self.metrics.counts["died"] += 1
                log.warning("process pool: idle child %d %s; replaced", child.pid,
                            exit_cause(child.proc.returncode))
                await child.reap(0)
            if not self._refilling:
                return await self._spawn()
            self._changed.clear()
            await self._changed.wait()

    def _refill(self) -> None:
        """Start a replacement in the background, so the next job finds it ready."""
        if self._closed or len(self._live) + self._starting >= self.size:
            return
        self._starting += 1
        self._refilling += 1

        async def start() -> None:
            try:
                child = await self._spawn(refill=True)
            except Exception as exc:  # noqa: BLE001 - the next job starts one, or says why
                if not self._closed:
                    log.warning("process pool: a replacement child did not start: %s", exc)
            else:
                if self._closed:
                    child.send(frame({"op": "exit"}))
                    await child.reap(_REAP_S)
                else:
                    self._idle.append(child)
            finally:
                self._refilling -= 1
                self._changed.set()

        task = asyncio.ensure_future(start())
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def run(self, job: Job, timeout_s: float | None, cancel: Any) -> Any:
        """Run ``job`` in a child: its result (:class:`Encoded`), or the handler's exception
        raised here; Expired at the timeout (the child killed), ProcessDied when the child
        died. Cancelled (the worker stops): the child is killed, the job is the caller's."""
        if self._closed:
            raise RuntimeError("the process pool is closed")
        body = self._job_frame(job)  # (a SerializationError is the job's failure)
        async with self._slots:  # (waiting for a child: the timeout does not run yet)
            child = await self._take()
            fut = child.expect()
            child.on_report = functools.partial(report, job)
            child.send(body)
            child.jobs += 1
            loop = asyncio.get_running_loop()
            timer = None if timeout_s is None else loop.call_later(timeout_s, _expire, fut)
            watch = _Watch(loop, child, job.id, cancel, fut)
            self.metrics.busy += 1
            try:
                header, data = await fut
            except asyncio.IncompleteReadError:
                self._live.discard(child)
                code = await child.reap(_REAP_S)
                self.died += 1
                self.metrics.counts["died"] += 1
                cause = exit_cause(code)
                log.warning("process pool: child %d running job %s: %s; a fresh child takes"
                            " its place", child.pid, job.id, cause,
                            extra={"job_id": job.id, "queue": job.queue})
                self._refill()
                raise ProcessDied(cause) from None
            except BaseException as exc:  # Expired, CancelledError: the child must go
                self._live.discard(child)
                child.kill()
                self.killed += 1
                if isinstance(exc, Expired):
                    self.metrics.counts["timed_out"] += 1
                    log.warning("process pool: job %s outlived its timeout of %g s; child %d"
                                " killed and replaced", job.id, timeout_s, child.pid,
                                extra={"job_id": job.id, "queue": job.queue})
                self._retire(child, kill=True)
                if not isinstance(exc, asyncio.CancelledError):  # (cancelled: the worker stops)
                    self._refill()
                raise
            finally:
                self.metrics.busy -= 1
                if timer is not None:
                    timer.cancel()
                watch.stop()
                child.on_report = None
            child.rss = int(header.get("rss", 0) or 0)
            self._settle_child(child)
        if header.get("op") == "err":
            raise rebuild(header)
        if header.get("none"):
            return None
        return Encoded(data, str(header.get("unserialisable", "")))

    def _job_frame(self, job: Job) -> bytes:
        """Control fields in the JSON header, the payload in the queue's serde (with the
        results of the jobs it waited for, when it did: docs/workflows.md)."""
        deps = job.dependency_results()
        body: Any = job.payload if not deps else {
            "payload": job.payload, "deps": [attrs.asdict(d, recurse=False) for d in deps]}
        return frame({"op": "job", "id": job.id, "type": job.type, "version": job.version,
                      "attempt": job.attempt, "max_attempts": job.max_attempts,
                      "queue": job.queue, "idem": job.idempotency_key,
                      "headers": job.headers, "trace": job.trace,
                      "deadline_ms": job.deadline_ms, "priority": job.priority,
                      "rss": self.max_rss is not None, "deps": bool(deps)},
                     self._serde.dumps(body))

    def _settle_child(self, child: _Proc) -> None:
        """Back to the idle list, or retired when it ran its share or grew too big."""
        why = cause = ""
        if self.max_jobs is not None and child.jobs >= self.max_jobs:
            why, cause = f"ran {child.jobs} jobs (max_jobs_per_child)", "recycled_max_jobs"
        elif self.max_rss is not None and child.rss >= self.max_rss:
            why = (f"RSS {child.rss / 2 ** 20:.0f} MB over max_memory_per_child_mb"
                   f" ({self.max_rss / 2 ** 20:g})")
            cause = "recycled_max_memory"
        if not why or self._closed:
            self._idle.append(child)
            return
        self.recycled += 1
        self.metrics.counts[cause] += 1
        log.info("process pool: child %d retired: %s", child.pid, why)
        self._live.discard(child)
        self._retire(child, kill=False)
        self._refill()

    def _retire(self, child: _Proc, *, kill: bool) -> None:
        """End a child in the background (its shutdown hooks run unless killed)."""
        if not kill:
            child.send(frame({"op": "exit"}))
        task = asyncio.ensure_future(child.reap(_REAP_S))
        self._retiring.add(task)
        task.add_done_callback(self._retiring.discard)

    async def close(self) -> None:
        """Stop every child: idle ones run their shutdown hooks and exit, any still busy is
        killed (the worker already handed its job back); every child is reaped."""
        self._closed = True
        self.metrics.closed = True
        idle, self._idle = self._idle, []
        for child in idle:
            with contextlib.suppress(Exception):
                child.send(frame({"op": "exit"}))
        if self._retiring:  # replacements being started end as the idle ones (_refill)
            await asyncio.wait(set(self._retiring), timeout=_REAP_S)
        for child in self._live - set(idle):  # (still starting, or a job's never handed back)
            child.kill()
        live, self._live = list(self._live), set()
        await asyncio.gather(*(c.reap(_REAP_S) for c in live), return_exceptions=True)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)



def report(job: Job, header: dict[str, Any]) -> None:
    """A child's ``job.progress(...)`` or ``job.log(...)``, recorded as in-process."""
    try:
        if header.get("kind") == "progress":
            job.progress(json.loads(str(header.get("value", "null"))))
        else:
            job.log(str(header.get("value", "")))
    except Exception as exc:  # noqa: BLE001 - a report too big: the job goes on
        log.warning("job %s: progress report dropped: %s", job.id, exc)


def _ref(obj: Any) -> str:
    """A module-level class or function as ``module:qualname`` (what the child imports)."""
    mod, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(mod, str) or not isinstance(qual, str) or "<" in qual:
        raise TypeError(f"{obj!r} is not a module-level class or function")
    return f"{mod}:{qual}"


def serde_ref(serde: Any) -> dict[str, Any]:
    """The queue's serde as its configuration by reference, in JSON (never pickle): the
    callable its ``__reduce__`` names and that callable's arguments, each None, plain JSON
    data or module-level classes and functions named ``module:qualname`` (the child imports
    them, as it imports the registry the worker names; nothing of a job is involved)."""
    reduce = getattr(serde, "__reduce__", None)
    made = reduce() if callable(reduce) else None
    plain = isinstance(made, tuple) and len(made) >= 2 and callable(made[0]) and not any(
        x is not None for x in made[2:])
    if not plain or made is None:
        raise TypeError(f"{type(serde).__name__} has no plain __reduce__ (callable, args)")

    def arg(v: Any) -> Any:
        if v is None or isinstance(v, (str, int, float, bool)):
            return {"v": v}
        if isinstance(v, (tuple, list)):
            return {"seq": [arg(x) for x in v]}
        return {"ref": _ref(v)}

    return {"make": _ref(made[0]), "args": [arg(a) for a in made[1]]}
