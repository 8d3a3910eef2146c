"""A private redis-server (demo, tests, benchmarks): free port, temp dir, never 6379.

The binary is ``$STREAMQ_REDIS_SERVER`` (default ``redis-server`` on PATH), so the same suite
runs against Valkey (``STREAMQ_REDIS_SERVER=valkey-server``) or another Redis build.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def answering(proc: subprocess.Popen[bytes], port: int, tries: int = 200) -> bool:
    """Whether the server (or sentinel) ``proc`` started on ``port`` answers PING within
    ``tries`` polls 25 ms apart (a server still LOADING is waited for); False once it exited
    (e.g. the port was taken between probe and bind)."""
    client = redis.Redis(port=port, socket_connect_timeout=0.2, protocol=2)
    try:
        for _ in range(tries):
            if proc.poll() is not None:
                return False
            try:
                if client.ping():
                    return True
            except redis.exceptions.BusyLoadingError:
                pass
            except redis.exceptions.ConnectionError:
                pass
            time.sleep(0.025)
        return False
    finally:
        client.close()


class RedisServer:
    """Start, kill and restart one redis-server process owned by the caller."""

    def __init__(self, *, aof: bool = False, directory: str | None = None,
                 extra: tuple[str, ...] = (), binary: str | None = None) -> None:
        self.binary = binary or os.environ.get("STREAMQ_REDIS_SERVER", "redis-server")
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"redis server binary {self.binary!r} not found on PATH; install"
                               " Redis (apt-get install redis-server) or set STREAMQ_REDIS_SERVER")
        self.aof = aof
        self._own_dir = directory is None
        self.dir = Path(directory or tempfile.mkdtemp(prefix="streamq-redis-"))
        self.extra = extra
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        for _ in range(5):
            args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
                    "--dir", str(self.dir), "--save", "", "--daemonize", "no",
                    "--logfile", str(self.dir / "redis.log"),
                    "--appendonly", "yes" if self.aof else "no", *self.extra]
            if self.aof:
                # the base file as commands, not an RDB: check-aof (repair_aof) reads no RDB
                # preamble newer than its own format, and Valkey 9 writes VALKEY080 ones that
                # its own valkey-check-aof cannot read (valkey-io/valkey#4739); the same on
                # every server, so a restart loads the same kind of file everywhere
                args += ["--appendfsync", "always", "--aof-use-rdb-preamble", "no"]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            if self._wait_ready():
                return self
            self.proc.kill()
            self.proc.wait()
            self.port = free_port()  # the port was taken between probe and bind
        raise RuntimeError(f"redis-server did not start; see {self.dir / 'redis.log'}")

    def _wait_ready(self) -> bool:
        assert self.proc is not None
        return answering(self.proc, self.port)

    def kill(self) -> None:
        """SIGKILL: no shutdown save; AOF (fsync always) is what survives."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self, *, kill: bool = True) -> None:
        self.kill() if kill else self.stop()
        if not self._wait_port_free():
            raise RuntimeError("port still busy after kill")
        if self.aof:
            self.repair_aof()
        self.start()

    def repair_aof(self) -> str:
        """Cut a torn tail off the AOF of a stopped server the way fixed servers load it:
        before the MULTI of an incomplete MULTI/EXEC block (a script's effects), not just
        before the torn command. A SIGKILL during an AOF write can leave half a block; Redis
        7.0 (``aof-load-truncated yes``) then drops the torn command but keeps the block's
        MULTI and first commands, appends after them, and the next load replays those
        commands inside the following transaction: half a script applied, seconds later
        (valkey-io/valkey#4342). ``redis-check-aof --fix`` (the server binary under that
        name) truncates before the MULTI. Returns its report."""
        manifest = self.dir / "appendonlydir" / "appendonly.aof.manifest"
        target = manifest if manifest.exists() else self.dir / "appendonly.aof"
        if not target.exists():
            return "no AOF"
        done = subprocess.run(["redis-check-aof", "--fix", str(target)], executable=self.binary,
                              input=b"y\n", capture_output=True, timeout=300, check=False)
        report = done.stdout.decode(errors="replace")
        if done.returncode != 0:
            raise RuntimeError(f"redis-check-aof --fix failed ({done.returncode}): "
                               f"{report[-500:]}{done.stderr.decode(errors='replace')[-500:]}")
        return report

    def _wait_port_free(self) -> bool:
        for _ in range(100):
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", self.port))
                    return True
                except OSError:
                    time.sleep(0.05)
        return False

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
