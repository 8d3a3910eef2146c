"""Raw pipelines on a Redis Cluster, grouped by node.

The admin operations and bulk script calls parse raw RESP2 replies and pipeline many calls at
once. On one server that is one pipeline; on a Redis Cluster each call goes to the primary that
owns its key's slot, so the calls are grouped by node and each group is one pipeline on one of
that node's connections (replies read raw, without redis-py's reply callbacks). Every key of a
queue carries the queue's ``{Q}`` hash tag, so a queue's calls all land on one node; the queue
registry key (``streamq:queues``) may live on another, which is why grouping is per call.

A reply of ``MOVED`` (the slot has a new owner: failover or resharding) or ``ASK`` (the slot is
being migrated and the key is already on the target) means the call did not run, so it is sent
again to the named node (``ASK`` behind ``ASKING``); following a redirect is never a repeat.
``TRYAGAIN`` (a multi-key call during a migration) did not run either and is sent again after a
pause. A redirect that still stands after a slot-map refresh (a failover the nodes do not agree
on yet) is followed again after a growing pause; one still standing after ``_ROUNDS`` is handed
back as the call's reply (a transient error: ``retry.transient``). An ``ASK`` to a node the
client does not know (a new primary that owns no slot yet: the target of its first reshard is
in no slot map) adds that node to the client's nodes.

The nodes' pipelines of a round are all sent before any is read (asyncio: run together), so the
calls of several nodes run at the same time and a slow or stalled node delays only its own
calls. A connection error of one node (down, stalled past the socket timeout) marks the slot
map for a refresh; :func:`run` raises it once every other node's replies are read, while
``run_tailed(..., each=True)`` hands it back as the reply of each of that node's calls that
were not answered (the calls answered before it, and those of the other nodes, keep their own
replies: a bulk write answers per job).

``run_tailed`` appends commands to each node's pipeline, after its calls on the same
connection (``durable.py``: barrier writes and ``WAIT`` for ``QueueConfig.min_replicas``),
and tells each call the tail replies of the pipeline that ran it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.crc import key_slot
from redis.exceptions import AskError, MovedError, ResponseError, TryAgainError

_KEYLESS = frozenset({"TIME", "ECHO", "INFO", "PING", "SCRIPT"})
_ROUNDS = 5
"""Redirects followed per call before its MOVED/ASK reply is handed back as an error."""
_PAUSE_S = 0.05
"""The first pause before a round that follows a redirect standing after a refresh (or a
TRYAGAIN); it doubles each round (at most 0.05 + 0.1 + 0.2 + 0.4 s in all)."""
_DOWN = (redis.ConnectionError, redis.TimeoutError)
"""A node's pipeline failed as a whole: its node is down, stalled or unreachable."""

Command = tuple[Any, ...]

_pack: Any
try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is a dependency
    _pack = None


def key_of(args: Command) -> Any:
    """The key that routes a command (None for a keyless one: it follows the batch)."""
    name = str(args[0]).upper() if not isinstance(args[0], bytes) else args[0].decode().upper()
    if name in _KEYLESS:
        return None
    if name in ("EVALSHA", "EVAL", "FCALL", "FCALL_RO"):
        return args[3] if int(args[2]) > 0 else None
    if name == "XINFO":
        return args[2]
    if name in ("XREAD", "XREADGROUP"):
        upper = [str(a).upper() for a in args]
        return args[upper.index("STREAMS") + 1]
    return args[1] if len(args) > 1 else None


_SLOTS: dict[Any, int] = {}


def slot_of(key: str | bytes) -> int:
    """The cluster slot of ``key`` (CRC16 of its hash tag), remembered: a process's calls
    route by a few keys (each queue's or lane's first key), over and over."""
    slot = _SLOTS.get(key)
    if slot is None:
        if len(_SLOTS) >= 4096:
            _SLOTS.clear()
        slot = _SLOTS[key] = key_slot(key.encode() if isinstance(key, str) else key)
    return slot


def send_one(client: Any, key: str | bytes, command: Command) -> Any:
    """One command on a blocking cluster client, every key of it in ``key``'s slot: packed
    with hiredis and sent on a pooled connection of the primary that owns the slot (redis-py
    packs in Python and hashes every key of a call: ~3x the CPU of a lone enqueue). Its
    reply, raw; an error reply raised. A MOVED, ASK or TRYAGAIN reply (the command did not
    run) is followed by :func:`run`; a connection error refreshes the slot map and is
    raised."""
    try:
        node = client.nodes_manager.slots_cache[slot_of(key)][0]
    except (KeyError, IndexError):  # a slot not covered (yet): the slow way
        return _routed(client, command)
    pool = client.get_redis_connection(node).connection_pool
    conn = pool.get_connection()
    try:
        conn.send_packed_command([_pack(command)])
        return conn.read_response()
    except (MovedError, AskError, TryAgainError):  # read whole, not run: followed below
        pass
    except ResponseError:
        raise
    except BaseException as exc:  # a broken or interrupted exchange: never reuse it
        conn.disconnect()
        if isinstance(exc, _DOWN):
            _refresh(client)
        raise
    finally:
        pool.release(conn)
    return _routed(client, command)


