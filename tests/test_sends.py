"""The worker client's writes without a task per command, and its raw blocking read
(streamq/_core/sends.py), against a real server."""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
import time
from collections.abc import Coroutine, Generator
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError

from streamq import Keys
from streamq._core.conn import async_client
from streamq._core.errors import ScriptError
from streamq._core.keys import GROUP
from streamq._core.scripts import _PING, Script, _pack
from streamq._core.sends import Kept, inline_sends, xreadgroup


def _count_tasks(loop: asyncio.AbstractEventLoop) -> list[int]:
    made = [0]

    def factory(lp: asyncio.AbstractEventLoop,
                coro: Coroutine[Any, Any, Any] | Generator[Any, None, Any],
                **kw: Any) -> asyncio.Task[Any]:
        made[0] += 1
        return asyncio.Task(coro, loop=lp, **kw)

    loop.set_task_factory(factory)
    return made


async def test_an_inline_client_writes_without_a_task_per_command(url: str) -> None:
    plain = async_client(url, socket_timeout_s=5.0)
    fast = async_client(url, socket_timeout_s=5.0)
    assert inline_sends(fast)
    assert inline_sends(fast)  # twice: the same class, not a subclass of a subclass
    loop = asyncio.get_running_loop()
    try:
        await plain.ping()
        await fast.ping()  # (connected: the first command of a pool connects)
        made = _count_tasks(loop)
        assert await plain.set("sends:k", b"v") is True
        if sys.version_info < (3, 12):  # (asyncio.wait_for makes no task from 3.12 on)
            assert made[0] >= 1  # redis-py's wait_for wraps the write in a task of its own
        made[0] = 0
        assert await fast.set("sends:k", b"w") is True
        assert await fast.get("sends:k") == b"w"
        assert made[0] == 0
    finally:
        loop.set_task_factory(None)
        await plain.aclose()
        await fast.aclose()


async def test_an_inline_write_to_a_closed_socket_drops_the_connection(url: str) -> None:
    fast = async_client(url, socket_timeout_s=5.0)
    inline_sends(fast)
    try:
        await fast.ping()
        conn = await fast.connection_pool.get_connection()
        conn._writer.transport.abort()  # the socket is gone under the client
        await asyncio.sleep(0)
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
            await conn.send_packed_command(b"*1\r\n$4\r\nPING\r\n")
            await conn.read_response()
        await fast.connection_pool.release(conn)
        assert await fast.ping() is True  # a new connection
    finally:
        await fast.aclose()


async def test_the_raw_blocking_read_answers_as_redis_py_does(url: str, qname: str,
                                                              r: redis.Redis) -> None:
    k = Keys(qname)
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    client = async_client(url, socket_timeout_s=5.0)
    inline_sends(client)
    try:
        assert await xreadgroup(client, GROUP, "c", {k.stream: ">"}, 10, 5) == []  # timed out
        ids = [r.xadd(k.stream, {"id": f"j{i}", "x": "1"}) for i in range(3)]
        got = await xreadgroup(client, GROUP, "c", {k.stream: ">"}, 2, 5)
        assert got == [(k.stream.encode(), [(ids[0], {b"id": b"j0", b"x": b"1"}),
                                             (ids[1], {b"id": b"j1", b"x": b"1"})])]
        r.xdel(k.stream, ids[0])  # deleted while pending: no fields (None)
        mine = await xreadgroup(client, GROUP, "c", {k.stream: "0"}, 10, 5)
        theirs: Any = await client.xreadgroup(GROUP, "c", {k.stream: "0"}, count=10, block=5)
        assert mine[0][1][0] == (ids[0], None)
        assert mine[0][1][1:] == list(theirs[0][1][1:]) == [(ids[1], {b"id": b"j1", b"x": b"1"})]
        with pytest.raises(ResponseError, match="NOGROUP"):
            await xreadgroup(client, GROUP, "c", {k.stream + ":none": ">"}, 1, 5)
        assert await client.ping() is True  # an error reply leaves the connection usable
    finally:
        await client.aclose()


async def test_a_kept_connection_serves_every_read_and_is_replaced_when_it_breaks(
        url: str, qname: str, r: redis.Redis) -> None:
    k = Keys(qname)
    r.xgroup_create(k.stream, GROUP, id="0", mkstream=True)
    client = async_client(url, socket_timeout_s=5.0)
    inline_sends(client)
    kept = Kept()
    pool: Any = client.connection_pool
    try:
        assert await xreadgroup(client, GROUP, "c", {k.stream: ">"}, 1, 5, kept) == []
        first = kept.conn
        assert first is not None and first in pool._in_use_connections  # kept out of the pool
        r.xadd(k.stream, {"id": "j"})
        got = await xreadgroup(client, GROUP, "c", {k.stream: ">"}, 1, 5, kept)
        assert got[0][1][0][1] == {b"id": b"j"} and kept.conn is first
        with pytest.raises(ResponseError, match="NOGROUP"):  # an error reply: kept on
            await xreadgroup(client, GROUP, "c", {k.stream + ":none": ">"}, 1, 5, kept)
        assert kept.conn is first
        await first.send_command("CLIENT", "ID")
        r.client_kill_filter(_id=await first.read_response())  # the connection dies
        with pytest.raises((redis.ConnectionError, redis.TimeoutError)):
            await xreadgroup(client, GROUP, "c", {k.stream: ">"}, 1, 5, kept)
        assert kept.conn is None and first not in pool._in_use_connections
        r.xadd(k.stream, {"id": "k"})
        got = await xreadgroup(client, GROUP, "c", {k.stream: ">"}, 1, 5, kept)
        assert got[0][1][0][1] == {b"id": b"k"} and kept.conn is not None
        await kept.release(client)
        assert kept.conn is None and not pool._in_use_connections
    finally:
        await client.aclose()


