"""Helpers of the bad-input and security tests: key snapshots, the handlers and job-state checks
that their modules share, a worker on its own thread, certificates made with the openssl command
line, a TLS-only redis-server, ACL files.

Every server here is private (free port, temp dir); none of them touches port 6379.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import ssl
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import redis
from helpers import eventually, field

from streamq import Job, Queue, QueueConfig, Registry, RetryPolicy, Worker, WorkerConfig
from streamq._core.server import RedisServer, free_port

DOCS = Path(__file__).resolve().parent.parent / "docs"
SERVER_BINARY = os.environ.get("STREAMQ_REDIS_SERVER", "redis-server")


# --------------------------------------------------------------------------- inspecting keys


def keys_of(r: redis.Redis, qname: str, prefix: str = "streamq") -> set[bytes]:
    """Every key of one queue (test-only inspection with SCAN)."""
    return set(r.scan_iter(match=f"{prefix}:{{{qname}}}:*", count=10_000))  # few round trips


def snapshot(r: redis.Redis, qname: str, prefix: str = "streamq") -> dict[bytes, bytes | None]:
    """The serialised value of every key of one queue, to show that nothing was written."""
    return {k: r.dump(k) for k in sorted(keys_of(r, qname, prefix))}


def drop_queue(r: redis.Redis, qname: str, prefix: str = "streamq") -> None:
    keys = list(keys_of(r, qname, prefix))
    if keys:
        r.delete(*keys)


def xpending_count(r: redis.Redis, stream: str) -> int:
    summary: Any = r.xpending(stream, "streamq")
    return int(summary["pending"])


# --------------------------------------------------------------------------- bad-input queue side


TERMINAL = ("completed", "failed", "cancelled")


def new_qname() -> str:
    return f"bad-{uuid.uuid4().hex[:12]}"


def server_ms(r: redis.Redis) -> int:
    t: Any = r.time()
    return int(t[0]) * 1000 + int(t[1]) // 1000


def bad_input_registry() -> Registry:
    """The bad-input tests' well-behaved handlers: ``ok`` (async) and ``sync-ok``."""
    reg = Registry()

    @reg.handler("ok")
    async def ok(job: Job) -> Any:
        return {"echo": job.payload, "id": job.id}

    @reg.handler("sync-ok")
    def sync_ok(job: Job) -> Any:
        return job.payload

    return reg


def state(r: redis.Redis, q: Queue, job_id: str) -> str:
    """The record's state field as stored (readable on a damaged record, unlike ``get``)."""
    v: Any = field(r, q.keys.job(job_id), "state")
    return v.decode(errors="replace") if v else ""


def settled(r: redis.Redis, q: Queue, *ids: str) -> bool:
    return all(state(r, q, i) in TERMINAL for i in ids)


def reason_of(r: redis.Redis, q: Queue, job_id: str) -> str:
    v: Any = r.hget(q.keys.job(job_id), "reason")
    return v.decode() if v else ""


async def still_working(r: redis.Redis, q: Queue, w: Worker) -> None:
    """The worker keeps running: a job now and a delayed one (promotion) both complete, and
    the stream and pending list drain."""
    q.enqueue("ok", "after", job_id="after-now")
    q.enqueue("ok", "later", job_id="after-later", delay=0.05)
    await eventually(lambda: settled(r, q, "after-now", "after-later"), timeout_s=10,
                     what="jobs enqueued afterwards")
    assert state(r, q, "after-now") == "completed" and state(r, q, "after-later") == "completed"
    await eventually(lambda: r.xlen(q.keys.stream) == 0 and xpending_count(r, q.keys.stream) == 0,
                     timeout_s=10, what="stream and PEL to drain")
    assert w._running


@pytest.fixture(name="q")
def bad_input_queue(url: str) -> Iterator[Queue]:
    """The ``q`` fixture of a bad-input module that imports it: a queue named by ``new_qname``."""
    queue = Queue.from_url(url, new_qname())
    yield queue
    queue.close()


# --------------------------------------------------------------------------- security handlers


def security_registry() -> Registry:
    """The security tests' handlers: ``echo``, ``flaky`` (fails its first attempt) and ``slow``
    (outlasts a short lease renewal interval)."""
    reg = Registry()

    @reg.handler("echo")
    async def echo(job: Job) -> Any:
        return job.payload

    @reg.handler("flaky", max_attempts=2, retry=RetryPolicy(base_s=0.05, cap_s=0.05))
    async def flaky(job: Job) -> int:
        if job.attempt == 1:
            raise ConnectionError("first attempt fails")
        return job.attempt

    @reg.handler("slow")
    async def slow(job: Job) -> str:
        await asyncio.sleep(1.0)  # longer than a short lease's renewal interval (ACL test)
        return "slow done"

    return reg


# --------------------------------------------------------------------------- a threaded worker


class ThreadWorker:
    """A Worker running on an event loop of its own thread, for synchronous (hypothesis) tests.

    ``with ThreadWorker(...) as w:`` starts it and stops it gracefully on exit."""

    def __init__(self, url: str, queues: Sequence[str], registry: Registry, config: WorkerConfig,
                 queue_config: QueueConfig | None = None) -> None:
        self.worker = Worker(url, queues, registry, config, queue_config)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="sec-worker-loop",
                                        daemon=True)

    def __enter__(self) -> Worker:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.worker.start(), self._loop).result(30)
        return self.worker

    def __exit__(self, *exc: object) -> None:
        try:
            asyncio.run_coroutine_threadsafe(self.worker.stop(), self._loop).result(60)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


# --------------------------------------------------------------------------- certificates


@attrs.frozen
class Certs:
    dir: Path
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def _openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {proc.stderr.strip()}")


