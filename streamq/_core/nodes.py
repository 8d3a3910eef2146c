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
pause. A connection error is raised (the caller's retry policy decides; it marks the slot map
for a refresh first, as the node may be gone).

``run_tailed`` appends commands to each node's pipeline, after its calls on the same
connection (``durable.py``: a barrier write and ``WAIT`` for ``QueueConfig.min_replicas``),
and tells each call the tail replies of the pipeline that ran it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import redis
from redis.exceptions import AskError, MovedError, ResponseError, TryAgainError

_KEYLESS = frozenset({"TIME", "ECHO", "INFO", "PING", "SCRIPT"})
_ROUNDS = 5
"""Redirects followed per call before its MOVED/ASK reply is handed back as an error."""

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
    its named node; one the client does not know yet is routed again after a refresh; a
    TRYAGAIN goes back where it was sent, behind ASKING again if it was).
    Returns (slot map stale, a TRYAGAIN seen)."""
    stale = again = False
    for i, rep in zip(idx, got, strict=True):
        replies[i] = rep
        if isinstance(rep, MovedError):
            stale, todo[i] = True, None
        elif isinstance(rep, AskError):
            todo[i] = client.get_node(host=rep.host, port=rep.port)
            stale = stale or todo[i] is None
        elif isinstance(rep, TryAgainError):
            again, todo[i] = True, asked.get(i)
    return stale, again


def _node_pipeline(client: Any, node: Any, commands: Sequence[Command], asking: list[bool]
                   ) -> list[Any]:
    """One pipeline on one of ``node``'s connections; every reply read raw."""
    pool = client.get_redis_connection(node).connection_pool
    conn = pool.get_connection()
    try:
        out: list[Any] = []
        sent: list[Command] = []
        for cmd, ask in zip(commands, asking, strict=True):
            if ask:
                sent.append(("ASKING",))
            sent.append(cmd)
        conn.send_packed_command(_packed(conn, sent))
        for ask in asking:
            if ask:
                with contextlib.suppress(ResponseError):
                    conn.read_response()
            try:
                out.append(conn.read_response())
            except ResponseError as exc:  # read whole: read on
                out.append(exc)
        return out
    except BaseException:  # replies may be left unread: never reuse it
        conn.disconnect()
        raise
    finally:
        pool.release(conn)


async def _anode_pipeline(node: Any, commands: Sequence[Command], asking: list[bool]
                          ) -> list[Any]:
    conn = node.acquire_connection()
    try:
        sent: list[Command] = []
        for cmd, ask in zip(commands, asking, strict=True):
            if ask:
                sent.append(("ASKING",))
            sent.append(cmd)
        packed = _packed(conn, sent)
        await conn.send_packed_command(b"".join(packed) if _pack is not None else packed)
        out: list[Any] = []
        for ask in asking:
            if ask:
                with contextlib.suppress(ResponseError):
                    await conn.read_response()
            try:
                out.append(await conn.read_response())
            except ResponseError as exc:
                out.append(exc)
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


Tail = Callable[[Command, bool], list[tuple[Command, bool]]]
"""Commands to append to one node's pipeline, after its calls: given the group's first call
and whether it goes behind ASKING, (command, behind ASKING) pairs (``durable.py``: a barrier
write in that call's slot, then WAIT)."""


def _sendable(commands: Sequence[Command], idx: list[int], asked: dict[int, Any],
              tail: Tail | None) -> tuple[list[Command], list[bool]]:
    cmds = [commands[i] for i in idx]
    asking = [i in asked for i in idx]
    if tail is not None:
        for cmd, ask in tail(commands[idx[0]], idx[0] in asked):
            cmds.append(cmd)
            asking.append(ask)
    return cmds, asking


def run(client: Any, commands: Sequence[Command]) -> list[Any]:
    """Send ``commands`` over a cluster client, pipelined per node; replies in order, error
    replies as exception objects (raw: no reply callbacks)."""
    return run_tailed(client, commands, None)[0]


def run_tailed(client: Any, commands: Sequence[Command], tail: Tail | None
               ) -> tuple[list[Any], list[list[Any]]]:
    """:func:`run`, each node's pipeline followed by ``tail``'s commands on the same
    connection: (replies, for each call the tail's replies of the pipeline that ran it).
    A redirected call is sent again with the next round's pipeline (and its own tail)."""
    replies: list[Any] = [None] * len(commands)
    tails: list[list[Any]] = [[] for _ in commands]
    todo: dict[int, Any] = dict.fromkeys(range(len(commands)))
    for round_ in range(_ROUNDS):
        groups = _plan(client, commands, todo)
        asked = {i: ask for i, ask in todo.items() if ask is not None}
        todo = {}
        stale = again = False
        for node, idx in groups.values():
            cmds, asking = _sendable(commands, idx, asked, tail)
            try:
                got = _node_pipeline(client, node, cmds, asking)
            except (redis.ConnectionError, redis.TimeoutError):
                _refresh(client)
                raise
            for i in idx:
                tails[i] = got[len(idx):]
            s, a = _file(replies, idx, got[:len(idx)], client, todo, asked)
            stale, again = stale or s, again or a
        if not todo:
            break
        if stale:
            _refresh(client)
        if again and round_ < _ROUNDS - 1:
            time.sleep(0.05)
    return replies, tails


async def arun(client: Any, commands: Sequence[Command]) -> list[Any]:
    """:func:`run` for an asyncio cluster client."""
    return (await arun_tailed(client, commands, None))[0]


async def arun_tailed(client: Any, commands: Sequence[Command], tail: Tail | None
                      ) -> tuple[list[Any], list[list[Any]]]:
    """:func:`run_tailed` for an asyncio cluster client."""
    await client.initialize()
    replies: list[Any] = [None] * len(commands)
    tails: list[list[Any]] = [[] for _ in commands]
    todo: dict[int, Any] = dict.fromkeys(range(len(commands)))
    for round_ in range(_ROUNDS):
        groups = _plan(client, commands, todo)
        asked = {i: ask for i, ask in todo.items() if ask is not None}
        todo = {}
        stale = again = False
        for node, idx in groups.values():
            cmds, asking = _sendable(commands, idx, asked, tail)
            try:
                got = await _anode_pipeline(node, cmds, asking)
            except (redis.ConnectionError, redis.TimeoutError):
                await _arefresh(client)
                raise
            for i in idx:
                tails[i] = got[len(idx):]
            s, a = _file(replies, idx, got[:len(idx)], client, todo, asked)
            stale, again = stale or s, again or a
        if not todo:
            break
        if stale:
            await _arefresh(client)
        if again and round_ < _ROUNDS - 1:
            await asyncio.sleep(0.05)
    return replies, tails
