"""A private Redis Cluster on loopback (tests, demo, benchmarks): N primaries, each with R
replicas, every node's files in one temp dir, never a well-known port.

Each node is ``redis-server --cluster-enabled yes`` (the binary is ``$STREAMQ_REDIS_SERVER``,
default ``redis-server``, so Valkey works too); the cluster is formed with ``redis-cli --cluster
create`` (the ``redis-cli`` on PATH, or ``$STREAMQ_REDIS_CLI``). A node's cluster bus listens on
port + 10000, so ports are picked with both free and the bus port ≤ 65535.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

_BUS_OFFSET = 10000


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def cluster_ports(n: int) -> list[int]:
    """``n`` ports, each free with its bus port (port + 10000, ≤ 65535) free too."""
    out: list[int] = []
    rng = random.Random()
    while len(out) < n:
        port = rng.randrange(20000, 65535 - _BUS_OFFSET)
        if port not in out and _free(port) and _free(port + _BUS_OFFSET):
            out.append(port)
    return out


def _cli() -> str:
    cli = os.environ.get("STREAMQ_REDIS_CLI") or "redis-cli"
    if shutil.which(cli) is None:
        server = os.environ.get("STREAMQ_REDIS_SERVER", "")
        sibling = Path(server).with_name("valkey-cli") if server else None
        if sibling is not None and sibling.exists():
            return str(sibling)
        raise RuntimeError(f"{cli!r} not found on PATH: install redis-tools or set"
                           " STREAMQ_REDIS_CLI")
    return cli


def wait_for(pred: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """Poll ``pred`` until truthy (connection errors count as not yet); fail after timeout_s."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            value = pred()
        except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):
            value = None
        if value:
            return value
        if time.monotonic() > end:
            raise RuntimeError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