_SO_TIMESTAMPNS = 35  # Linux: each read's kernel receive time (socket lacks the name)


def _stamped(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    return s


def _recv_stamped(s: socket.socket) -> tuple[bytes, int | None]:
    """What one read got, and its kernel receive time (None: unstamped; the kernel turns
    receive stamping on for the host a moment after the first socket asks, on a work queue,
    so the first packets after that may come without one)."""
    data, anc, _flags, _addr = s.recvmsg(65536, 1024)
    for level, kind, raw in anc:
        if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
            sec, ns = struct.unpack("qq", raw[:16])
            return data, sec * 1_000_000_000 + ns
    return data, None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="SO_TIMESTAMPNS is Linux's")
def test_a_ping_ahead_of_a_script_call_has_its_publication_written_first(
        redis_server: Any, qname: str) -> None:
    """What ``Script.run_async(ping_first=True)`` relies on, on this server: with the same
    bytes on the wire (``_PING`` then the EVALSHA), the subscriber receives what the script
    publishes before the caller receives the script's reply (kernel receive times)."""
    channel = f"{qname}:ch"
    script = Script("pub", f"redis.call('PUBLISH', '{channel}', 'hello') return 'done'")
    sub, caller = _stamped(redis_server.port), _stamped(redis_server.port)
    try:
        sub.sendall(_pack(("SUBSCRIBE", channel)))
        assert b"subscribe" in _recv_stamped(sub)[0]
        caller.sendall(_pack(("SCRIPT", "LOAD", script.source)))
        assert script.sha.encode() in _recv_stamped(caller)[0]
        compared = 0
        # five rounds with both times stamped: the kernel turns stamping on a moment after the
        # first socket asks (a deferred work item, later on a loaded machine), so go on until
        # five rounds were stamped or a generous deadline passed
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            caller.sendall(_PING + _pack(("EVALSHA", script.sha, 0)))
            reply, replied_at = _recv_stamped(caller)
            while not reply.endswith(b"$4\r\ndone\r\n"):  # (the two replies may come apart)
                more, replied_at = _recv_stamped(caller)
                reply += more
            message, published_at = _recv_stamped(sub)
            assert reply == b"+PONG\r\n$4\r\ndone\r\n" and b"hello" in message
            if published_at is None or replied_at is None:
                continue
            assert published_at <= replied_at
            compared += 1
            if compared == 5:
                break
        assert compared == 5
    finally:
        sub.close()
        caller.close()


async def test_a_script_call_behind_a_ping_answers_as_without(url: str, qname: str,
                                                             r: redis.Redis) -> None:
    """run_async(ping_first=True) on a kept connection: the script's reply, its error
    replies raised, NOSCRIPT handled (the script loaded, the call sent again), and nothing
    left unread on the connection."""
    script = Script("echo_first", "if ARGV[1] == 'bad' then return redis.error_reply('ERR no')"
                    " end return ARGV[1]")
    client = async_client(url, socket_timeout_s=5.0)
    inline_sends(client)
    kept = Kept()
    try:
        r.script_flush()
        assert await script.run_async(client, [], ["a"], kept=kept, ping_first=True) == b"a"
        with pytest.raises(ScriptError, match="no"):
            await script.run_async(client, [], ["bad"], kept=kept, ping_first=True)
        for i in range(3):  # in step: each reply is its own call's
            assert await script.run_async(client, [], [str(i)], kept=kept,
                                          ping_first=i % 2 == 0) == str(i).encode()
        await kept.release(client)
    finally:
        await client.aclose()


async def test_an_inline_write_that_fits_the_socket_makes_no_timer(url: str) -> None:
    """A command written whole at once (the socket took it all) is not wrapped in a write
    timeout: drain cannot wait then, and a timer made and cancelled per call is spared. A
    write the socket cannot take at once still waits under the timeout (and completes)."""
    fast = async_client(url, socket_timeout_s=5.0)
    inline_sends(fast)
    loop = asyncio.get_running_loop()
    timers = [0]
    call_at = loop.call_at

    def counted(when: float, callback: Any, *args: Any, **kw: Any) -> Any:
        timers[0] += 1
        return call_at(when, callback, *args, **kw)

    try:
        await fast.ping()
        conn = await fast.connection_pool.get_connection()
        try:
            setattr(loop, "call_at", counted)  # noqa: B010
            await conn.send_packed_command(b"*1\r\n$4\r\nPING\r\n")
            assert timers[0] == 0
            setattr(loop, "call_at", call_at)  # noqa: B010
            assert await conn.read_response() == b"PONG"
            big = b"x" * (8 << 20)  # more than a socket takes at once: buffered, drained
            setattr(loop, "call_at", counted)  # noqa: B010
            await conn.send_packed_command(
                b"*3\r\n$3\r\nSET\r\n$8\r\nsends:bg\r\n$%d\r\n%s\r\n" % (len(big), big))
            assert timers[0] >= 1
            setattr(loop, "call_at", call_at)  # noqa: B010
            assert await conn.read_response() == b"OK"
        finally:
            setattr(loop, "call_at", call_at)  # noqa: B010
            await fast.connection_pool.release(conn)
    finally:
        await fast.aclose()
