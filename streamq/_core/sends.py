"""Writes of an asyncio client without a task per command (a worker's client), the worker's
idle blocking read without redis-py's command layer, and the same fast path on a Redis
Cluster (:func:`cexchange`).

redis-py's asyncio connection writes every command under ``asyncio.wait_for`` when a socket
timeout is set (streamq always sets one). On Python 3.11 ``wait_for`` wraps the write in a
task of its own: the bytes go out one event-loop turn later, and the caller resumes one more
turn after that. :func:`inline_sends` gives a client's pool a connection class whose writes
go out at once, under ``asyncio.timeout`` (same bound, no task): the same errors, the
connection dropped on any failure, as redis-py does.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any

from redis._parsers.hiredis import _AsyncHiredisParser as _HiredisParser
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import AskError, MovedError, ResponseError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import nodes
from .nodes import slot_of

_pack: Any
try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis])
    _pack = None

_CLASSES: dict[type[Any], type[Any]] = {}
_PING = b"*1\r\n$4\r\nPING\r\n"
_REDIRECTS = (MovedError, AskError, TryAgainError)
_DOWN = (RedisConnectionError, RedisTimeoutError)


def inline_sends(client: Any) -> bool:
    """Make the connections of ``client`` (a ``redis.asyncio.Redis``, standalone or a
    Sentinel primary's, or a ``redis.asyncio.cluster.RedisCluster``: every node's, those
    the slot map adds later too; connections made already keep their class) write without
    a task per command. Returns False, changing nothing, for any other client."""
    if acluster(client):
        mgr = client.nodes_manager
        fast = _fast(mgr.connection_kwargs.get("connection_class"))
        if fast is None:
            return False
        mgr.connection_kwargs["connection_class"] = fast
        for node in (*mgr.startup_nodes.values(), *mgr.nodes_cache.values()):
            node.connection_class = fast
        return True
    pool = getattr(client, "connection_pool", None)
    fast = _fast(getattr(pool, "connection_class", None))
    if fast is None:
        return False
    pool.connection_class = fast  # type: ignore[union-attr]
    return True


def _fast(cls: Any) -> type[Any] | None:
    """The inline-writing subclass of connection class ``cls`` (None: not one of redis-py's
    asyncio connections)."""
    if not isinstance(cls, type) or not issubclass(cls, AbstractConnection):
        return None
    if getattr(cls, "_streamq_inline", False):
        return cls
    fast = _CLASSES.get(cls)
    if fast is None:
        fast = _CLASSES[cls] = _subclass(cls)
    return fast


_KINDS: dict[type[Any], bool] = {}


def acluster(client: Any) -> bool:
    """True for a ``redis.asyncio.cluster.RedisCluster`` (cached per class: on the path of
    every script call)."""
    kind = _KINDS.get(type(client))
    if kind is None:
        from redis.asyncio.cluster import RedisCluster

        kind = _KINDS[type(client)] = isinstance(client, RedisCluster)
    return kind


def _subclass(cls: type[AbstractConnection]) -> type[Any]:
    base = cls.send_packed_command

    async def send_packed_command(self: AbstractConnection,
                                  command: bytes | str | Iterable[bytes],
                                  check_health: bool = True) -> None:
        timeout = self.socket_timeout
        if not timeout or not self.is_connected or isinstance(command, str):
            await base(self, command, check_health)  # (connects first; rare)
            return
        if check_health:
            await self.check_health()  # type: ignore[no-untyped-call]  # (a PING when due)
        writer: Any = self._writer
        transport = writer.transport
        if transport.is_closing():  # the connection went away while idle: Python 3.12+'s
            # writelines on a closed socket transport raises AttributeError, not OSError
            await self.disconnect(nowait=True)
            raise RedisConnectionError("Error while writing to socket: connection closed")
        try:
            writer.writelines([command] if isinstance(command, bytes) else command)
            if transport.get_write_buffer_size():
                async with asyncio.timeout(timeout):  # waits only while the buffer is full
                    await writer.drain()
            else:  # written whole: drain cannot wait (it raises a lost connection), and a
                # timer per call (asyncio.timeout: a TimerHandle made and cancelled) is spared
                await writer.drain()
        except TimeoutError:
            await self.disconnect(nowait=True)
            raise RedisTimeoutError("Timeout writing to socket") from None
        except OSError as e:
            await self.disconnect(nowait=True)
            raise RedisConnectionError(f"Error while writing to socket: {e}") from e
        except BaseException:  # a write cut short: the connection is not reused
            await self.disconnect(nowait=True)
            raise

    return type(f"Inline{cls.__name__}", (cls,), {
        "send_packed_command": send_packed_command, "_streamq_inline": True,
        "__module__": __name__})


class Kept:
    """A connection kept out of the pool by one user that sends one command at a time (a
    fetch loop's blocking reads, a lane's finish.lua calls): redis-py 8's pool takes ~80
    Python calls to hand a connection out and take it back, on the path of a job. On a
    Redis Cluster: a connection to the node that owns the user's slot (``slot``: every key
    the user sends shares one hash tag, so its slot is computed once), changed for one to
    the new owner when the slot map moves the slot.

    Its replies are read under one lapse timer per socket timeout, not one per read
    (:func:`read_kept`)."""

    __slots__ = ("conn", "due", "lapsed", "node", "reader", "slot", "timer")

    def __init__(self) -> None:
        self.conn: Any = None
        self.node: Any = None
        """The cluster node ``conn`` belongs to (None on one server)."""
        self.slot: int | None = None
        self.due = 0.0
        """Event-loop time by which the read in progress must end (its socket timeout)."""
        self.reader: Any = None
        """The task reading a reply now (None: no read in progress)."""
        self.timer: Any = None
        """The lapse timer (armed at most once per socket timeout, re-armed lazily)."""
        self.lapsed = False

    async def release(self, client: Any) -> None:
        """Give the connection back to ``client``'s pool (a worker stopping)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        conn, self.conn = self.conn, None
        node, self.node = self.node, None
        if conn is None:
            return
        if node is not None:
            node.release(conn)
        else:
            await client.connection_pool.release(conn)


