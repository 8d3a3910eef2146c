"""The script registry: loads each ``lua/*.lua`` once, runs it with EVALSHA, falls back on NOSCRIPT.

``lua/_lib.lua``, ``lua/_groups.lua``, ``lua/_rate.lua`` and ``lua/_flow.lua`` (helper
functions only) are prepended to every script, so shared logic such as dead-lettering lives in
one place.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import threading
from collections import deque
from collections.abc import Sequence
from importlib import resources
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError, TryAgainError

from . import nodes
from .conn import is_cluster, standalone_on_cluster
from .errors import ScriptError
from .sends import Kept, acluster, cexchange, exchange

Arg = str | bytes | int | float

_NAMES = ("enqueue", "promote", "start", "finish", "renew", "release", "cancel", "heartbeat",
          "prune", "fire", "requeue", "redrive", "purge", "progress", "claim", "unpark",
          "reconcile", "group", "ticket", "wait", "link", "link_many", "resolve",
          "resolve_many", "adopt", "batch_open", "batch_close", "search", "ixdead", "retire",
          "relayout", "owners")


_pack: Any
try:  # hiredis packs a command in C, ~7x faster than redis-py's encoder on big script calls
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is a dependency; older ones lack it
    _pack = None


_POOLS = (redis.ConnectionPool, redis.BlockingConnectionPool)
_PING = b"*1\r\n$4\r\nPING\r\n"


class SyncKept:
    """One connection of a standalone blocking client kept out of its pool for script calls,
    used by one thread at a time (a thread that finds it busy takes one from the pool):
    redis-py's pool takes ~40 Python calls and a ``poll`` to hand a connection out and back,
    on the path of every lone ``enqueue`` and ``enqueue_and_wait``. A broken connection is
    given back and replaced; a forked child takes its own. Not for a Sentinel client, whose
    pool checks on release that a connection still points at the primary."""

    __slots__ = ("conn", "lock")

    def __init__(self) -> None:
        self.conn: Any = None
        self.lock = threading.Lock()

    @staticmethod
    def of(client: Any) -> SyncKept | None:
        kept: SyncKept | None = client.__dict__.get("_streamq_kept")
        if kept is None and type(client.connection_pool) in _POOLS:
            kept = client.__dict__.setdefault("_streamq_kept", SyncKept())
        return kept

    def run(self, pool: Any, packed: bytes) -> Any:
        """Send ``packed``, read its reply; with ``lock`` held."""
        conn = self.conn
        if conn is None or conn.pid != os.getpid():
            conn = self.conn = pool.get_connection()
        try:
            conn.send_packed_command([packed])
            return conn.read_response()
        except BaseException as exc:  # a broken or interrupted exchange: never reuse it
            if not isinstance(exc, ResponseError):
                self.conn = None
                conn.disconnect()
                pool.release(conn)
            raise


_KINDS: dict[type[Any], bool] = {}


def _scluster(client: Any) -> bool:
    """True for a blocking ``redis.cluster.RedisCluster`` (cached per class)."""
    kind = _KINDS.get(type(client))
    if kind is None:
        from redis.cluster import RedisCluster

        kind = _KINDS[type(client)] = isinstance(client, RedisCluster)
    return kind


def pack_run(args: Sequence[Arg]) -> bytes:
    """``args`` as a command's RESP bulk strings, without the array header: a run of a
    script call's keys or arguments, packed once and reused when it does not change (hiredis
    packs each value with a ``sprintf``), or per call for the part that does
    (:meth:`Script.packed`). Empty without hiredis (nothing is packed then)."""
    if not args or _pack is None:
        return b""
    raw: bytes = _pack(tuple(args))
    return raw[raw.index(b"\n") + 1:]


_BULK = tuple(f"${n}" for n in range(256))
"""A bulk string's header for each length ``pack_strs`` packs itself."""


def pack_strs(args: list[str]) -> bytes:
    """:func:`pack_run` for a run of short ASCII strings (a settle's job keys, entries and
    tokens): the same bytes, made with one ``join`` instead of a ``sprintf`` per value
    (about 350 CPU instructions less per value). Anything else (a value not a str, longer
    than 255 characters, or not ASCII: its length in bytes differs) goes to ``pack_run``."""
    if not args or _pack is None:
        return b""
    n2 = 2 * len(args)
    flat = [""] * (n2 + 1)  # header, value, header, value, ..., "" (the last CRLF)
    try:
        flat[0:n2:2] = map(_BULK.__getitem__, map(len, args))
        flat[1:n2:2] = args
        text = "\r\n".join(flat)
    except (TypeError, IndexError):
        return pack_run(args)
    if not text.isascii():
        return pack_run(args)
    return text.encode()