def _routed(client: Any, command: Command) -> Any:
    (reply,) = run(client, [command])
    if isinstance(reply, BaseException):
        raise reply
    return reply


def _packed(conn: Any, commands: Sequence[Command]) -> Any:
    if _pack is not None:
        return [_pack(tuple(c)) for c in commands]
    return conn.pack_commands(commands)


def _plan(client: Any, commands: Sequence[Command], todo: dict[int, Any]
          ) -> dict[str, tuple[Any, list[int]]]:
    """Group the calls ``todo`` (index -> ASK target node or None) by node."""
    anchor = next((key_of(commands[i]) for i in todo if key_of(commands[i]) is not None), None)
    default = (client.get_node_from_key(anchor) if anchor is not None
               else client.get_default_node())
    groups: dict[str, tuple[Any, list[int]]] = {}
    for i, ask in todo.items():
        if ask is not None:
            node = ask
        else:
            key = key_of(commands[i])
            node = default if key is None else client.get_node_from_key(key)
        groups.setdefault(node.name, (node, []))[1].append(i)
    return groups


def _file(replies: list[Any], idx: list[int], got: list[Any], client: Any,
          todo: dict[int, Any], asked: dict[int, Any]) -> tuple[bool, bool]:
    """File ``got`` into ``replies``; put redirected calls back in ``todo`` (an ASK goes to
    its named node, added to the client's nodes when it knows none there; a TRYAGAIN goes
    back where it was sent, behind ASKING again if it was).
    Returns (slot map stale, a TRYAGAIN seen)."""
    stale = again = False
    for i, rep in zip(idx, got, strict=True):
        replies[i] = rep
        if isinstance(rep, MovedError):
            stale, todo[i] = True, None
        elif isinstance(rep, AskError):
            todo[i] = (client.get_node(host=rep.host, port=rep.port)
                       or _new_node(client, rep.host, rep.port))
        elif isinstance(rep, TryAgainError):
            again, todo[i] = True, asked.get(i)
    return stale, again


def _new_node(client: Any, host: str, port: int) -> Any:
    """A primary the client's slot map does not name (it owns no slot yet: an ASK sent the
    client there), added to its nodes (a refresh of the map drops it again)."""
    from redis.asyncio.cluster import RedisCluster as AsyncCluster

    mgr = client.nodes_manager
    node: Any
    if isinstance(client, AsyncCluster):
        from redis.asyncio.cluster import ClusterNode as AsyncNode
        node = AsyncNode(host, port, "primary", **mgr.connection_kwargs)
        return mgr.nodes_cache.setdefault(node.name, node)
    from redis.cluster import ClusterNode

    node = ClusterNode(host, port, "primary")  # type: ignore[no-untyped-call]
    with mgr._lock:
        return mgr.nodes_cache.setdefault(node.name, node)


_CLUSTER: Any = None


def cluster_class() -> Any:
    """redis-py's blocking ``RedisCluster``, following an ``ASK`` to a primary its slot map
    does not name: a new primary owns no slot until its first reshard completes, and
    redis-py, finding no node of that name, fails the call with an AttributeError (its
    asyncio client follows it). Made on first use (redis.cluster is imported lazily)."""
    global _CLUSTER
    if _CLUSTER is None:
        from redis.cluster import RedisCluster

        class StreamqCluster(RedisCluster):
            def get_node(self, host: Any = None, port: Any = None,
                         node_name: Any = None) -> Any:
                node = super().get_node(host, port, node_name)  # type: ignore[no-untyped-call]
                if node is None and node_name and not host:  # redis-py's ASK: by name only
                    h, _, p = str(node_name).rpartition(":")
                    if h and p.isdigit():
                        return _new_node(self, h, int(p))
                return node

        _CLUSTER = StreamqCluster
    return _CLUSTER


def _asked(commands: Sequence[Command], asking: list[bool]) -> list[Command]:
    sent: list[Command] = []
    for cmd, ask in zip(commands, asking, strict=True):
        if ask:
            sent.append(("ASKING",))
        sent.append(cmd)
    return sent


