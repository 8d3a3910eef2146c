"""A private Sentinel setup (tests, benchmarks): one primary, its replicas and three sentinels.

Every process listens on 127.0.0.1 on a free port (never 6379 or 26379) and keeps its files in
one temporary directory; :meth:`SentinelSet.close` stops them all and removes it. The binary is
``$STREAMQ_REDIS_SERVER`` (default ``redis-server``; ``valkey-server`` works the same:
``--sentinel`` runs it as a sentinel). Sentinels fail over fast: a primary that does not answer
for ``down_after_ms`` (1 s) is down, and two of the three sentinels must agree.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from .server import RedisServer, answering, free_port


class _Sentinel:
    def __init__(self, binary: str, directory: Path, index: int) -> None:
        self.binary = binary
        self.dir = directory / f"sentinel-{index}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, name: str, primary_port: int, down_after_ms: int,
              failover_timeout_ms: int) -> None:
        """Start the sentinel and wait until it answers; on a port taken between the probe
        and the bind (another test's server), again on another port (as RedisServer.start)."""
        for _ in range(5):
            self._spawn(name, primary_port, down_after_ms, failover_timeout_ms)
            if self._wait_up():
                return
            self.stop()
            self.port = free_port()
        raise RuntimeError(f"redis sentinel did not start; see {self.dir / 'sentinel.log'}")

    def _wait_up(self) -> bool:
        assert self.proc is not None
        return answering(self.proc, self.port)

    def _spawn(self, name: str, primary_port: int, down_after_ms: int,
               failover_timeout_ms: int) -> None:
        conf = self.dir / "sentinel.conf"
        conf.write_text("\n".join([
            f"port {self.port}", "bind 127.0.0.1", "daemonize no", f"dir {self.dir}",
            f"logfile {self.dir / 'sentinel.log'}", "sentinel resolve-hostnames no",
            f"sentinel monitor {name} 127.0.0.1 {primary_port} 2",
            f"sentinel down-after-milliseconds {name} {down_after_ms}",
            f"sentinel failover-timeout {name} {failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1", ""]))
        self.proc = subprocess.Popen([self.binary, str(conf), "--sentinel"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, protocol=2, socket_timeout=2.0,
                           socket_connect_timeout=0.5, decode_responses=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class SentinelSet:
    """``redis+sentinel://`` over a primary, ``replicas`` replicas and three sentinels."""

    def __init__(self, *, name: str = "streamq-primary", replicas: int = 1,
                 sentinels: int = 3, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000, binary: str | None = None) -> None:
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix="streamq-sentinel-"))
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.primary = RedisServer(directory=str(self.dir / "node-0"), binary=binary,
                                   extra=_REPL)
        self.binary = self.primary.binary
        self.replicas = [RedisServer(directory=str(self.dir / f"node-{i + 1}"),
                                     binary=self.binary, extra=_REPL) for i in range(replicas)]
        self.sentinels = [_Sentinel(self.binary, self.dir, i) for i in range(sentinels)]
        for node in (self.primary, *self.replicas):
            node.dir.mkdir(parents=True, exist_ok=True)

    @property
    def nodes(self) -> list[RedisServer]:
        """Every data node, primary or replica, in the order they were made."""
        return [self.primary, *self.replicas]

    def url(self, db: int = 0, scheme: str = "redis+sentinel") -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"{scheme}://{hosts}/{self.name}/{db}"

    def start(self, timeout_s: float = 60.0) -> SentinelSet:
        try:
            self.primary.start()
            for replica in self.replicas:
                replica.extra = (*_REPL, "--replicaof", "127.0.0.1", str(self.primary.port))
                replica.start()
            for s in self.sentinels:
                s.start(self.name, self.primary.port, self.down_after_ms,
                        self.failover_timeout_ms)
            self.wait_ready(timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def _ask(self, *args: str) -> list[Any]:
        """The answer of each sentinel to one command (None where it did not answer)."""
        out: list[Any] = []
        for s in self.sentinels:
            c = s.client()
            try:
                out.append(c.execute_command(*args))  # type: ignore[no-untyped-call]
            except redis.RedisError:
                out.append(None)
            finally:
                c.close()
        return out

    def primary_port(self) -> int | None:
        """The port every sentinel names as the primary, or None while they disagree."""
        ports = {int(a[1]) if a else None
                 for a in self._ask("SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)}
        return ports.pop() if len(ports) == 1 else None

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until every replica is in sync and every sentinel knows the primary, every replica
        and every other sentinel (a failover needs the sentinels to know each other)."""
        want_r, want_s = len(self.replicas), len(self.sentinels) - 1
        end = time.monotonic() + timeout_s
        while True:
            if self._synced() and all(
                    r is not None and len(r) >= want_r
                    for r in self._ask("SENTINEL", "REPLICAS", self.name)) and all(
                    s is not None and len(s) >= want_s
                    for s in self._ask("SENTINEL", "SENTINELS", self.name)):
                return
            if time.monotonic() > end:
                raise RuntimeError(f"sentinels not ready after {timeout_s}s: {self._state()}"
                                   f" (want {want_r} replicas, {want_s} other sentinels)")
            time.sleep(0.05)

    def _state(self) -> str:
        """What each sentinel knows (for a setup that never got ready)."""
        def sizes(*args: str) -> list[int | None]:
            return [None if r is None else len(r) for r in self._ask(*args)]
        return (f"replicas in sync {self._synced()}; each sentinel's primary"
                f" {self._ask('SENTINEL', 'GET-MASTER-ADDR-BY-NAME', self.name)}, replicas"
                f" {sizes('SENTINEL', 'REPLICAS', self.name)}, other sentinels"
                f" {sizes('SENTINEL', 'SENTINELS', self.name)}, running"
                f" {[x.proc is not None and x.proc.poll() is None for x in self.sentinels]}")

    def _synced(self) -> bool:
        port = self.primary_port()
        if port is None:
            return False
        c = redis.Redis(port=port, protocol=2, socket_timeout=2.0, socket_connect_timeout=0.5)
        try:
            info: dict[str, Any] = c.info("replication")
        except redis.RedisError:
            return False
        finally:
            c.close()
        online = [v for k, v in info.items() if k.startswith("slave")
                  and isinstance(v, dict) and v.get("state") == "online"]
        return info.get("role") == "master" and len(online) >= len(self.replicas)

    def node(self, port: int) -> RedisServer:
        for n in self.nodes:
            if n.port == port:
                return n
        raise LookupError(f"no node on port {port}")

    def kill_primary(self) -> RedisServer:
        """SIGKILL the current primary (no shutdown, no save); returns it."""
        port = self.primary_port()
        if port is None:
            raise RuntimeError("the sentinels do not agree on a primary")
        victim = self.node(port)
        victim.kill()
        return victim

    def failover(self) -> int:
        """``SENTINEL FAILOVER``: promote a replica while the primary stays up (it is demoted
        to a replica of the new one); returns the old primary's port."""
        port = self.primary_port()
        if port is None:
            raise RuntimeError("the sentinels do not agree on a primary")
        c = self.sentinels[0].client()
        try:
            c.execute_command("SENTINEL", "FAILOVER", self.name)  # type: ignore[no-untyped-call]
        finally:
            c.close()
        return port

    def wait_failover(self, old_port: int, timeout_s: float = 30.0) -> int:
        """Until every sentinel names a primary other than ``old_port`` that answers as one;
        returns its port."""
        end = time.monotonic() + timeout_s
        while True:
            port = self.primary_port()
            if port is not None and port != old_port and _role(port) == "master":
                return port
            if time.monotonic() > end:
                raise RuntimeError(f"no failover after {timeout_s}s; see {self.dir}")
            time.sleep(0.05)

    def rejoin(self, node: RedisServer, timeout_s: float = 30.0) -> None:
        """Start a killed node again, as a replica of the current primary (what an operator
        does), and wait until it is in sync and known to every sentinel."""
        port = self.primary_port()
        if port is None:
            raise RuntimeError("the sentinels do not agree on a primary")
        node.extra = (*_REPL, "--replicaof", "127.0.0.1", str(port))
        node.start()
        self.wait_ready(timeout_s)

    def __enter__(self) -> SentinelSet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for s in self.sentinels:
            s.stop()
        for n in self.nodes:
            n.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


_REPL = ("--repl-diskless-sync", "no", "--repl-diskless-sync-delay", "0")
"""A replica syncs at once (the default waits 5 s for more replicas to share one transfer)."""


def _role(port: int) -> str:
    c = redis.Redis(port=port, protocol=2, socket_timeout=2.0, socket_connect_timeout=0.5)
    try:
        return str(c.info("replication").get("role"))
    except redis.RedisError:
        return ""
    finally:
        c.close()