class Script:
    """One Lua script, addressed by its SHA1."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()
        self._head = pack_run(("EVALSHA", self.sha))

    def packable(self, client: Any) -> bool:
        """True when calls to ``client`` may be sent as :meth:`packed` bytes
        (:meth:`run_packed_async`): one server (or a Sentinel primary) and hiredis."""
        return self._plain(client)

    def packed(self, nkeys: int, count: int, runs: Sequence[bytes]) -> bytes:
        """This script's EVALSHA from runs of keys and arguments packed with
        :func:`pack_run` (in order, keys first): ``count`` values in all, the first
        ``nkeys`` of them keys. The same bytes as the call packed whole."""
        n = b"%d" % nkeys
        return b"".join((b"*%d\r\n%s$%d\r\n%s\r\n" % (count + 3, self._head, len(n), n),
                         *runs))

    async def run_packed_async(self, client: aredis.Redis, packed: bytes, *,
                               kept: Kept | None = None, ping_first: bool = False) -> Any:
        """:meth:`run_async` of a call packed already (:meth:`packed`; only where
        :meth:`packable`): the same exchange, errors and NOSCRIPT fallback."""
        try:
            try:
                return await self._send(client, packed, kept, ping_first)
            except NoScriptError:
                await client.script_load(self.source)
                return await self._send(client, packed, kept, ping_first)
        except ResponseError as exc:
            err = self._error(exc, client)
            if err is exc:
                raise
            raise err from exc

    @staticmethod
    async def _send(client: aredis.Redis, packed: bytes, kept: Kept | None,
                    ping_first: bool) -> Any:
        if ping_first:
            return await exchange(client, _PING + packed, 2, kept)
        return await exchange(client, packed, 1, kept)

    @staticmethod
    def _plain(client: Any) -> bool:
        """A client we can pack for: one connection pool, no pinned connection (a
        RedisCluster client routes by slot itself)."""
        return (_pack is not None and getattr(client, "connection_pool", None) is not None
                and getattr(client, "connection", None) is None)

    def _evalsha(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        if not self._plain(client):
            if _pack is not None and keys and _scluster(client):  # packed for the slot's node
                return nodes.send_one(client, keys[0],
                                      ("EVALSHA", self.sha, len(keys), *keys, *args))
            return client.evalsha(self.sha, len(keys), *keys, *args)
        pool: Any = client.connection_pool
        kept = SyncKept.of(client)
        if kept is not None and kept.lock.acquire(blocking=False):
            try:
                return kept.run(pool, _pack(("EVALSHA", self.sha, len(keys), *keys, *args)))
            finally:
                kept.lock.release()
        conn = pool.get_connection()
        try:
            conn.send_packed_command([_pack(("EVALSHA", self.sha, len(keys), *keys, *args))])
            return conn.read_response()
        except BaseException as exc:  # a broken or interrupted exchange: never reuse it
            if not isinstance(exc, ResponseError):
                conn.disconnect()
            raise
        finally:
            pool.release(conn)

    async def _aevalsha(self, client: aredis.Redis, keys: Sequence[str],
                        args: Sequence[Arg], kept: Kept | None = None,
                        ping_first: bool = False) -> Any:
        if not self._plain(client):
            if _pack is not None and keys and acluster(client):  # packed for the slot's node
                return await cexchange(client, keys[0],
                                       ("EVALSHA", self.sha, len(keys), *keys, *args),
                                       kept, ping_first)
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        return await self._send(client, _pack(("EVALSHA", self.sha, len(keys), *keys, *args)),
                                kept, ping_first)

    def _packed(self, calls: Sequence[tuple[Sequence[str], Sequence[Arg]]]) -> list[bytes]:
        return [_pack(("EVALSHA", self.sha, len(k), *k, *a)) for k, a in calls]

    def run_many(self, client: redis.Redis,
                 calls: Sequence[tuple[Sequence[str], Sequence[Arg]]]) -> list[Any]:
        """Several calls of this script in one round trip (pipelined); replies in order.
        Every reply is read: on NOSCRIPT (a restarted server) the script is loaded and only the
        calls that met NOSCRIPT are sent again. Others in the same pipeline may have run (a
        second client can load the script between two of them) and must not run twice.
        On a Redis Cluster the calls go out as one pipeline per node (``nodes.py``)."""
        if is_cluster(client):
            return self._cluster_many(client, calls, nodes.run(client, self._commands(calls)))
        if not self._plain(client):
            return [self(client, k, a) for k, a in calls]
        pool: Any = client.connection_pool
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(2):
            conn = pool.get_connection()
            try:
                conn.send_packed_command(self._packed([calls[i] for i in todo]))
                got: list[Any] = []
                for _ in todo:
                    try:
                        got.append(conn.read_response())
                    except ResponseError as exc:  # the reply was read whole: read on
                        got.append(exc)
                todo, failed = _sort(todo, got, replies)
            except BaseException:  # replies may be left unread: never reuse it
                conn.disconnect()
                raise
            finally:
                pool.release(conn)
            if failed is not None:
                raise self._error(failed) from failed
            if not todo:
                return replies
            if attempt == 0:
                client.script_load(self.source)
        raise ScriptError(f"{self.name}.lua: NOSCRIPT after loading it")

    async def run_many_async(self, client: aredis.Redis,
                             calls: Sequence[tuple[Sequence[str], Sequence[Arg]]]) -> list[Any]:
        if is_cluster(client):
            first = await nodes.arun(client, self._commands(calls))
            if any(isinstance(r, NoScriptError) for r in first):
                await client.script_load(self.source)  # every primary
                again = [i for i, r in enumerate(first) if isinstance(r, NoScriptError)]
                for i, r in zip(again, await nodes.arun(
                        client, self._commands([calls[i] for i in again])), strict=True):
                    first[i] = r
            return self._cluster_many(client, calls, first, loaded=True)
        if not self._plain(client):
            return [await self.run_async(client, k, a) for k, a in calls]
        pool: Any = client.connection_pool
        replies: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for attempt in range(2):
            conn = await pool.get_connection()
            try:
                await conn.send_packed_command(
                    b"".join(self._packed([calls[i] for i in todo])))
                got: list[Any] = []
                for _ in todo:
                    try:
                        got.append(await conn.read_response())
                    except ResponseError as exc:  # the reply was read whole: read on
                        got.append(exc)
                todo, failed = _sort(todo, got, replies)
            except BaseException:
                await conn.disconnect()
                raise
            finally:
                await pool.release(conn)
            if failed is not None:
                raise self._error(failed) from failed
            if not todo:
                return replies
            if attempt == 0:
                await client.script_load(self.source)
        raise ScriptError(f"{self.name}.lua: NOSCRIPT after loading it")

    def _commands(self, calls: Sequence[tuple[Sequence[str], Sequence[Arg]]]
                  ) -> list[tuple[Any, ...]]:
        return [("EVALSHA", self.sha, len(k), *k, *a) for k, a in calls]

    def _cluster_many(self, client: Any, calls: Sequence[tuple[Sequence[str], Sequence[Arg]]],
                      got: list[Any], loaded: bool = False) -> list[Any]:
        """File the per-node replies of ``calls``: NOSCRIPT (a node that never ran the script,
        e.g. a promoted replica) loads it on every primary and sends those calls alone again;
        a redirect or TRYAGAIN still standing after ``nodes.run`` followed it is raised as
        itself (transient: the call did not run)."""
        replies: list[Any] = [None] * len(calls)
        todo, failed = _sort(list(range(len(calls))), got, replies)
        if todo and not loaded:
            client.script_load(self.source)  # every primary
            again = nodes.run(client, self._commands([calls[i] for i in todo]))
            todo, failed2 = _sort(todo, again, replies)
            failed = failed or failed2
        if todo:
            raise ScriptError(f"{self.name}.lua: NOSCRIPT after loading it")
        if failed is not None:
            if isinstance(failed, MovedError | AskError | TryAgainError):
                raise failed
            raise ScriptError(f"{self.name}.lua failed: {failed}") from failed
        return replies

    def _error(self, exc: ResponseError, client: Any = None) -> Exception:
        """The error for a script call's error reply. ``MOVED`` on a plain client: the URL
        names one node of a Redis Cluster. On a cluster client (which follows redirects) a
        MOVED, ASK or TRYAGAIN still standing after the redirect rounds is itself (transient:
        the call did not run)."""
        if isinstance(exc, MovedError | AskError | TryAgainError) and client is not None and (
                _scluster(client) or acluster(client)):
            return exc
        if isinstance(exc, MovedError):
            return standalone_on_cluster(None)
        return ScriptError(f"{self.name}.lua failed: {exc}")

    def __call__(self, client: redis.Redis, keys: Sequence[str], args: Sequence[Arg]) -> Any:
        try:
            try:
                return self._evalsha(client, keys, args)
            except NoScriptError:  # a restarted server lost its script cache
                client.script_load(self.source)
                return self._evalsha(client, keys, args)
        except ResponseError as exc:
            err = self._error(exc, client)
            if err is exc:
                raise
            raise err from exc

    async def run_async(
        self, client: aredis.Redis, keys: Sequence[str], args: Sequence[Arg], *,
        kept: Kept | None = None, ping_first: bool = False
    ) -> Any:
        """Run the script; ``kept``: on the connection it holds (taken from the pool at
        the first call, replaced when it breaks; one caller at a time), without a pool
        round trip per call. ``ping_first``: a PING goes out ahead of the call, in the same
        write. Redis writes its clients' pending replies newest-queued client first; with
        the PING's reply already pending for this client, what the script publishes (a
        waiter's result) is written before the script's own reply, so the waiting process
        wakes before this one, not after it (docs/performance.md). On a Redis Cluster the
        same, on a connection to the node that owns the keys' slot (``sends.cexchange``;
        ``kept``: the slot is computed once, and the connection follows the slot to a new
        owner)."""
        try:
            try:
                return await self._aevalsha(client, keys, args, kept, ping_first)
            except NoScriptError:
                await client.script_load(self.source)
                return await self._aevalsha(client, keys, args, kept, ping_first)
        except ResponseError as exc:
            err = self._error(exc, client)
            if err is exc:
                raise
            raise err from exc


def _sort(todo: list[int], got: list[Any], replies: list[Any]
          ) -> tuple[list[int], ResponseError | None]:
    """File the replies ``got`` for the calls ``todo`` into ``replies``; return the calls that
    met NOSCRIPT (to send again) and the first other error reply."""
    again: list[int] = []
    failed: ResponseError | None = None
    for i, x in zip(todo, got, strict=True):
        if isinstance(x, NoScriptError):
            again.append(i)
        elif isinstance(x, ResponseError):
            failed = failed or x
        else:
            replies[i] = x
    return again, failed


class Pipelined:
    """Calls of one script sent back to back on one connection, up to ``depth`` replies
    outstanding: the caller builds the next call while Redis runs the previous one. Each
    reply goes to ``on_reply(tag, reply)`` in order. A client that cannot be packed for (a
    RedisCluster) runs each call at once. Use as a context manager: leaving it reads every
    outstanding reply (or, on an error, drops the connection)."""

    def __init__(self, script: Script, client: redis.Redis, on_reply: Any,
                 depth: int = 2) -> None:
        self.script, self.client, self.on_reply, self.depth = script, client, on_reply, depth
        self._conn: Any = None
        self._inflight: deque[tuple[Any, Sequence[str], Sequence[Arg]]] = deque()

    def __enter__(self) -> Pipelined:
        if self.script._plain(self.client):
            self._conn = self.client.connection_pool.get_connection()
        return self

    def send(self, tag: Any, keys: Sequence[str], args: Sequence[Arg]) -> None:
        if self._conn is None:
            self.on_reply(tag, self.script(self.client, keys, args))
            return
        self._conn.send_packed_command(
            [_pack(("EVALSHA", self.script.sha, len(keys), *keys, *args))])
        self._inflight.append((tag, keys, args))
        while len(self._inflight) >= self.depth:
            self._read_one()

    def _read_one(self) -> None:
        tag, keys, args = self._inflight.popleft()
        try:
            reply = self._conn.read_response()
        except NoScriptError:  # the server lost its script cache: load it, run this call again
            self.client.script_load(self.script.source)
            reply = self.script(self.client, keys, args)
        except ResponseError as exc:
            raise ScriptError(f"{self.script.name}.lua failed: {exc}") from exc
        self.on_reply(tag, reply)

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        conn = self._conn
        if conn is None:
            return
        try:
            if exc_type is None:
                while self._inflight:
                    self._read_one()
        except BaseException:
            conn.disconnect()
            raise
        finally:
            if exc_type is not None:
                conn.disconnect()  # replies may be left unread: never reuse it
            self._conn = None
            self._inflight.clear()
            self.client.connection_pool.release(conn)


_TOP = re.compile(r"^(?:local\s+function\s+(\w+)|function\s+(\w+)|local\s)")
_WORD = re.compile(r"[A-Za-z_]\w*")


@functools.lru_cache(maxsize=2)
def _chunks(lib: str) -> tuple[tuple[frozenset[str], frozenset[str], str], ...]:
    """The library's top-level statements: (names each defines or assigns, names it uses,
    its text). A statement starts at a line that begins (column 0) with ``local`` or
    ``function`` and runs to the next one (the lines before the first define nothing).
    Cut once per library text (every script's load asks for them several times: cutting
    them each time cost about 0.4 s of ``import streamq``)."""
    starts = [i for i, line in enumerate(lib.splitlines()) if _TOP.match(line)]
    lines = lib.splitlines()
    out: list[tuple[frozenset[str], frozenset[str], str]] = []
    for a, b in zip([0, *starts], [*starts, len(lines)], strict=True):
        if a == b:
            continue
        text = "\n".join(lines[a:b])
        code = _code(text)
        m = _TOP.match(lines[a])
        if m is None:
            defined: frozenset[str] = frozenset()
        elif m.group(1) or m.group(2):
            defined = frozenset({m.group(1) or m.group(2)})
        else:  # local a, b, c [= ...]: the names may run over several lines
            defined = frozenset(_WORD.findall(code[len("local"):].split("=", 1)[0]))
        out.append((defined, frozenset(_WORD.findall(code)), text))
    return tuple(out)


def _code(text: str) -> str:
    """``text`` without its whole-line comments (words in them are no use). A comment after
    code stays: telling it from a ``--`` inside a string is not worth the risk, and a word
    kept too many only keeps a helper too many."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("--"))