class _Sent:
    """One node's pipeline written on one of its connections, its replies not read yet."""

    __slots__ = ("asking", "conn", "pool")

    def __init__(self, client: Any, node: Any, commands: Sequence[Command],
                 asking: list[bool]) -> None:
        self.asking = asking
        self.pool = client.get_redis_connection(node).connection_pool
        self.conn = self.pool.get_connection()
        try:
            self.conn.send_packed_command(_packed(self.conn, _asked(commands, asking)))
        except BaseException:
            self.drop()
            raise

    def drop(self) -> None:
        """Replies may be left unread: never reuse the connection."""
        try:
            self.conn.disconnect()
        finally:
            self.pool.release(self.conn)

    def read(self) -> list[Any]:
        """Every reply, read raw (error replies as exception objects). When the connection
        fails midway (``_DOWN``), the replies read so far are kept and each command not
        answered gets that error."""
        conn = self.conn
        out: list[Any] = []
        try:
            for ask in self.asking:
                if ask:
                    with contextlib.suppress(ResponseError):
                        conn.read_response()
                try:
                    out.append(conn.read_response())
                except ResponseError as exc:  # read whole: read on
                    out.append(exc)
        except _DOWN as exc:
            self.drop()
            return out + [exc] * (len(self.asking) - len(out))
        except BaseException:
            self.drop()
            raise
        self.pool.release(conn)
        return out


def _node_pipelines(client: Any, groups: Sequence[tuple[Any, list[Command], list[bool]]]
                    ) -> list[list[Any] | BaseException]:
    """Every node's pipeline written first, then each one's replies read: the nodes run
    their calls at the same time. A node whose pipeline fails as a whole (``_DOWN``) gets
    its error in place of its replies; the others' replies are read all the same."""
    sent: list[_Sent | BaseException] = []
    read = 0
    try:
        for node, cmds, asking in groups:
            try:
                sent.append(_Sent(client, node, cmds, asking))
            except _DOWN as exc:
                sent.append(exc)
        out: list[list[Any] | BaseException] = []
        for s in sent:
            read += 1  # (read() releases or drops its connection itself)
            if isinstance(s, BaseException):
                out.append(s)
                continue
            out.append(s.read())
        return out
    except BaseException:  # what was written and not read yet: never reuse it
        for s in sent[read:]:
            if isinstance(s, _Sent):
                s.drop()
        raise


async def _anode_pipeline(node: Any, commands: Sequence[Command], asking: list[bool]
                          ) -> list[Any] | BaseException:
    """One pipeline on one of ``node``'s connections; every reply read raw (a node whose
    pipeline fails as a whole: ``_DOWN``, returned)."""
    try:
        return await _anode_pipeline_raw(node, commands, asking)
    except _DOWN as exc:
        return exc


async def _anode_pipeline_raw(node: Any, commands: Sequence[Command], asking: list[bool]
                              ) -> list[Any]:
    conn = node.acquire_connection()
    try:
        packed = _packed(conn, _asked(commands, asking))
        await conn.send_packed_command(b"".join(packed) if _pack is not None else packed)
        out: list[Any] = []
        try:
            for ask in asking:
                if ask:
                    with contextlib.suppress(ResponseError):
                        await conn.read_response()
                try:
                    out.append(await conn.read_response())
                except ResponseError as exc:
                    out.append(exc)
        except _DOWN as exc:  # keep what was read; the rest get the error
            await conn.disconnect()
            return out + [exc] * (len(asking) - len(out))
        return out
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        node.release(conn)


def _refresh(client: Any) -> None:
    """Re-learn the slot map (best effort: a node that is down may fail it; the next call
    tries again)."""
    with contextlib.suppress(redis.RedisError, Exception):
        client.nodes_manager.initialize()


async def _arefresh(client: Any) -> None:
    with contextlib.suppress(redis.RedisError, Exception):
        await client.nodes_manager.initialize()


Tail = Callable[[Sequence[Command], Sequence[bool]], list[tuple[Command, bool]]]
"""Commands to append to one node's pipeline, after its calls: given the group's calls and
whether each goes behind ASKING, (command, behind ASKING) pairs (``durable.py``: a barrier
write in each call's slot, then WAIT)."""


def _sendable(commands: Sequence[Command], idx: list[int], asked: dict[int, Any],
              tail: Tail | None) -> tuple[list[Command], list[bool]]:
    cmds = [commands[i] for i in idx]
    asking = [i in asked for i in idx]
    if tail is not None:
        for cmd, ask in tail(list(cmds), list(asking)):
            cmds.append(cmd)
            asking.append(ask)
    return cmds, asking


