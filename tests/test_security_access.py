"""Security, who may connect: passwords and ACL users (one tenant per queue, ACL key patterns
apply inside the Lua scripts too) and TLS (server verification and client certificates).

The per-tenant ACL rule is read from docs/security.md, so the recipe the page shows is the one
these tests run. Every server here is private: a free port, a temp dir, never 6379. No code from
data and size limits are in test_security_data.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis
from helpers import eventually, fast
from helpers import state as state_of
from sec_support import (
    AclServer,
    Certs,
    TlsRedisServer,
    make_certs,
    rule_for,
    server_has_tls,
    snapshot,
    tenant_rule_from_docs,
)
from sec_support import security_registry as registry

from streamq import InvalidArgument, Queue, ScriptError, Worker
from streamq._core.keys import Keys
from streamq._core.scripts import SCRIPTS
from streamq._core.server import RedisServer
from streamq.admin import Admin
from streamq.cli.common import redact

TESTS = Path(__file__).resolve().parent


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMQ_URL"}
    return subprocess.run([sys.executable, "-m", "streamq", *args, "--url", url], cwd=TESTS,
                          env=env, capture_output=True, text=True, timeout=60)


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


# =========================================================================== passwords


def test_a_password_protected_server(tmp_path: Path) -> None:
    password = "p@ss:w/rd %&? with spaces"  # must be percent-encoded in a URL
    with RedisServer() as server:
        redis.Redis(port=server.port, protocol=2).config_set("requirepass", password)
        good = f"redis://:{quote(password, safe='')}@127.0.0.1:{server.port}/0"
        qname = f"pw-{uuid.uuid4().hex[:8]}"
        with Queue.from_url(good, qname) as q:
            q.enqueue("echo", {"x": 1}, job_id="j1")

            async def work() -> None:
                async with Worker(good, [qname], registry(), fast()):
                    await eventually(lambda: state_of(q, "j1") == "completed", what="the job")

            asyncio.run(work())
            assert q.result("j1") == {"x": 1}
        for bad in (f"redis://127.0.0.1:{server.port}/0",
                    f"redis://:wrong-{uuid.uuid4().hex[:6]}@127.0.0.1:{server.port}/0"):
            with Queue.from_url(bad, qname) as q, pytest.raises(
                    redis.exceptions.AuthenticationError):
                q.enqueue("echo")
            line = one_line(cli(bad, "stats", qname))
            assert "authentication failed" in line and "wrong-" not in line
        ok = cli(good, "stats", qname)
        assert ok.returncode == 0 and qname in ok.stdout
        for text in (ok.stdout + ok.stderr,):
            assert password not in text and quote(password, safe="") not in text


@pytest.mark.parametrize("url", [
    "redis://:s3cret-pw@127.0.0.1:1/0",
    "redis://alice:s3cret-pw@127.0.0.1:1/0",
    "rediss://alice:s3cret-pw@127.0.0.1:1/0?ssl_ca_certs=/nonexistent/ca.pem",
    "redis://alice:s3cret%2Dpw@127.0.0.1:1/0",
    "redis://127.0.0.1:1/0?password=s3cret-pw",
    "redis://127.0.0.1:1/0?username=alice&password=s3cret-pw",
    "unix:///nonexistent/redis.sock?password=s3cret-pw",
])
def test_the_cli_never_prints_a_password(url: str) -> None:
    secret = ("s3cret-pw", "s3cret%2Dpw")
    assert not any(s in redact(url) for s in secret), redact(url)
    line = one_line(cli(url, "stats", "some-queue"))
    assert not any(s in line for s in secret), line


# =========================================================================== ACL users

TENANT_PASSWORD = {"tenant-a": "pw-a-" + uuid.uuid4().hex[:8],
                   "tenant-b": "pw-b-" + uuid.uuid4().hex[:8],
                   "tenant-c": "pw-c-" + uuid.uuid4().hex[:8]}


@pytest.fixture(scope="module")
def acl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclServer]:
    """tenant-a and tenant-b get the documented rule; tenant-c the same rule without the
    write-only grant on the shared queue registry (own keys only) and without the list
    commands of the recent completions (an earlier release's rule)."""
    rule = tenant_rule_from_docs()
    strict = rule_for(rule, "tenant-c", TENANT_PASSWORD["tenant-c"])
    strict = re.sub(r" %W~\S+", "", strict)
    strict = re.sub(r" \+(lpush|ltrim|lrange)\b", "", strict)
    users = [rule_for(rule, "tenant-a", TENANT_PASSWORD["tenant-a"]),
             rule_for(rule, "tenant-b", TENANT_PASSWORD["tenant-b"]), strict]
    with AclServer(tmp_path_factory.mktemp("acl"), users) as server:
        yield server


def tenant_url(acl: AclServer, tenant: str) -> str:
    return acl.url(tenant, TENANT_PASSWORD[tenant])


def acl_denials(admin: redis.Redis, user: str) -> list[str]:
    """What the ACL refused this user. CLIENT SETINFO (sent by redis-py on connect to servers
    from Redis 7.2 and Valkey on; a refusal is ignored) does not count: Redis 7.0 has no such
    subcommand, so the documented rule cannot name it."""
    log: Any = admin.acl_log()
    return [f"{e['reason']} {e['object']} ({e['context']})" for e in log
            if e["username"] == user and e["object"] != "client|setinfo"]


def test_the_documented_acl_rule_is_well_formed() -> None:
    rule = tenant_rule_from_docs()
    assert " ~streamq:{tenant-a}:*" in rule and " &streamq:{tenant-a}:*" in rule
    assert " -@all " in rule and "+@all" not in rule and " ~* " not in rule
    assert " +eval " not in rule and " +keys " not in rule and " +scan " not in rule
    assert " >" in rule and " on " in rule


def test_an_acl_tenant_runs_its_queue_with_the_documented_rule(acl: AclServer) -> None:
    """Producer, worker (fetch, start, finish, retry, promotion, lease renewal, heartbeat,
    pruning, hand-back), waiting for results, cancel, the admin API, the scheduler (promotion,
    cron) and the CLI, all as tenant-a: nothing is denied."""
    from schedulers import Cron, Scheduler, SchedulerConfig

    url = tenant_url(acl, "tenant-a")
    admin = acl.admin()
    admin.acl_log_reset()
    q = Queue.from_url(url, "tenant-a")
    q.enqueue("echo", {"n": 1}, job_id="now")
    q.enqueue("echo", {"n": 2}, job_id="later", delay=0.2)
    q.enqueue("flaky", job_id="flaky")
    q.enqueue("slow", job_id="slow")
    q.enqueue("echo", job_id="cancel-me", delay=60)
    assert q.cancel("cancel-me").cancelled
    q.enqueue_many([{"type": "echo", "payload": i} for i in range(1_200)])

    async def work() -> None:
        cfg = fast(visibility_timeout_s=0.6, prune_interval_s=0.3, reclaim_interval_s=0.2)
        async with Worker(url, ["tenant-a"], registry(), cfg) as w:
            await eventually(lambda: all(state_of(q, j) == "completed"
                                         for j in ("now", "later", "flaky", "slow")),
                             timeout_s=20, what="tenant-a's jobs")
            waited = await asyncio.to_thread(q.enqueue_and_wait, "echo", "hi", timeout=10)
            assert waited == "hi"
            await eventually(lambda: w.stats.completed >= 1_205,  # the bulk ones settle too
                             timeout_s=20, what="every job of tenant-a to be counted")
            assert w.stats.completed >= 1_205 and w._leases.renewed >= 1
        sched = Scheduler(url, ["tenant-a"],
                          [Cron("tick", every=1, job_type="echo", queue="tenant-a")],
                          SchedulerConfig(poll_interval_s=0.2, visibility_timeout_s=1.0))
        q.enqueue("echo", job_id="by-scheduler", delay=0.1)
        task = asyncio.create_task(sched.run())
        await eventually(lambda: state_of(q, "by-scheduler") == "queued", what="promotion")
        await eventually(lambda: Admin(q.client).stats("tenant-a").ready >= 2, what="a cron tick")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(work())
    ops = Admin.from_url(url)
    assert ops.check_server() >= (6, 2)
    stats = ops.stats("tenant-a")
    assert stats.counters["completed"] >= 1_205
    ops.pause("tenant-a")
    ops.resume("tenant-a")
    ops.consumers("tenant-a")
    ops.pending("tenant-a")
    assert ops.job("tenant-a", "now").result == {"n": 1}
    ops.dead("tenant-a")
    ops.close()
    out = cli(url, "stats", "tenant-a")
    assert out.returncode == 0 and "tenant-a" in out.stdout, out.stderr
    assert cli(url, "enqueue", "tenant-a", "echo", "{}").returncode == 0
    assert TENANT_PASSWORD["tenant-a"] not in out.stdout + out.stderr
    q.close()
    assert acl_denials(admin, "tenant-a") == []
    assert admin.sismember("streamq:queues", "tenant-a")  # write-only registration worked


def test_an_acl_tenant_searches_its_queue_with_the_documented_rule(acl: AclServer) -> None:
    """A queue with search on (docs/search.md): the enqueue's index writes, the worker's
    error-word index loop and every kind of search of its queue run as tenant-b: nothing is
    denied. (A search over every queue reads the shared queue registry, which the rule
    lets a tenant write, not read: a tenant names its queue.)"""
    from streamq import QueueConfig, SearchConfig

    url = tenant_url(acl, "tenant-b")
    admin = acl.admin()
    admin.acl_log_reset()
    cfg = QueueConfig(search=SearchConfig(fields={"echo": ["k"]}))
    q = Queue.from_url(url, "tenant-b", config=cfg)
    q.enqueue("echo", {"k": "v"}, job_id="srch-ok", group="g1")
    q.enqueue("nosuch", {}, job_id="srch-dead")  # an unknown type: dead-lettered
    q.enqueue("echo", {"k": "v"}, job_id="srch-later", delay=3600)

    async def work() -> None:
        async with Worker(url, ["tenant-b"], registry(), fast()):
            await eventually(lambda: state_of(q, "srch-dead") == "failed"
                             and state_of(q, "srch-ok") == "completed", timeout_s=20,
                             what="tenant-b's jobs")

    asyncio.run(work())
    ops = Admin.from_url(url)
    assert [h.job_id for h in ops.find("tenant-b", error="nosuch").items] == ["srch-dead"]
    assert ops.find("tenant-b", error="nosuch").source == "words"
    assert [h.job_id for h in ops.find("tenant-b", error="nos", max_scan=50).items] == [
        "srch-dead"]
    assert ops.find("tenant-b", state="failed").items[0].job_id == "srch-dead"
    assert {h.job_id for h in ops.find("tenant-b", id_prefix="srch-").items} >= {
        "srch-ok", "srch-dead", "srch-later"}
    assert [h.job_id for h in ops.find("tenant-b", state="scheduled").items] == ["srch-later"]
    assert {h.job_id for h in ops.find("tenant-b", fields={"k": "v"}).items} == {
        "srch-ok", "srch-later"}
    assert [h.job_id for h in ops.find("tenant-b", group="g1").items] == ["srch-ok"]
    assert ops.find("tenant-b", id="srch-ok").items[0].state == "completed"
    ops.close()
    q.close()
    assert acl_denials(admin, "tenant-b") == []


def test_a_tenant_cannot_touch_another_tenants_keys(acl: AclServer) -> None:
    admin = acl.admin()
    b = Queue.from_url(tenant_url(acl, "tenant-b"), "tenant-b")
    b.enqueue("echo", "secret of b", job_id="b1")
    before = snapshot(admin, "tenant-b")
    a_client = redis.Redis.from_url(tenant_url(acl, "tenant-a"), protocol=2)
    as_a = Queue(a_client, "tenant-b")
    noperm = redis.exceptions.NoPermissionError
    with pytest.raises(noperm):
        as_a.get("b1")
    with pytest.raises((noperm, ScriptError), match="permission"):
        as_a.enqueue("echo", "forged")
    with pytest.raises((noperm, ScriptError), match="permission"):
        as_a.cancel("b1")
    for cmd in (("HGETALL", b.keys.job("b1")), ("XRANGE", b.keys.stream, "-", "+"),
                ("XREADGROUP", "GROUP", "streamq", "thief", "STREAMS", b.keys.stream, ">"),
                ("SMEMBERS", "streamq:queues"), ("KEYS", "*"), ("SCAN", "0"),
                ("PUBLISH", b.keys.wake_channel, "1"), ("FLUSHALL",), ("CONFIG", "GET", "*"),
                ("EVAL", "return 1", "0")):
        with pytest.raises(noperm):
            a_client.execute_command(*cmd)  # type: ignore[no-untyped-call]
    pubsub = a_client.pubsub()  # type: ignore[no-untyped-call]
    with pytest.raises(noperm):
        pubsub.subscribe(b.keys.done_channel("b1"))
        pubsub.get_message(timeout=1)
    pubsub.close()

    async def steal() -> None:
        async with Worker(tenant_url(acl, "tenant-a"), ["tenant-b"], registry(), fast()):
            pass

    with pytest.raises(noperm):
        asyncio.run(steal())
    assert snapshot(admin, "tenant-b") == before
    a_client.close()
    b.close()


def test_acl_key_patterns_apply_inside_lua_scripts(acl: AclServer) -> None:
    """streamq's scripts touch only the keys passed in KEYS, and Redis checks ACL key patterns
    both for KEYS and for every redis.call inside a script: a script of tenant-a cannot reach
    tenant-b's keys, whether named in KEYS or hard-coded in its body."""
    admin = acl.admin()
    b = Queue.from_url(tenant_url(acl, "tenant-b"), "tenant-b")
    b.enqueue("echo", "b's job", job_id="b2")
    before = snapshot(admin, "tenant-b")
    a_client = redis.Redis.from_url(tenant_url(acl, "tenant-a"), protocol=2)
    ka, kb = Keys("tenant-a"), Keys("tenant-b")
    noperm = redis.exceptions.NoPermissionError
    sha = a_client.script_load(f"return redis.call('HGET', '{kb.job('b2')}', 'env')")
    with pytest.raises(redis.exceptions.ResponseError, match=r"permission|access"):
        a_client.evalsha(sha, 1, ka.stream)  # declared own key, touched another tenant's
    sha = a_client.script_load(
        f"return redis.call('XADD', '{kb.stream}', '*', 'id', 'forged')")
    with pytest.raises(redis.exceptions.ResponseError, match=r"permission|access"):
        a_client.evalsha(sha, 0)
    with pytest.raises(noperm):  # a tenant-b key in KEYS is refused before the script runs
        a_client.evalsha(sha, 1, kb.stream)
    # streamq's own scripts, pointed at a mix of own and foreign keys
    enqueue_keys = [ka.stream, ka.delayed, ka.stats, ka.events, kb.job("b2")]
    with pytest.raises((noperm, ScriptError), match="permission"):
        SCRIPTS["enqueue"](a_client, enqueue_keys,
                           [0, 0, "", 1, "b2", "echo", b"{}", 0, 60, 0, 0, 0, ""])
    cancel_keys = [kb.job("b2"), ka.stream, ka.delayed, ka.stats, ka.events]
    with pytest.raises((noperm, ScriptError), match="permission"):
        SCRIPTS["cancel"](a_client, cancel_keys, ["streamq", "b2", 0])
    assert snapshot(admin, "tenant-b") == before
    assert state_of(b, "b2") == "queued"
    a_client.close()
    b.close()


@pytest.mark.parametrize("args", [("stats", "tenant-b"), ("job", "tenant-b", "b1"),
                                  ("enqueue", "tenant-b", "echo", "{}"),
                                  ("dead", "list", "tenant-b"), ("stats",)])
def test_the_cli_names_a_missing_acl_permission_in_one_line(acl: AclServer,
                                                            args: tuple[str, ...]) -> None:
    url = tenant_url(acl, "tenant-a")
    line = one_line(cli(url, *args))
    assert "ACL" in line and "permission" in line.lower(), line
    assert TENANT_PASSWORD["tenant-a"] not in line and "***" in line


def test_a_producer_cannot_aim_notifications_outside_its_channels(acl: AclServer) -> None:
    """``notify`` (the channel enqueue_and_wait listens on) reaches enqueue's options. Aimed at
    a channel the tenant may not publish to, it must be refused at enqueue, not break the
    worker's settle batch (its neighbours' results dropped, their handlers run again)."""
    url = tenant_url(acl, "tenant-a")
    q = Queue.from_url(url, "tenant-a")
    q.enqueue("echo", job_id="nb1")
    with contextlib.suppress(InvalidArgument):
        q.enqueue("echo", job_id="aimed", notify="streamq:{tenant-b}:done:b1")
    q.enqueue("echo", job_id="nb2")

    async def work() -> None:
        async with Worker(url, ["tenant-a"], registry(), fast(visibility_timeout_s=1.0)) as w:
            await eventually(lambda: all(state_of(q, j) in ("completed", "")
                                         for j in ("nb1", "aimed", "nb2")),
                             what="the jobs")
            assert w.stats.lost == 0, "a settle batch failed"

    asyncio.run(work())
    for j in ("nb1", "nb2"):
        info = q.get(j)
        assert info is not None and info.attempts == 1
    q.close()


def test_a_tenant_limited_to_its_own_keys_can_still_run_a_worker(acl: AclServer) -> None:
    """Workers add their queue names to the shared ``streamq:queues`` SET (for `streamq stats`
    without names). A tenant allowed only its own keys cannot write it; that must not stop it
    from serving its queue. Nor may a rule without the recent completions' list commands (the
    rule of a release before them) stop completions."""
    url = tenant_url(acl, "tenant-c")
    q = Queue.from_url(url, "tenant-c")
    q.enqueue("echo", "mine", job_id="c1")

    async def work() -> None:
        async with Worker(url, ["tenant-c"], registry(), fast()) as w:
            await eventually(lambda: state_of(q, "c1") == "completed", what="tenant-c's job")
            # the settle call itself succeeded (the refused LPUSH did not raise after the
            # outcome was written): the worker counted the completion, the queue too
            await eventually(lambda: w.stats.completed == 1, what="the completion counted")
        assert w.stats.lost == 0

    asyncio.run(work())
    assert q.result("c1") == "mine"
    assert Admin(q.client).stats("tenant-c").counters["completed"] == 1
    q.close()


# =========================================================================== TLS


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    why = server_has_tls()
    if why is not None:
        pytest.skip(why)
    return make_certs(tmp_path_factory.mktemp("certs"))


def _round_trip(url: str, qname: str) -> None:
    with Queue.from_url(url, qname) as q:
        q.enqueue("echo", {"over": "tls"}, job_id="t1")

        async def work() -> None:
            async with Worker(url, [qname], registry(), fast()):
                await eventually(lambda: state_of(q, "t1") == "completed", what="a job over TLS")
                assert await asyncio.to_thread(q.enqueue_and_wait, "echo", 7, timeout=10) == 7

        asyncio.run(work())
        assert q.result("t1") == {"over": "tls"}


def test_tls_with_a_private_ca(certs: Certs) -> None:
    with TlsRedisServer(certs, auth_clients=False) as server:
        qname = f"tls-{uuid.uuid4().hex[:8]}"
        url = server.url(ca=True)
        _round_trip(url, qname)
        out = cli(url, "stats", qname)
        assert out.returncode == 0 and qname in out.stdout, out.stderr
        plain = f"redis://127.0.0.1:{server.port}/0"  # no TLS: the server hangs up
        with Queue.from_url(plain, qname, socket_timeout_s=3) as q, pytest.raises(
                redis.exceptions.ConnectionError):
            q.get("t1")
        unverified = server.url(ca=False)  # the system CAs do not know this server
        with Queue.from_url(unverified, qname) as q, pytest.raises(
                redis.exceptions.ConnectionError, match=r"(?i)certificate"):
            q.get("t1")
        line = one_line(cli(unverified, "stats", qname))
        assert "cannot reach Redis" in line and "certificate" in line.lower()


def test_tls_with_client_certificates(certs: Certs) -> None:
    with TlsRedisServer(certs, auth_clients=True) as server:
        qname = f"mtls-{uuid.uuid4().hex[:8]}"
        _round_trip(server.url(ca=True, client_cert=True), qname)
        with Queue.from_url(server.url(ca=True), qname) as q, pytest.raises(
                redis.exceptions.ConnectionError):
            q.get("t1")
        out = cli(server.url(ca=True, client_cert=True), "stats", qname)
        assert out.returncode == 0 and qname in out.stdout, out.stderr
