"""Run a Python program under a host clock that the chaos harness can step at run time.

Usage: ``python fakeclock.py OFFSET_FILE SCRIPT ARGS...`` or
``python fakeclock.py OFFSET_FILE -m MODULE ARGS...``.

``time.time()`` and ``time.time_ns()`` of the program answer the real time plus an offset in
seconds read from OFFSET_FILE (one number; a missing or empty file is 0). A daemon thread
looks at the file every 50 ms, so the harness steps this process's clock by writing a new
number there: a host clock stepped by NTP or by hand, forwards or backwards, while the process
runs. The monotonic clocks (``time.monotonic``, ``perf_counter``, the event loop's clock) stay
real, as they do on a real host. ``time.clock_gettime(CLOCK_REALTIME)`` stays real too: the
chaos worker writes its ledger with it (the ledger is the harness's clock, one host).

``datetime.datetime.now()`` is not patched (it is C code that reads the system clock): neither
the worker nor the scheduler calls it; every time they use comes from ``time.time()``
(checked by ``tests/chaos/test_chaos.py``'s static check of the engine's sources).
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time
from pathlib import Path

_real_time = time.time
_real_time_ns = time.time_ns
_offset_ns = 0


def read_offset_ns(path: str) -> int:
    try:
        text = Path(path).read_text().strip()
    except OSError:
        return 0
    try:
        return int(float(text or "0") * 1e9)
    except ValueError:
        return 0


def _watch(path: str) -> None:
    global _offset_ns
    seen: tuple[int, int] | None = None
    while True:
        try:
            st = os.stat(path)
            now = (st.st_mtime_ns, st.st_size)
        except OSError:
            now = (0, 0)
        if now != seen:
            seen = now
            _offset_ns = read_offset_ns(path)
        time.sleep(0.05)


def fake_time() -> float:
    return (_real_time_ns() + _offset_ns) / 1e9


def fake_time_ns() -> int:
    return _real_time_ns() + _offset_ns


def install(path: str) -> None:
    global _offset_ns
    _offset_ns = read_offset_ns(path)
    time.time = fake_time
    time.time_ns = fake_time_ns
    threading.Thread(target=_watch, args=(path,), name="chaos-fakeclock", daemon=True).start()


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        raise SystemExit(__doc__)
    install(argv[0])
    if argv[1] == "-m":
        # like ``python -m``: the current directory first on the path (the repository root)
        sys.argv = [argv[2], *argv[3:]]
        sys.path.insert(0, os.getcwd())
        runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv[1:]
        sys.path.insert(0, str(Path(argv[1]).resolve().parent))
        runpy.run_path(argv[1], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
