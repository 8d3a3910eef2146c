"""Security: passwords and ACL users (one tenant per queue, ACL key patterns apply inside the
Lua scripts too), TLS (server verification and client certificates), no code from data
(DESIGN.md invariant 10), and size limits for payloads and results.

The per-tenant ACL rule is read from docs/security.md, so the recipe the page shows is the one
these tests run. Every server here is private: a free port, a temp dir, never 6379.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import os
import pickle
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
from sec_support import (
    AclServer,
    Certs,
    TlsRedisServer,
    make_certs,
    rule_for,
    server_has_tls,
    snapshot,
    tenant_rule_from_docs,
    xpending_count,
)

from streamq import (
    InvalidArgument,
    Job,
    MsgpackSerde,
    PayloadTooLarge,
    Queue,
    QueueConfig,
    Registry,
    RetryPolicy,
    ScriptError,
    Worker,
)
from streamq._core.keys import Keys
from streamq._core.scripts import SCRIPTS
from streamq._core.server import RedisServer
from streamq._ops.cli_ops import redact
from streamq.admin import Admin

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "STREAMQ_URL"}
    return subprocess.run([sys.executable, "-m", "streamq", *args, "--url", url], cwd=TESTS,
                          env=env, capture_output=True, text=True, timeout=60)


def registry() -> Registry:
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
        await asyncio.sleep(1.0)  # longer than the lease renewal interval below
        return "slow done"

    return reg


def state_of(q: Queue, job_id: str) -> str:
    info = q.get(job_id)
    return info.state if info else ""


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
    write-only grant on the shared queue registry (own keys only)."""
    rule = tenant_rule_from_docs()
    strict = rule_for(rule, "tenant-c", TENANT_PASSWORD["tenant-c"])
    strict = re.sub(r" %W~\S+", "", strict)
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
    from serving its queue."""
    url = tenant_url(acl, "tenant-c")
    q = Queue.from_url(url, "tenant-c")
    q.enqueue("echo", "mine", job_id="c1")

    async def work() -> None:
        async with Worker(url, ["tenant-c"], registry(), fast()):
            await eventually(lambda: state_of(q, "c1") == "completed", what="tenant-c's job")

    asyncio.run(work())
    assert q.result("c1") == "mine"
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


# =========================================================================== no code from data

FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
                     "jsonpickle", "yaml", "code", "codeop", "runpy", "imp"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "execfile", "breakpoint"}


def _sources() -> list[Path]:
    return sorted([*(ROOT / "streamq").rglob("*.py"), *(ROOT / "schedulers").rglob("*.py")])


def test_the_package_source_never_loads_code_from_data() -> None:
    """No pickle/marshal/yaml, no eval/exec/compile/__import__ anywhere in streamq/ and
    schedulers/. importlib only where the command line loads a registry or a cron schedule by
    module:attribute named on that command line, and importlib.resources for the Lua files."""
    import_module_sites: list[str] = []
    problems: list[str] = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.split(".")[0]
                    if top in FORBIDDEN_MODULES:
                        problems.append(f"{rel}:{node.lineno} imports {alias.name}")
                    if top == "importlib" and rel != "streamq/_ops/cli.py":
                        problems.append(f"{rel}:{node.lineno} imports {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                top = (node.module or "").split(".")[0]
                if top in FORBIDDEN_MODULES:
                    problems.append(f"{rel}:{node.lineno} imports from {node.module}")
                if top == "importlib" and [a.name for a in node.names] != ["resources"]:
                    problems.append(f"{rel}:{node.lineno} imports {node.module} names")
            elif isinstance(node, ast.Call):
                fn = node.func
                if isinstance(fn, ast.Name) and fn.id in FORBIDDEN_CALLS:
                    problems.append(f"{rel}:{node.lineno} calls {fn.id}()")
                if isinstance(fn, ast.Attribute) and fn.attr in FORBIDDEN_CALLS | {"loads"} and (
                        isinstance(fn.value, ast.Name) and fn.value.id in FORBIDDEN_MODULES):
                    problems.append(f"{rel}:{node.lineno} calls {fn.value.id}.{fn.attr}()")
                if isinstance(fn, ast.Attribute) and fn.attr == "import_module":
                    import_module_sites.append(rel)
                for kw in node.keywords:  # decoders that build objects from data
                    if kw.arg in ("object_hook", "object_pairs_hook", "ext_hook", "cls"):
                        problems.append(f"{rel}:{node.lineno} passes {kw.arg}=")
    assert problems == []
    assert import_module_sites and set(import_module_sites) == {"streamq/_ops/cli.py"}
    assert _import_module_reached_only_from({"load_registry", "_load_cron"})


def _import_module_reached_only_from(entry_points: set[str]) -> bool:
    """In cli.py, every function that calls importlib.import_module is one of the entry points
    or a helper called only by them (walking up the module's own call graph)."""
    tree = ast.parse((ROOT / "streamq" / "_ops" / "cli.py").read_text(encoding="utf-8"))
    functions = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}

    def calls(f: ast.FunctionDef, name: str) -> bool:
        return any(isinstance(n, ast.Call) and (
            (isinstance(n.func, ast.Name) and n.func.id == name)
            or (isinstance(n.func, ast.Attribute) and n.func.attr == name))
            for n in ast.walk(f))

    pending = [name for name, f in functions.items() if calls(f, "import_module")]
    checked: set[str] = set()
    while pending:
        name = pending.pop()
        if name in checked or name in entry_points:
            continue
        checked.add(name)
        callers = [c for c, f in functions.items() if c != name and calls(f, name)]
        if not callers:
            return False  # a loader reachable some other way (or public): not allowed
        pending.extend(callers)
    return True