def make_certs(directory: Path) -> Certs:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, all signed
    by that CA (openssl command line; RSA 2048, one day)."""
    d = directory
    d.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-keyout", "ca.key",
             "-out", "ca.pem", "-subj", "/CN=streamq test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n"
                                  "extendedKeyUsage=serverAuth\n")
    (d / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name, subject in (("server", "/CN=127.0.0.1"), ("client", "/CN=streamq-client")):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", subject, cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-days", "1", "-out", f"{name}.pem",
                 "-extfile", f"{name}.ext", cwd=d)
    return Certs(d, d / "ca.pem", d / "server.pem", d / "server.key", d / "client.pem",
                 d / "client.key")


# --------------------------------------------------------------------------- TLS server


def server_has_tls() -> str | None:
    """None when the server binary was built with TLS; otherwise why not (for pytest.skip)."""
    if shutil.which(SERVER_BINARY) is None:
        return f"{SERVER_BINARY!r} is not on PATH"
    if shutil.which("openssl") is None:
        return "the openssl command line is not installed (needed to make test certificates)"
    tmp = Path(tempfile.mkdtemp(prefix="streamq-tlsprobe-"))
    try:
        certs = make_certs(tmp)
        with TlsRedisServer(certs, auth_clients=False):
            return None
    except RuntimeError as exc:
        return f"{SERVER_BINARY} cannot serve TLS: {exc}"
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class TlsRedisServer:
    """A redis-server listening on TLS only (``--port 0 --tls-port N``) on 127.0.0.1."""

    def __init__(self, certs: Certs, *, auth_clients: bool = False) -> None:
        self.certs = certs
        self.auth_clients = auth_clients
        self.dir = Path(tempfile.mkdtemp(prefix="streamq-tls-redis-"))
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    def url(self, *, ca: bool = True, client_cert: bool = False) -> str:
        query = []
        if ca:
            query.append(f"ssl_ca_certs={self.certs.ca}")
        if client_cert:
            query += [f"ssl_certfile={self.certs.client_cert}",
                      f"ssl_keyfile={self.certs.client_key}"]
        return f"rediss://127.0.0.1:{self.port}/0" + ("?" + "&".join(query) if query else "")

    def client(self) -> redis.Redis:
        c = self.certs
        return redis.Redis(host="127.0.0.1", port=self.port, ssl=True, ssl_ca_certs=str(c.ca),
                           ssl_certfile=str(c.client_cert), ssl_keyfile=str(c.client_key),
                           protocol=2, socket_connect_timeout=2)

    def start(self) -> TlsRedisServer:
        for _ in range(5):
            self.port = free_port()
            c = self.certs
            args = [SERVER_BINARY, "--port", "0", "--tls-port", str(self.port),
                    "--bind", "127.0.0.1", "--dir", str(self.dir), "--save", "",
                    "--appendonly", "no", "--daemonize", "no",
                    "--logfile", str(self.dir / "redis.log"),
                    "--tls-cert-file", str(c.server_cert), "--tls-key-file", str(c.server_key),
                    "--tls-ca-cert-file", str(c.ca),
                    "--tls-auth-clients", "yes" if self.auth_clients else "no"]
            self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.DEVNULL)
            if self._wait_ready():
                return self
            self.stop()
        log = self.dir / "redis.log"
        lines = log.read_text(errors="replace").splitlines() if log.exists() else []
        warnings = [ln.split(" # ", 1)[-1] for ln in lines if " # " in ln][-2:]
        raise RuntimeError("TLS redis-server did not start: "
                           + ("; ".join(warnings) or "see its log"))

    def _wait_ready(self) -> bool:
        client = self.client()
        try:
            for _ in range(200):
                assert self.proc is not None
                if self.proc.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except (redis.exceptions.ConnectionError, ssl.SSLError, OSError):
                    time.sleep(0.025)
            return False
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> TlsRedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------- ACL


ADMIN_PASSWORD = "admin-secret-5d1c"


def tenant_rule_from_docs() -> str:
    """The per-tenant ACL rule of docs/security.md (the ``user tenant-a ...`` line), so the
    recipe the page shows is the recipe the tests run."""
    text = (DOCS / "security.md").read_text(encoding="utf-8")
    match = re.search(r"^user tenant-a .+$", text, re.MULTILINE)
    if match is None:
        raise AssertionError("docs/security.md shows no 'user tenant-a ...' ACL rule")
    return match.group(0)


def rule_for(rule: str, tenant: str, password: str) -> str:
    """The documented rule, for another tenant and with a real password."""
    out = rule.replace("tenant-a", tenant)
    return re.sub(r" >\S+", f" >{password}", out, count=1)


class AclServer:
    """A private redis-server started with an ACL file: ``default`` may only PING (so the
    readiness probe works), ``admin`` may do anything, plus the given user lines."""

    def __init__(self, tmp: Path, users: Sequence[str]) -> None:
        tmp.mkdir(parents=True, exist_ok=True)
        self.aclfile = tmp / "users.acl"
        lines = ["user default on nopass resetkeys resetchannels -@all +ping",
                 f"user admin on >{ADMIN_PASSWORD} ~* &* +@all", *users]
        self.aclfile.write_text("\n".join(lines) + "\n")
        self.server = RedisServer(extra=("--aclfile", str(self.aclfile)))

    def url(self, user: str, password: str) -> str:
        return f"redis://{user}:{password}@127.0.0.1:{self.server.port}/0"

    def admin(self) -> redis.Redis:
        return redis.Redis(port=self.server.port, username="admin", password=ADMIN_PASSWORD,
                           protocol=2)

    def __enter__(self) -> AclServer:
        self.server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.close()