def shaken(lib: str, body: str) -> str:
    """``lib`` cut to the statements ``body`` needs, in their order, then ``body``.

    Redis runs a script's whole text on every call: each ``local function`` of the shared
    helpers is a closure made, and garbage collected, per call (callgrind: ~72,000
    redis-server instructions per call for the whole library against ~11,500 for a bare
    ``return 1``). A statement is kept when it defines (or assigns) a name the body or a
    kept statement uses; one that defines nothing is always kept. Words in strings count as
    uses: keeping too much costs time, never correctness."""
    chunks = _chunks(lib)
    want = set(_WORD.findall(_code(body)))
    keep = [not d for d, _u, _t in chunks]
    changed = True
    while changed:
        changed = False
        for i, (defines, uses, _text) in enumerate(chunks):
            if not keep[i] and defines & want:
                keep[i] = changed = True
                want |= uses
    return "\n".join(t for k, (_d, _u, t) in zip(keep, chunks, strict=True) if k) + "\n" + body


_LOADERS = (("lib_cold", "COLD"), ("lib_groups", "GROUPS"), ("lib_rate", "RATE"),
            ("lib_flow", "FLOW"))
"""The helper loaders of the library: each makes its functions when a script call first asks
for them and returns them in a table (``VAR = {name = name, ...}``)."""