def test_the_lua_scripts_load_no_code() -> None:
    for path in sorted((ROOT / "streamq" / "lua").glob("*.lua")):
        text = re.sub(r"--[^\n]*", "", path.read_text(encoding="utf-8"))  # code, not comments
        for word in ("loadstring", "load(", "dofile", "require", "setfenv", "getfenv",
                     "rawset(_G", "_G["):
            assert word not in text, f"{path.name} uses {word}"


@pytest.mark.parametrize("serde", ["json", "msgpack"])
async def test_job_types_naming_code_are_unknown_types_and_nothing_is_imported(
    url: str, r: redis.Redis, tmp_path: Path, serde: str
) -> None:
    """A job type that reads like a Python path is only a name: the worker runs handlers
    registered in code, and dead-letters the rest as unknown types. Nothing is imported."""
    module = f"sq_evil_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "imported"
    (tmp_path / f"{module}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "def run(*a, **k):\n    Path(" + repr(str(marker)) + ").write_text('ran')\n")
    sys.path.insert(0, str(tmp_path))
    qcfg = QueueConfig(serde=MsgpackSerde() if serde == "msgpack" else QueueConfig().serde)
    qname = f"code-{uuid.uuid4().hex[:8]}"
    q = Queue.from_url(url, qname, qcfg)
    evil_types = [f"{module}.run", f"{module}:run", "os.system", "os:system", "builtins.eval",
                  "subprocess.run", "pickle.loads", "__import__", "importlib.import_module"]
    try:
        for i, t in enumerate(evil_types):
            q.enqueue(t, f"touch {marker}", job_id=f"evil-{i}")
        # a body written straight into a record, past the producer's checks
        q.enqueue("echo", job_id="forged")
        forged = f"{module}:run ".encode() + qcfg.serde.dumps([str(marker)])
        r.hset(q.keys.job("forged"), "b", forged)
        q.enqueue("echo", "fine", job_id="fine")
        ids = [f"evil-{i}" for i in range(len(evil_types))] + ["forged"]
        async with Worker(url, [qname], registry(), fast(), qcfg) as w:
            await eventually(lambda: all(state_of(q, i) == "failed" for i in ids)
                             and state_of(q, "fine") == "completed", what="all settled")
            # the worker counts an outcome when finish.lua's reply arrives, just after Redis
            # shows the state: wait for that reply rather than race it
            await eventually(lambda: w.stats.failed + w.stats.completed == len(ids) + 1,
                             what="the worker to count every outcome")
            assert w.stats.failed == len(ids)
        for jid in ids:
            info = q.get(jid)
            assert info is not None and info.reason == "unknown job type", info
        assert not marker.exists() and module not in sys.modules
        assert xpending_count(r, q.keys.stream) == 0
    finally:
        sys.path.remove(str(tmp_path))
        q.close()


class _Boom:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path(self.marker).touch, ())