def _lapse(kept: Kept) -> None:
    """The lapse timer of ``kept``: a read still in progress past its due time is cancelled
    (``read_kept`` turns that into a timeout); one that is not yet due re-arms the timer at
    its due time; with no read in progress the timer ends (the next read arms it)."""
    kept.timer = None
    task = kept.reader
    if task is None:
        return
    loop = task.get_loop()
    if loop.time() < kept.due:
        kept.timer = loop.call_at(kept.due, _lapse, kept)
        return
    kept.lapsed = True
    task.cancel()


async def read_kept(conn: Any, kept: Kept) -> Any:
    """``conn.read_response()`` for the connection ``kept`` holds, with the same bound (the
    connection's socket timeout: a node that stops answering still times out, as
    ``redis.exceptions.TimeoutError``) and the same errors, without a timer made and
    cancelled per read: redis-py arms ``asyncio.timeout`` around every read (a TimerHandle
    made, pushed on the loop's heap and cancelled). Here one timer per socket timeout
    checks the read in progress (:func:`_lapse`). Only for RESP2 over hiredis (what
    streamq's clients use); any other connection reads through redis-py."""
    parser = conn._parser
    timeout = conn.socket_timeout
    if type(parser) is not _HiredisParser or not timeout or conn.protocol in (3, "3"):
        return await conn.read_response()
    task = asyncio.current_task()
    assert task is not None
    loop = task.get_loop()
    kept.due = loop.time() + timeout
    kept.reader = task
    kept.lapsed = False
    if kept.timer is None:
        kept.timer = loop.call_at(kept.due, _lapse, kept)
    cancelling = task.cancelling()
    try:
        reply = await parser.read_response()
    except asyncio.CancelledError:
        await conn.disconnect(nowait=True)
        if kept.lapsed and task.uncancel() <= cancelling:
            raise RedisTimeoutError(f"Timeout reading from {conn._host_error()}") from None
        raise
    except OSError as e:
        await conn.disconnect(nowait=True)
        raise RedisConnectionError(
            f"Error while reading from {conn._host_error()} : {e.args}") from None
    except BaseException:
        await conn.disconnect(nowait=True)
        raise
    finally:
        kept.reader = None
    if conn.health_check_interval:
        conn.next_health_check = loop.time() + conn.health_check_interval
    if isinstance(reply, ResponseError):
        raise reply from None
    return reply


