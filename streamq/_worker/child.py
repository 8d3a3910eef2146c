"""A handler process of a worker's process pool (pool.py is the parent's side).

The parent starts ``python -m streamq._worker.child IN_FD OUT_FD`` (a fresh interpreter, no
fork of a process that runs threads) and talks to it over two pipes in frames: a 4-byte
length, a 4-byte header length, a JSON header (control fields only: job id, type, attempt,
...) and a body in the queue's serde (the payload one way, the result the other). Nothing of
the job is pickled; the child runs only handlers that its registry, imported by module path
(``module:attribute``), registered by name (invariant 10).

Parent to child: ``hello`` (the registry's module path, the parent's ``sys.path``, the queue's
serde configuration by reference, in JSON), then ``job``, ``cancel`` and ``exit`` frames. Child
to parent: ``ready`` or
``failed`` (startup hooks), then per job any number of ``report`` (progress, log lines) and one
``ok`` or ``err`` (with the child's RSS, for recycling).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import logging
import os
import queue
import runpy
import signal
import struct
import sys
import threading
import traceback
from collections.abc import Awaitable, Generator
from typing import Any, BinaryIO

_HEAD = struct.Struct(">II")
MAX_FRAME = 1 << 30
log = logging.getLogger("streamq.worker")


def frame(header: dict[str, Any], body: bytes = b"") -> bytes:
    """One frame: total length, header length, JSON header, body."""
    head = json.dumps(header, separators=(",", ":")).encode()
    return _HEAD.pack(len(head) + len(body) + 4, len(head)) + head + body


def split(data: bytes) -> tuple[dict[str, Any], bytes]:
    """A frame's (header, body), given what follows its 4-byte total length."""
    (hlen,) = struct.unpack_from(">I", data)
    header: dict[str, Any] = json.loads(data[4:4 + hlen])
    return header, data[4 + hlen:]