@pytest.mark.parametrize("serde", ["json", "msgpack"])
async def test_a_pickle_in_a_record_is_never_unpickled(url: str, r: redis.Redis, tmp_path: Path,
                                                       serde: str) -> None:
    marker = tmp_path / "unpickled"
    evil = pickle.dumps(_Boom(str(marker)))
    qcfg = QueueConfig(serde=MsgpackSerde() if serde == "msgpack" else QueueConfig().serde)
    qname = f"pickle-{uuid.uuid4().hex[:8]}"
    q = Queue.from_url(url, qname, qcfg)
    q.enqueue("echo", job_id="victim")
    q.enqueue("echo", job_id="result-victim")
    r.hset(q.keys.job("victim"), "b", b"echo " + evil)
    async with Worker(url, [qname], registry(), fast(), qcfg):
        await eventually(lambda: state_of(q, "victim") == "failed"
                         and state_of(q, "result-victim") == "completed", what="settled")
    r.hset(q.keys.job("result-victim"), "r", evil)  # a stored result is data, too
    info = q.get("victim")
    assert info is not None and info.reason == "malformed envelope"
    got = q.get("result-victim")
    assert got is not None and got.result in (evil, None)  # raw bytes back, never an object
    assert not marker.exists()
    q.close()


# =========================================================================== size limits


def test_payloads_over_the_limit_are_refused_with_payload_too_large(url: str,
                                                                    r: redis.Redis) -> None:
    qname = f"size-{uuid.uuid4().hex[:8]}"
    q = Queue.from_url(url, qname, QueueConfig(max_payload_bytes=4_096))
    q.enqueue("echo", "x" * 3_000)
    before = snapshot(r, qname)
    for payload in ("x" * 5_000, "€" * 1_500, {"k": ["y" * 100] * 50}):
        with pytest.raises(PayloadTooLarge, match="max_payload_bytes of 4096"):
            q.enqueue("echo", payload)
    with pytest.raises(PayloadTooLarge, match="job #1"):
        q.enqueue_many([{"type": "echo"}, {"type": "echo", "payload": "z" * 10_000}])
    assert snapshot(r, qname) == before
    default = Queue.from_url(url, qname)
    with pytest.raises(PayloadTooLarge, match="524288"):
        default.enqueue("echo", "x" * (512 * 1024))
    assert snapshot(r, qname) == before
    q.close()
    default.close()


async def test_results_over_the_limit_are_dead_lettered_not_stored(url: str,
                                                                   r: redis.Redis) -> None:
    """A result counts against the same limit as a payload: storing a 20 MB result in a job
    record (and sending it to every waiter) is refused; the job is dead-lettered with a reason
    (re-drive it once the handler is fixed) and the worker goes on."""
    qname = f"result-size-{uuid.uuid4().hex[:8]}"
    limit = 64 * 1024
    qcfg = QueueConfig(max_payload_bytes=limit)
    q = Queue.from_url(url, qname, qcfg)
    reg = registry()

    @reg.handler("huge", max_attempts=3)
    async def huge(job: Job) -> str:
        return "x" * int(job.payload)

    q.enqueue("huge", limit - 100, job_id="fits")
    q.enqueue("huge", 20_000_000, job_id="too-big")
    q.enqueue("echo", "next", job_id="next")
    async with Worker(url, [qname], reg, fast(), qcfg):
        await eventually(lambda: all(state_of(q, i) in ("completed", "failed")
                                     for i in ("fits", "too-big", "next")), what="settled")
    assert state_of(q, "fits") == "completed" and state_of(q, "next") == "completed"
    info = q.get("too-big")
    assert info is not None and info.state == "failed" and info.attempts == 1, info
    assert "too large" in info.reason and info.error is not None
    assert info.error["type"] == "PayloadTooLarge"
    stored: Any = r.hstrlen(q.keys.job("too-big"), "result")
    assert stored == 0
    q.close()