async def xreadgroup(client: Any, group: str, consumer: str, streams: dict[str, str],
                     count: int, block: int, kept: Kept | None = None
                     ) -> list[tuple[bytes, list[tuple[bytes, Any]]]]:
    """``XREADGROUP GROUP group consumer COUNT count BLOCK block STREAMS ...`` in the shape
    of redis-py's ``xreadgroup`` (RESP2: [(stream, [(entry id, {field: value}), ...]), ...];
    [] when the block timed out; an entry deleted while pending, which only a read of
    history meets, has None for fields), without its command layer: one packed write and
    one read on a pooled connection, or on the one ``kept`` holds (taken from the pool at
    the first read; one caller at a time). The worker's idle wait: what follows the reply
    is on the path of the job it brings. On a cluster (the streams share one hash tag) the
    same, on a connection to the node that owns them, with no round trip before it (redis-py
    asks the server for an XREADGROUP's keys: ``COMMAND GETKEYS``). Without hiredis this
    goes through redis-py."""
    command = ("XREADGROUP", "GROUP", group, consumer, "COUNT", count, "BLOCK", block,
               "STREAMS", *streams, *streams.values())
    if _pack is not None and getattr(client, "connection_pool", None) is not None:
        raw = await exchange(client, _pack(command), 1, kept)
    elif _pack is not None and acluster(client):
        raw = await cexchange(client, next(iter(streams)), command, kept)
    else:
        reply: Any = await client.xreadgroup(group, consumer, streams, count=count,
                                             block=block)
        return reply or []
    if not raw:
        return []
    return [(stream, [(eid, _pairs(fields)) for eid, fields in entries])
            for stream, entries in raw]


async def xread_wait(client: Any, stream: str, after: str, block: int, count: int = 1
                     ) -> list[Any]:
    """``XREAD COUNT count BLOCK block STREAMS stream after`` (the relay's idle wait on its
    outbox): the entries that came, each ``[id, [field, value, ...]]`` as XRANGE gives them
    (empty: none came). As :func:`xreadgroup`, without redis-py's command layer, so on a
    cluster no ``COMMAND GETKEYS`` round trip precedes each wait. Without hiredis this goes
    through redis-py."""
    command = ("XREAD", "COUNT", count, "BLOCK", block, "STREAMS", stream, after)
    if _pack is not None and getattr(client, "connection_pool", None) is not None:
        raw = await exchange(client, _pack(command), 1)
    elif _pack is not None and acluster(client):
        raw = await cexchange(client, stream, command)
    else:
        raw = await client.xread({stream: after}, count=count, block=block)
        return [[eid, [x for kv in (f or {}).items() for x in kv]]
                for eid, f in (raw[0][1] if raw else [])]
    return list(raw[0][1]) if raw else []


