"""Writes of an asyncio client without a task per command (a worker's client), and the
worker's idle blocking read without redis-py's command layer.

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

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

_pack: Any
try:
    from hiredis import pack_command as _pack
except ImportError:  # pragma: no cover - hiredis is a dependency (redis[hiredis])
    _pack = None

_CLASSES: dict[type[Any], type[Any]] = {}


def inline_sends(client: Any) -> bool:
    """Make the connections of ``client`` (a ``redis.asyncio.Redis``, standalone or a
    Sentinel primary's; its pool must not have made a connection yet) write without a task
    per command. Returns False, changing nothing, for any other client (a cluster)."""
    pool = getattr(client, "connection_pool", None)
    cls = getattr(pool, "connection_class", None)
    if not isinstance(cls, type) or not issubclass(cls, AbstractConnection):
        return False
    if getattr(cls, "_streamq_inline", False):
        return True
    fast = _CLASSES.get(cls)
    if fast is None:
        fast = _CLASSES[cls] = _subclass(cls)
    pool.connection_class = fast  # type: ignore[union-attr]
    return True


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
        try:
            writer.writelines([command] if isinstance(command, bytes) else command)
            async with asyncio.timeout(timeout):  # waits only while the buffer is full
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
    Python calls to hand a connection out and take it back, on the path of a job."""

    __slots__ = ("conn",)

    def __init__(self) -> None:
        self.conn: Any = None

    async def release(self, client: Any) -> None:
        """Give the connection back to ``client``'s pool (a worker stopping)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            await client.connection_pool.release(conn)


async def xreadgroup(client: Any, group: str, consumer: str, streams: dict[str, str],
                     count: int, block: int, kept: Kept | None = None
                     ) -> list[tuple[bytes, list[tuple[bytes, Any]]]]:
    """``XREADGROUP GROUP group consumer COUNT count BLOCK block STREAMS ...`` in the shape
    of redis-py's ``xreadgroup`` (RESP2: [(stream, [(entry id, {field: value}), ...]), ...];
    [] when the block timed out; an entry deleted while pending, which only a read of
    history meets, has None for fields), without its command layer: one packed write and
    one read on a pooled connection, or on the one ``kept`` holds (taken from the pool at
    the first read; one caller at a time). The worker's idle wait: what follows the reply
    is on the path of the job it brings. A cluster client, or no hiredis, goes through
    redis-py."""
    if _pack is None or getattr(client, "connection_pool", None) is None:
        reply: Any = await client.xreadgroup(group, consumer, streams, count=count,
                                             block=block)
        return reply or []
    raw = await exchange(client, _pack(("XREADGROUP", "GROUP", group, consumer, "COUNT",
                                        count, "BLOCK", block, "STREAMS", *streams,
                                        *streams.values())), 1, kept)
    if not raw:
        return []
    return [(stream, [(eid, _pairs(fields)) for eid, fields in entries])
            for stream, entries in raw]


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


def _pairs(fields: list[bytes] | None) -> dict[bytes, bytes] | None:
    """An entry's flat field list as a dict (None: an entry deleted while pending)."""
    if fields is None:
        return None
    it = iter(fields)
    return dict(zip(it, it, strict=False))
