"""Writes of an asyncio client without a task per command (a worker's client).

redis-py's asyncio connection writes every command under ``asyncio.wait_for`` when a socket
timeout is set (streamq always sets one). On Python 3.11 ``wait_for`` wraps the write in a
task of its own: the bytes go out one event-loop turn later, and the caller resumes one more
turn after that. :func:`inline_sends` gives a client's pool a connection class whose writes
go out at once, under ``asyncio.timeout`` (same bound, no task): the same errors, the
connection dropped on any failure, as redis-py does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

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