def run(client: Any, commands: Sequence[Command]) -> list[Any]:
    """Send ``commands`` over a cluster client, pipelined per node; replies in order, error
    replies as exception objects (raw: no reply callbacks). A node that fails as a whole
    raises its error (after every other node's replies are read)."""
    return run_tailed(client, commands, None)[0]


class _Round:
    """What a round's replies left to do."""

    __slots__ = ("again", "down", "stale", "todo")

    def __init__(self) -> None:
        self.todo: dict[int, Any] = {}
        self.stale = self.again = False
        self.down: BaseException | None = None


def _filed(client: Any, commands: Sequence[Command], groups: list[tuple[Any, list[int]]],
           got: list[list[Any] | BaseException], asked: dict[int, Any], replies: list[Any],
           tails: list[list[Any]]) -> _Round:
    r = _Round()
    for (_, idx), g in zip(groups, got, strict=True):
        if isinstance(g, BaseException):  # the node failed as a whole: its calls only
            r.down = r.down or g
            for i in idx:
                replies[i], tails[i] = g, [g]
            continue
        if g and isinstance(g[-1], _DOWN):  # failed midway: the calls not answered only
            r.down = r.down or g[-1]
        for i in idx:
            tails[i] = g[len(idx):]
        s, a = _file(replies, idx, g[:len(idx)], client, r.todo, asked)
        r.stale, r.again = r.stale or s, r.again or a
    return r


def _pause(r: _Round, round_: int) -> float:
    """The pause before the next round: after a TRYAGAIN, or a redirect still standing
    after the slot map was refreshed (the nodes do not agree on it yet)."""
    if (r.again or (r.stale and round_ > 0)) and round_ < _ROUNDS - 1:
        return float(_PAUSE_S * 2 ** round_)
    return 0.0


def run_tailed(client: Any, commands: Sequence[Command], tail: Tail | None, *,
               each: bool = False) -> tuple[list[Any], list[list[Any]]]:
    """:func:`run`, each node's pipeline followed by ``tail``'s commands on the same
    connection: (replies, for each call the tail's replies of the pipeline that ran it).
    A redirected call is sent again with the next round's pipeline (and its own tail).
    ``each``: a node that fails as a whole gives its error as the reply (and tail) of each
    of its calls, instead of raising it."""
    replies: list[Any] = [None] * len(commands)
    tails: list[list[Any]] = [[] for _ in commands]
    todo: dict[int, Any] = dict.fromkeys(range(len(commands)))
    for round_ in range(_ROUNDS):
        groups = list(_plan(client, commands, todo).values())
        asked = {i: ask for i, ask in todo.items() if ask is not None}
        got = _node_pipelines(client, [(node, *_sendable(commands, idx, asked, tail))
                                       for node, idx in groups])
        r = _filed(client, commands, groups, got, asked, replies, tails)
        if r.down is not None:
            _refresh(client)  # the node may be gone: its slots may have a new owner
            if not each:
                raise r.down
        todo = r.todo
        if not todo:
            break
        if r.stale:
            _refresh(client)
        pause = _pause(r, round_)
        if pause:
            time.sleep(pause)
    return replies, tails


async def arun(client: Any, commands: Sequence[Command]) -> list[Any]:
    """:func:`run` for an asyncio cluster client."""
    return (await arun_tailed(client, commands, None))[0]


async def arun_tailed(client: Any, commands: Sequence[Command], tail: Tail | None, *,
                      each: bool = False) -> tuple[list[Any], list[list[Any]]]:
    """:func:`run_tailed` for an asyncio cluster client (the nodes' pipelines run together)."""
    await client.initialize()
    replies: list[Any] = [None] * len(commands)
    tails: list[list[Any]] = [[] for _ in commands]
    todo: dict[int, Any] = dict.fromkeys(range(len(commands)))
    for round_ in range(_ROUNDS):
        groups = list(_plan(client, commands, todo).values())
        asked = {i: ask for i, ask in todo.items() if ask is not None}
        got = list(await asyncio.gather(*(
            _anode_pipeline(node, *_sendable(commands, idx, asked, tail))
            for node, idx in groups)))
        r = _filed(client, commands, groups, got, asked, replies, tails)
        if r.down is not None:
            await _arefresh(client)
            if not each:
                raise r.down
        todo = r.todo
        if not todo:
            break
        if r.stale:
            await _arefresh(client)
        pause = _pause(r, round_)
        if pause:
            await asyncio.sleep(pause)
    return replies, tails