def rss_bytes() -> int:
    """This process's resident set size now (Linux /proc), else its peak (getrusage)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def load_registry(spec: str) -> Any:
    """``module:attribute`` (dotted attribute allowed), or ``/path/file.py:attribute`` for a
    script run as ``__main__`` in the parent (run here as ``__mp_main__``, as multiprocessing
    does, so its ``if __name__ == "__main__":`` block does not run again)."""
    where, _, attr = spec.rpartition(":")
    if where.endswith(".py"):
        obj: Any = runpy.run_path(where, run_name="__mp_main__")
        first, _, rest = attr.partition(".")
        obj = obj[first]
        attr = rest
    else:
        obj = importlib.import_module(where)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


def serde_from_ref(ref: dict[str, Any]) -> Any:
    """The queue's serde from its configuration by reference (pool.py's ``serde_ref``)."""
    def arg(v: dict[str, Any]) -> Any:
        if "ref" in v:
            return load_registry(str(v["ref"]))
        if "seq" in v:
            return tuple(arg(x) for x in v["seq"])
        return v.get("v")

    make = load_registry(str(ref["make"]))
    return make(*(arg(a) for a in ref["args"]))


def error_frame(exc: BaseException, rss: int) -> bytes:
    """A handler's exception as data: its class by module and qualified name (the parent
    finds it among the modules it has imported), message, traceback text, and the plain
    attributes that say what happens to the job (Retry.delay_s, RateLimited.retry_after…)."""
    cls = type(exc)
    attrs: dict[str, Any] = {}
    for k, v in getattr(exc, "__dict__", {}).items():
        if isinstance(v, (str, int, float, bool)) or v is None:
            attrs[k] = v
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - an exception's own __str__ failing
        message = f"<{cls.__name__}: str() failed>"
    args = [a for a in exc.args if isinstance(a, (str, int, float, bool)) or a is None] \
        if len(exc.args) == 1 else [message]
    tb = "".join(traceback.format_exception(exc, limit=8))[-4000:]
    return frame({"op": "err", "module": cls.__module__, "qualname": cls.__qualname__,
                  "name": cls.__name__, "message": message[:2000], "args": args,
                  "attrs": attrs, "traceback": tb, "rss": rss})


def _no_rss() -> int:
    return 0


class _Sent(Awaitable[None]):
    """What ``job.progress(...)`` returns in a child: already done (the parent writes it)."""

    def __await__(self) -> Generator[Any, None, None]:
        return
        yield


class Child:
    """The child's side: reads frames on a thread (a cancel arrives while a handler runs),
    runs jobs on the main thread, one at a time."""

    def __init__(self, rfile: BinaryIO, wfd: int) -> None:
        self._rfile = rfile
        self._wfd = wfd
        self._wlock = threading.Lock()
        self._frames: queue.Queue[tuple[dict[str, Any], bytes] | None] = queue.Queue()
        self._current: tuple[str, Any, Any] | None = None  # (job id, cancel flag, task)
        self._clock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        self.registry: Any = None
        self.serde: Any = None

    def send(self, data: bytes) -> None:
        with self._wlock:
            view = memoryview(data)
            while view:
                n = os.write(self._wfd, view)
                view = view[n:]

    def read(self) -> tuple[dict[str, Any], bytes] | None:
        head = self._rfile.read(4)
        if len(head) < 4:
            return None
        (n,) = struct.unpack(">I", head)
        if n > MAX_FRAME:
            raise ValueError(f"frame of {n} bytes")
        data = self._rfile.read(n)
        if len(data) < n:
            return None
        return split(data)

    def _reader(self) -> None:
        """Frames to the main thread, except a cancel: it is applied at once."""
        while True:
            try:
                got = self.read()
            except (OSError, ValueError):
                got = None
            if got is None:
                self._frames.put(None)
                return
            header, _ = got
            if header.get("op") == "cancel":
                with self._clock:
                    cur = self._current
                if cur is not None and cur[0] == header.get("id"):
                    cur[1].set()
                    task = cur[2]
                    if task is not None:
                        self.loop.call_soon_threadsafe(task.cancel)
                continue
            self._frames.put(got)

    def hello(self, header: dict[str, Any], body: bytes) -> None:
        level = header.get("log_level")
        if isinstance(level, int) and not logging.getLogger().handlers:
            logging.basicConfig(level=level, stream=sys.stderr,
                                format="%(asctime)s %(levelname)s %(name)s [pool %(process)d]"
                                " %(message)s")
        sys.path[:] = [p for p in header.get("path", []) if isinstance(p, str)] or sys.path
        from .._core.errors import StartupFailed  # noqa: F401 - the error tree, loaded early
        from .registry import Registry

        self.serde = serde_from_ref(json.loads(body))
        registry = load_registry(str(header["registry"]))
        if not isinstance(registry, Registry):
            raise TypeError(f"{header['registry']!r} is a {type(registry).__name__}, not a"
                            " streamq.Registry")
        self.registry = registry
        self.loop.run_until_complete(registry.lifecycle.start())

    def job(self, header: dict[str, Any], body: bytes) -> bytes:
        from .._core.model import CancelFlag, Job

        spec = self.registry.get(header["type"], header["version"])
        flag = CancelFlag()
        if spec is None:
            exc = LookupError(f"no handler for {header['type']!r} version"
                              f" {header['version']} in the pool's registry")
            return error_frame(exc, rss_bytes())
        deps: tuple[Any, ...] | None = None
        try:
            payload = self.serde.loads(body)
            if header.get("deps"):  # (a job that waited for others: their results)
                from .._core.flow import DependencyResult

                deps = tuple(DependencyResult(**d) for d in payload["deps"])
                payload = payload["payload"]
        except Exception as exc:  # noqa: BLE001 - the parent encoded it: a serde mismatch
            return error_frame(exc, rss_bytes())
        jid = str(header["id"])
        rss = rss_bytes if header.get("rss") else _no_rss  # (only with a memory limit)

        def report(kind: str, value: Any) -> _Sent:
            if kind == "progress":
                from .._core.errors import InvalidArgument

                try:
                    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
                except (TypeError, ValueError) as exc:
                    raise InvalidArgument(f"progress must be plain JSON data (a number, a"
                                          f" string, a dict or a list): {exc}") from exc
            else:
                text = str(value)[:1000]
            self.send(frame({"op": "report", "kind": kind, "value": text}))
            return _Sent()

        job = Job(jid, header["type"], payload, header["attempt"], header["max_attempts"],
                  header["queue"], header["version"], header["idem"], header["headers"],
                  header["trace"], header["deadline_ms"], header["priority"], report, flag,
                  self.registry.lifecycle.ctx, deps)
        try:
            if spec.is_async:
                task = self.loop.create_task(spec.fn(job))
                with self._clock:
                    self._current = (jid, flag, task)
                if header.get("cancelled"):
                    flag.set()
                    task.cancel()
                result = self.loop.run_until_complete(task)
            else:
                with self._clock:
                    self._current = (jid, flag, None)
                if header.get("cancelled"):
                    flag.set()
                result = spec.fn(job)
        except BaseException as exc:  # noqa: BLE001 - the job's failure, judged by the parent
            return error_frame(exc, rss())
        finally:
            with self._clock:
                self._current = None
        if result is None:
            return frame({"op": "ok", "none": True, "rss": rss()})
        try:
            data = self.serde.dumps(result)
        except Exception as exc:  # noqa: BLE001 - a custom serde may raise anything
            return frame({"op": "ok", "unserialisable": f"result not serialisable: {exc!r}"[:2000],
                          "rss": rss()})
        return frame({"op": "ok", "rss": rss()}, data)

    def serve(self) -> int:
        got = self.read()
        if got is None or got[0].get("op") != "hello":
            return 2
        try:
            self.hello(*got)
        except BaseException as exc:  # noqa: BLE001 - told to the parent, which stops
            self.send(frame({"op": "failed", "message": f"{type(exc).__name__}: {exc}"[:2000],
                             "traceback": "".join(traceback.format_exception(exc))[-4000:]}))
            return 3
        self.send(frame({"op": "ready", "pid": os.getpid(), "names": self.registry.names()}))
        threading.Thread(target=self._reader, name="streamq-pool-reader", daemon=True).start()
        while True:
            got = self._frames.get()
            if got is None or got[0].get("op") == "exit":
                break
            if got[0].get("op") == "job":
                self.send(self.job(*got))
        try:
            self.loop.run_until_complete(self.registry.lifecycle.stop())
        finally:
            self.loop.close()
        return 0


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the parent dies (even by SIGKILL), so a
    busy handler is never left behind as an orphan."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the parent died before prctl
            os._exit(1)


def main(argv: list[str]) -> int:
    # Ctrl-C and a SIGTERM to the whole group belong to the parent: it stops the children
    # itself (after their jobs, within its grace period)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _die_with_parent()
    rfd, wfd = int(argv[1]), int(argv[2])
    with os.fdopen(rfd, "rb") as rfile:
        return Child(rfile, wfd).serve()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