async def exchange(client: Any, packed: bytes, replies: int, kept: Kept | None = None
                   ) -> Any:
    """Write ``packed`` (``replies`` commands) on a pooled connection of ``client``, or on
    the one ``kept`` holds (taken from the pool at the first call; one caller at a time),
    and read every reply; returns the last one. An error reply of an earlier command is
    read past (the last one tells what failed); an error reply of the last is raised, the
    connection kept. Any other failure (a broken or cancelled exchange) drops the
    connection: it is never reused with a reply half read."""
    pool: Any = client.connection_pool
    conn = kept.conn if kept is not None else None
    if conn is None:
        conn = await pool.get_connection()
        if kept is not None:
            kept.conn = conn
    try:
        await conn.send_packed_command(packed)
        if kept is not None:
            for _ in range(replies - 1):
                with contextlib.suppress(ResponseError):
                    await read_kept(conn, kept)
            return await read_kept(conn, kept)
        for _ in range(replies - 1):
            with contextlib.suppress(ResponseError):
                await conn.read_response()
        return await conn.read_response()
    except BaseException as exc:
        if not isinstance(exc, ResponseError):
            await conn.disconnect()
            if kept is not None:
                kept.conn = None
                await pool.release(conn)
        raise
    finally:
        if kept is None:
            await pool.release(conn)


async def cexchange(client: Any, key: str | bytes, command: tuple[Any, ...],
                    kept: Kept | None = None, ping_first: bool = False) -> Any:
    """:func:`exchange` on a Redis Cluster client: ``command`` (every key of it in ``key``'s
    slot) packed with hiredis and sent to the primary that owns the slot, on one of its
    pooled connections or on the one ``kept`` holds (``ping_first``: behind a PING, in the
    same write). Its reply, raw; an error reply raised, the connection kept.

    A ``MOVED``, ``ASK`` or ``TRYAGAIN`` reply means the command did not run: it is sent
    again through ``nodes.arun``, which follows redirects (refreshing the slot map) the way
    every other cluster call does, and the next call finds the slot's new owner in the
    map. A connection error drops the connection, refreshes the slot map (the node may be
    gone: a failover) and is raised (transient: the caller's loop sends the call again,
    which every script call and ``XREADGROUP >`` allow)."""
    if kept is not None:
        slot = kept.slot
        if slot is None:
            slot = kept.slot = slot_of(key)
    else:
        slot = slot_of(key)
    try:
        node = client.nodes_manager.slots_cache[slot][0]
    except (KeyError, IndexError):  # no slot map yet (or a slot not covered): the slow way
        return await _routed(client, command)
    if kept is not None:
        conn = kept.conn
        if conn is None or kept.node is not node:
            if conn is not None:  # the slot moved (or the map was rebuilt): the owner's
                kept.node.release(conn)
            conn = kept.conn = node.acquire_connection()
            kept.node = node
    else:
        conn = node.acquire_connection()
    try:
        packed = _pack(command)
        if ping_first:
            await conn.send_packed_command(_PING + packed)
            with contextlib.suppress(ResponseError):
                await (conn.read_response() if kept is None else read_kept(conn, kept))
        else:
            await conn.send_packed_command(packed)
        return await (conn.read_response() if kept is None else read_kept(conn, kept))
    except _REDIRECTS:  # read whole, not run: follow it below
        pass
    except ResponseError:
        raise
    except BaseException as exc:  # a broken or interrupted exchange: never reuse it
        await conn.disconnect()
        if kept is not None:
            kept.conn = kept.node = None
            node.release(conn)
        if isinstance(exc, _DOWN):
            await nodes._arefresh(client)
        raise
    finally:
        if kept is None:
            node.release(conn)
    return await _routed(client, command)


async def _routed(client: Any, command: tuple[Any, ...]) -> Any:
    """``command`` through ``nodes.arun`` (redirects followed); an error reply raised."""
    (reply,) = await nodes.arun(client, [command])
    if isinstance(reply, BaseException):
        raise reply
    return reply


def _pairs(fields: list[bytes] | None) -> dict[bytes, bytes] | None:
    """An entry's flat field list as a dict (None: an entry deleted while pending)."""
    if fields is None:
        return None
    it = iter(fields)
    return dict(zip(it, it, strict=False))