class ClusterServer:
    """Start and stop a loopback Redis Cluster owned by the caller."""

    def __init__(self, primaries: int = 3, replicas: int = 1, *, node_timeout_ms: int = 2000,
                 binary: str | None = None) -> None:
        self.binary = binary or os.environ.get("STREAMQ_REDIS_SERVER", "redis-server")
        if shutil.which(self.binary) is None:
            raise RuntimeError(f"redis server binary {self.binary!r} not found on PATH")
        self.primaries, self.replicas = primaries, replicas
        self.node_timeout_ms = node_timeout_ms
        self.dir = Path(tempfile.mkdtemp(prefix="streamq-cluster-"))
        self.ports: list[int] = []
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.down: set[int] = set()
        """Nodes killed and not restarted (skipped by :meth:`wait_healthy`)."""

    @property
    def url(self) -> str:
        """``redis+cluster://`` with two seed nodes."""
        return "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p in self.ports[:2])

    def node_url(self, port: int) -> str:
        """A plain ``redis://`` URL of one node (a standalone URL at a cluster node)."""
        return f"redis://127.0.0.1:{port}/0"

    def node(self, port: int) -> redis.Redis:
        """A plain client of one node (close it after use)."""
        return redis.Redis(port=port, protocol=2, socket_timeout=5.0)

    def start(self) -> ClusterServer:
        n = self.primaries * (1 + self.replicas)
        for attempt in range(3):
            self.ports = cluster_ports(n)
            try:
                for port in self.ports:
                    self._start_node(port)
                for port in self.ports:
                    self._wait_ping(port)
                break
            except RuntimeError:  # a port was taken between probe and bind: pick others
                self._stop_all()
                if attempt == 2:
                    raise
        create = [_cli(), "--cluster", "create",
                  *(f"127.0.0.1:{p}" for p in self.ports),
                  "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        out = subprocess.run(create, capture_output=True, timeout=120, check=False)
        if out.returncode != 0:
            self.close()
            raise RuntimeError(f"cluster create failed: {out.stdout.decode()[-2000:]}"
                               f"{out.stderr.decode()[-2000:]}")
        self.wait_healthy()
        return self

    def _start_node(self, port: int) -> None:
        d = self.dir / str(port)
        d.mkdir(exist_ok=True)
        args = [self.binary, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(d),
                "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                "--cluster-node-timeout", str(self.node_timeout_ms), "--save", "",
                "--appendonly", "no", "--daemonize", "no", "--logfile", str(d / "redis.log")]
        self.procs[port] = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL)

    def _wait_ping(self, port: int) -> None:
        def up() -> bool:
            if self.procs[port].poll() is not None:
                raise RuntimeError(f"node {port} exited; see {self.dir / str(port)}")
            with redis.Redis(port=port, protocol=2, socket_connect_timeout=0.2) as c:
                return bool(c.ping())
        wait_for(up, 10, f"node {port} to answer")

    def info(self, port: int, section: str) -> dict[str, Any]:
        with self.node(port) as c:
            return dict(c.info(section))

    def wait_healthy(self, timeout_s: float = 30.0) -> None:
        """Until every node says ``cluster_state:ok``, all agree on one slot map and every
        replica's link to its primary is up."""
        def healthy() -> bool:
            maps = set()
            for port in self.ports:
                if port in self.down:
                    continue
                with self.node(port) as c:
                    raw: Any = c.execute_command("CLUSTER", "INFO")
                    info = raw.decode() if isinstance(raw, bytes) else str(raw)
                    if "cluster_state:ok" not in info:
                        return False
                    maps.add(self._slot_map(c))
                    repl = dict(c.info("replication"))
                    if repl.get("role") == "slave" and repl.get("master_link_status") != "up":
                        return False
            return len(maps) == 1
        wait_for(healthy, timeout_s, "the cluster to be healthy")

    @staticmethod
    def _slot_map(c: redis.Redis) -> tuple[tuple[int, int, int], ...]:
        slots: Any = c.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        return tuple(sorted((int(s[0]), int(s[1]), int(s[2][1])) for s in slots))

    def primary_ports(self) -> list[int]:
        return [p for p in self.ports if p not in self.down
                and self.info(p, "replication").get("role") == "master"]

    def owner(self, key: str) -> int:
        """The port of the primary that owns ``key``'s slot."""
        with self.node(self.ports[0]) as c:
            slot = int(c.execute_command("CLUSTER", "KEYSLOT", key))
            for start, end, port in self._slot_map(c):
                if start <= slot <= end:
                    return port
        raise RuntimeError(f"no node owns the slot of {key!r}")

    def replicas_of(self, port: int) -> list[int]:
        out = []
        for p in self.ports:
            if p in self.down:
                continue
            repl = self.info(p, "replication")
            if repl.get("role") == "slave" and int(repl.get("master_port", 0)) == port:
                out.append(p)
        return out

    def failover(self, replica: int, timeout_s: float = 30.0) -> None:
        """``CLUSTER FAILOVER`` on ``replica`` (a coordinated switch: the primary stops taking
        writes, the replica catches up and takes over); returns once it is a primary and the
        cluster is healthy again."""
        # a manual failover that does not complete within cluster-mf-timeout (5 s) is
        # aborted by Redis without a word: ask again until the replica is a primary
        end = time.monotonic() + timeout_s
        old = int(self.info(replica, "replication").get("master_port", 0))
        while True:
            with self.node(replica) as c:
                c.execute_command("CLUSTER", "FAILOVER")
            try:
                wait_for(lambda: self.info(replica, "replication").get("role") == "master",
                         min(10.0, max(0.1, end - time.monotonic())),
                         f"node {replica} to become a primary")
                break
            except RuntimeError:
                if time.monotonic() > end:
                    raise
        if old in self.procs and old not in self.down:
            # the old primary learns it was replaced from gossip: until then it still says
            # 'master' (wait_healthy checks only replicas' links), and a test that kills the
            # new primary before it streams from it would find its data set stale
            def demoted() -> bool:
                repl = self.info(old, "replication")
                return (repl.get("role") == "slave" and repl.get("master_link_status") == "up"
                        and int(repl.get("master_port", 0)) == replica)
            wait_for(demoted, max(1.0, end - time.monotonic()),
                     f"node {old} to replicate from {replica}")
        self.wait_healthy(timeout_s)

    def slot_owner(self, slot: int) -> int:
        """The port of the primary that owns ``slot``."""
        with self.node(self.ports[0]) as c:
            return next(port for start, end, port in self._slot_map(c) if start <= slot <= end)

    def migrate_slot(self, slot: int, to_port: int, *, batch: int = 1000,
                     pause_s: float = 0.0) -> int:
        """Move ``slot`` to the primary at ``to_port`` the way ``redis-cli --cluster reshard``
        does: SETSLOT IMPORTING on the target, MIGRATING on the source, MIGRATE the slot's keys
        ``batch`` at a time (``pause_s`` between batches keeps the migration window open), then
        SETSLOT NODE on every primary. Returns the number of keys moved."""
        src = self.slot_owner(slot)
        if src == to_port:
            return 0
        self.begin_migration(slot, to_port)
        moved = 0
        while True:
            n = self.migrate_keys(slot, src, to_port, batch)
            if not n:
                break
            moved += n
            if pause_s:
                time.sleep(pause_s)
        self.finish_migration(slot, to_port)
        return moved

    def begin_migration(self, slot: int, to_port: int) -> int:
        """SETSLOT IMPORTING on the target and MIGRATING on the owner; returns the owner."""
        src = self.slot_owner(slot)
        with self.node(src) as s, self.node(to_port) as d:
            d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", self.node_id(src))
            s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", self.node_id(to_port))
        return src

    def migrate_keys(self, slot: int, src: int, to_port: int, count: int) -> int:
        """MIGRATE up to ``count`` of the slot's keys still on ``src``; returns how many."""
        with self.node(src) as s:
            keys: Any = s.execute_command("CLUSTER", "GETKEYSINSLOT", slot, count)
            if keys:
                s.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 10000, "KEYS", *keys)
            return len(keys)

    def finish_migration(self, slot: int, to_port: int) -> None:
        """SETSLOT NODE on the target, the source and every other primary."""
        dst_id = self.node_id(to_port)
        with self.node(to_port) as d:
            d.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        for port in self.primary_ports():
            if port != to_port:
                with self.node(port) as c:
                    c.execute_command("CLUSTER", "SETSLOT", slot, "NODE", dst_id)
        self.wait_healthy()

    def add_primary(self, timeout_s: float = 30.0) -> int:
        """Start one more node and join it to the cluster (CLUSTER MEET) as a primary that
        owns no slot yet (what ``redis-cli --cluster add-node`` does); returns its port once
        every node knows it and the cluster is healthy."""
        while True:
            (port,) = cluster_ports(1)
            if port not in self.ports:
                break
        self._start_node(port)
        self._wait_ping(port)
        self.ports.append(port)
        new_id = self.node_id(port)
        with self.node(port) as c:
            c.execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0])

        def known() -> bool:
            for p in self.ports:
                if p in self.down:
                    continue
                with self.node(p) as c:
                    raw: Any = c.execute_command("CLUSTER", "NODES")
                    text = raw.decode() if isinstance(raw, bytes) else str(raw)
                    if new_id not in text:
                        return False
            return True
        wait_for(known, timeout_s, f"every node to know node {port}")
        self.wait_healthy(timeout_s)
        return port

    def kill(self, port: int) -> None:
        """SIGKILL one node (no shutdown, no save): its replica takes over once the others
        have not heard from it for ``node_timeout_ms``."""
        proc = self.procs[port]
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        self.down.add(port)

    def wait_promoted(self, replica: int, timeout_s: float = 30.0) -> None:
        """Until ``replica`` is a primary and the live nodes are healthy again."""
        wait_for(lambda: self.info(replica, "replication").get("role") == "master",
                 timeout_s, f"node {replica} to be promoted")
        self.wait_healthy(timeout_s)

    def restart(self, port: int, timeout_s: float = 30.0) -> None:
        """Start a killed node again with its cluster config: it comes back empty (no
        persistence) and rejoins as a replica of whoever took over its slots."""
        self._start_node(port)
        self._wait_ping(port)
        self.down.discard(port)
        self.wait_healthy(timeout_s)

    def node_id(self, port: int) -> str:
        with self.node(port) as c:
            return bytes(c.execute_command("CLUSTER", "MYID")).decode()

    def _stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs.clear()

    def close(self) -> None:
        self._stop_all()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> ClusterServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
