"""Stopping ``streamq demo`` and ``streamq demo --web`` (SIGTERM) leaves no process behind: not
its workers, not its scheduler, not its private redis-server, not a worker that was frozen
(SIGSTOP) when the stop came, not one the web demo's pool started during a rolling restart.

Every process the demo starts, at any depth, inherits a token in its environment; the tests
look for it in /proc, so a process reparented to pid 1 is found as well as a child."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from dashboard_support import csrf_of

from streamq._core.server import free_port

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs /proc")]

TOKEN = "STREAMQ_TEST_DEMO_TOKEN"


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [0] state, [1] ppid, [19] start."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _state(pid: int) -> str:
    st = _stat(pid)
    return "gone" if st is None else st[0]


def _descendants(root: int) -> set[tuple[int, str]]:
    """(pid, start time) of every live process below ``root``."""
    children: dict[int, list[tuple[int, str]]] = {}
    for d in Path("/proc").iterdir():
        st = _stat(int(d.name)) if d.name.isdigit() else None
        if st is not None and st[0] not in ("Z", "X"):
            children.setdefault(int(st[1]), []).append((int(d.name), st[19]))
    out: set[tuple[int, str]] = set()
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            out.add(child)
            todo.append(child[0])
    return out


def _alive(procs: set[tuple[int, str]]) -> set[tuple[int, str]]:
    """Those still running (a pid now used by another process is not theirs)."""
    return {(pid, start) for pid, start in procs
            if (st := _stat(pid)) is not None and st[19] == start and st[0] not in ("Z", "X")}


def _marked(token: str) -> dict[int, str]:
    """pid -> command line of every live process (zombies aside) carrying ``token``."""
    needle = f"{TOKEN}={token}".encode()
    out: dict[int, str] = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if needle not in (d / "environ").read_bytes().split(b"\0"):
                continue
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if _state(int(d.name)) not in ("Z", "X", "gone"):
            out[int(d.name)] = cmd
    return out


def _poll(what: str, cond: object, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not callable(cond) or not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def token() -> Iterator[str]:
    t = uuid.uuid4().hex
    yield t
    for pid in _marked(t):  # a failed test leaves nothing running either
        os.kill(pid, signal.SIGKILL)


def _start(token: str, tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, TOKEN: token, "STREAMQ_URL": ""}
    out = (tmp_path / "demo.log").open("wb")
    return subprocess.Popen([sys.executable, "-m", "streamq", "demo", *args], env=env,
                            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)


def _workers(token: str) -> list[int]:
    return [pid for pid, cmd in _marked(token).items() if " worker " in cmd]


def _freeze_and_stop(demo: subprocess.Popen[bytes], token: str, victims: list[int]) -> None:
    """Freeze ``victims``, SIGTERM the demo, and wait until none of its processes is left:
    neither one below it now (redis-server included, whose environment is overwritten by
    its process title) nor one started later (found by the token)."""
    for victim in victims:
        os.kill(victim, signal.SIGSTOP)
    _poll("the workers to freeze", lambda: all(_state(v) in ("T", "t") for v in victims), 30)
    below = _descendants(demo.pid)
    server = Path(os.environ.get("STREAMQ_REDIS_SERVER", "redis-server")).name.encode()
    assert any(server in Path(f"/proc/{pid}/cmdline").read_bytes()
               for pid, _ in below), below  # (the suite's Valkey leg: valkey-server)
    assert len(below) >= 3  # redis-server and the workers
    demo.send_signal(signal.SIGTERM)
    try:
        demo.wait(120)
        _poll("every process of the demo to end",
              lambda: not _marked(token) and not _alive(below), 60)
    finally:  # a failed test leaves nothing running either
        for pid, _ in _alive(below):
            os.kill(pid, signal.SIGKILL)


def test_sigterm_to_the_web_demo_leaves_no_process(token: str, tmp_path: Path) -> None:
    port = free_port()
    demo = _start(token, tmp_path, "--web", "--port", str(port))
    try:
        base = f"http://127.0.0.1:{port}"
        _poll("the web demo's ready line", lambda: "open http" in (
            tmp_path / "demo.log").read_text(errors="replace"), 180)
        _poll("two workers", lambda: len(_workers(token)) >= 2, 60)
        with httpx.Client(base_url=base, timeout=30) as c:
            token_ = csrf_of(c.get("/demo").text)
            # a rolling restart (new behaviour settings) replaces every worker: the pool's
            # supervisor must not start a replacement that the restart then drops
            resp = c.post("/demo/pool", data={"csrf": token_, "size": "3",
                                              "latency_ms": "50", "failure": "0", "hang": "0"})
            assert resp.status_code == 200, resp.text[:500]
        _poll("three workers", lambda: len(_workers(token)) == 3, 60)
        _freeze_and_stop(demo, token, _workers(token)[:1])
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def test_sigterm_to_the_terminal_demo_leaves_no_process(token: str, tmp_path: Path) -> None:
    demo = _start(token, tmp_path)
    try:
        _poll("three workers", lambda: len(_workers(token)) >= 3, 120)
        # all of them: the tour cannot end by itself before the SIGTERM comes
        _freeze_and_stop(demo, token, _workers(token))
        log = (tmp_path / "demo.log").read_text(errors="replace")
        assert demo.returncode in (130, 143), (demo.returncode, log[-1500:])
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