def cold_first(lib: str, body: str) -> str:
    """``body``, preceded by locals of the helpers it names that one of the library's loaders
    (``_LOADERS``: ``_lib.lua``'s ``lib_cold``, ``_groups.lua``'s ``lib_groups``,
    ``_rate.lua``'s ``lib_rate``) makes on first need. A body that calls a loader itself
    (enqueue.lua, finish.lua) gets no locals of that one: it asks for them on the paths that
    need one, so that its common calls make none of them."""
    uses = set(_WORD.findall(_code(body)))
    head = ""
    for loader, var in _LOADERS:
        names: list[str] = []
        for defines, _uses, text in _chunks(lib):
            if loader in defines and f"{var} = {{" in text:
                table = text[text.index(f"{var} = {{"):]
                names = re.findall(r"\b(\w+)\s*=\s*\1\b", table[:table.index("}")])
        named = [n for n in names if n in uses]
        if loader in uses or not named:
            continue
        head += (f"local _{var} = {loader}()\n"
                 f"local {', '.join(named)} = {', '.join(f'_{var}.' + n for n in named)}\n")
    return head + body


def _load() -> dict[str, Script]:
    pkg = resources.files("streamq") / "lua"
    lib = "\n".join((pkg / name).read_text()
                    for name in ("_lib.lua", "_groups.lua", "_rate.lua", "_flow.lua"))
    return {n: Script(n, shaken(lib, cold_first(lib, (pkg / f"{n}.lua").read_text())))
            for n in _NAMES}


SCRIPTS = _load()
