"""Security, what data can do: no code from data (DESIGN.md invariant 10) and size limits for
payloads and results. Passwords, ACL users and TLS are in test_security_access.py.
"""

from __future__ import annotations

import ast
import pickle
import re
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis
from helpers import eventually, fast
from helpers import state as state_of
from sec_support import security_registry as registry
from sec_support import snapshot, xpending_count

from streamq import Job, MsgpackSerde, PayloadTooLarge, Queue, QueueConfig, Worker

ROOT = Path(__file__).resolve().parent.parent


# =========================================================================== no code from data

FORBIDDEN_MODULES = {"pickle", "cPickle", "_pickle", "marshal", "shelve", "dill", "cloudpickle",
                     "jsonpickle", "yaml", "code", "codeop", "runpy", "imp"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__", "execfile", "breakpoint"}


def _sources() -> list[Path]:
    return sorted([*(ROOT / "streamq").rglob("*.py"), *(ROOT / "schedulers").rglob("*.py")])


_CHILD = "streamq/_worker/child.py"
_IMPORTLIB_USERS = {"streamq/cli/main.py", "streamq/cli/reload.py", _CHILD}
"""Who may import importlib: the command line's loader; --reload, which only locates a
package's directory with ``importlib.util.find_spec`` of a top-level name (that runs no code of
the package) to know which files to watch; and a process pool's child, which imports the
registry its worker names (``module:attribute``, or the worker's own script run as
``__mp_main__`` with runpy) and the serde's configuration by reference, from the ``hello``
frame its parent sends over a private pipe, never from Redis."""


def test_the_package_source_never_loads_code_from_data() -> None:
    """No pickle/marshal/yaml, no eval/exec/compile/__import__ anywhere in streamq/ and
    schedulers/. importlib only where the command line loads a registry or a cron schedule by
    module:attribute named on that command line (and --reload's find_spec, which loads nothing),
    and importlib.resources for the Lua files."""
    import_module_sites: list[str] = []
    problems: list[str] = []
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), rel)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    top = alias.name.split(".")[0]
                    if top in FORBIDDEN_MODULES and not (top == "runpy" and rel == _CHILD):
                        problems.append(f"{rel}:{node.lineno} imports {alias.name}")
                    if top == "importlib" and rel not in _IMPORTLIB_USERS:
                        problems.append(f"{rel}:{node.lineno} imports {alias.name}")
            elif isinstance(node, ast.ImportFrom):
                top = (node.module or "").split(".")[0]
                if top in FORBIDDEN_MODULES:
                    problems.append(f"{rel}:{node.lineno} imports from {node.module}")
                if top == "importlib" and [a.name for a in node.names] != ["resources"]:
                    problems.append(f"{rel}:{node.lineno} imports {node.module} names")
            elif isinstance(node, ast.Attribute) and rel == "streamq/cli/reload.py" and (
                    isinstance(node.value, ast.Attribute) and node.value.attr == "util"
                    and node.attr != "find_spec"):
                problems.append(f"{rel}:{node.lineno} uses importlib.util.{node.attr}")
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
    assert set(import_module_sites) == {"streamq/cli/main.py", _CHILD}
    assert _import_module_reached_only_from(ROOT / "streamq" / "cli" / "main.py",
                                            {"load_registry", "_load_cron"})
    # the child: only from its hello frame (the registry and the serde by reference)
    assert _import_module_reached_only_from(ROOT / _CHILD, {"hello"}, also=("run_path",))


def _import_module_reached_only_from(path: Path, entry_points: set[str],
                                     also: tuple[str, ...] = ()) -> bool:
    """In ``path``, every function that calls importlib.import_module (or one of ``also``) is
    one of the entry points or a helper called only by them (walking up the module's own call
    graph)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = {f.name: f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)}

    def calls(f: ast.FunctionDef, name: str) -> bool:
        return any(isinstance(n, ast.Call) and (
            (isinstance(n.func, ast.Name) and n.func.id == name)
            or (isinstance(n.func, ast.Attribute) and n.func.attr == name))
            for n in ast.walk(f))

    pending = [name for name, f in functions.items()
               if any(calls(f, loader) for loader in ("import_module", *also))]
    if not pending:
        return False  # nothing found: the check would prove nothing
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
