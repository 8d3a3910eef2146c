"""Reads on a kept connection (``sends.read_kept``): one lapse timer per socket timeout, not
one per read, with the same bound (a node that stops answering times out) and errors."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis
from redis.exceptions import ResponseError

from streamq._core.conn import async_client
from streamq._core.scripts import Script
from streamq._core.sends import Kept, exchange, inline_sends

_ECHO = Script("echo_kept", "return ARGV[1]")


def _count_call_at(loop: asyncio.AbstractEventLoop) -> tuple[list[int], Any]:
    timers = [0]
    call_at = loop.call_at

    def counted(when: float, callback: Any, *args: Any, **kw: Any) -> Any:
        timers[0] += 1
        return call_at(when, callback, *args, **kw)

    setattr(loop, "call_at", counted)  # noqa: B010
    return timers, call_at


async def test_reads_on_a_kept_connection_share_one_lapse_timer(url: str) -> None:
    """50 script calls on a kept connection arm one timer between them (redis-py's
    read_response armed one per read); replies and error replies are as before."""
    client = async_client(url, socket_timeout_s=5.0)
    inline_sends(client)
    kept = Kept()
    loop = asyncio.get_running_loop()
    try:
        assert await _ECHO.run_async(client, [], ["warm"], kept=kept) == b"warm"
        timers, call_at = _count_call_at(loop)
        try:
            for i in range(50):
                assert await _ECHO.run_async(client, [], [str(i)], kept=kept) == str(i).encode()
            with pytest.raises(ResponseError, match="unknown command"):
                await exchange(client, b"*1\r\n$6\r\nNOSUCH\r\n", 1, kept)
            assert await _ECHO.run_async(client, [], ["after"], kept=kept,
                                         ping_first=True) == b"after"
        finally:
            setattr(loop, "call_at", call_at)  # noqa: B010
        assert timers[0] <= 1
        conn = kept.conn
        assert conn is not None and conn.next_health_check > loop.time()  # as redis-py
    finally:
        await kept.release(client)
        await client.aclose()


def _blpop(key: str, seconds: int) -> bytes:
    """A command the server answers only after ``seconds`` (a node that does not answer)."""
    return b"*3\r\n$5\r\nBLPOP\r\n$%d\r\n%s\r\n$1\r\n%d\r\n" % (
        len(key), key.encode(), seconds)


async def test_a_kept_read_of_a_node_that_does_not_answer_times_out(url: str,
                                                                   qname: str) -> None:
    """A reply that does not come within the socket timeout makes a kept read raise
    redis-py's TimeoutError and drops the connection; the next call connects again. The
    read before it, on the same lapse timer, is unaffected."""
    client = async_client(url, socket_timeout_s=0.5)
    inline_sends(client)
    kept = Kept()
    try:
        assert await _ECHO.run_async(client, [], ["a"], kept=kept) == b"a"
        first = kept.conn
        with pytest.raises(redis.TimeoutError):
            await exchange(client, _blpop(qname, 3), 1, kept)
        assert kept.conn is None and not first.is_connected and kept.lapsed
        assert await _ECHO.run_async(client, [], ["c"], kept=kept) == b"c"
        assert kept.conn is not None and kept.conn.is_connected
    finally:
        await kept.release(client)
        await client.aclose()


async def test_a_kept_read_cancelled_from_outside_is_a_cancel_not_a_timeout(
        url: str, qname: str) -> None:
    """A caller's task cancelled during a kept read gets CancelledError (the connection,
    its reply unread, is dropped), not a timeout; the next call connects again."""
    client = async_client(url, socket_timeout_s=5.0)
    inline_sends(client)
    kept = Kept()
    try:
        assert await _ECHO.run_async(client, [], ["a"], kept=kept) == b"a"
        task = asyncio.create_task(exchange(client, _blpop(qname, 3), 1, kept))
        for _ in range(500):  # (until the read is in progress: its reply cannot come)
            if kept.reader is not None:
                break
            await asyncio.sleep(0.01)
        assert kept.reader is not None
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert kept.conn is None and not kept.lapsed
        assert await _ECHO.run_async(client, [], ["c"], kept=kept) == b"c"
    finally:
        await kept.release(client)
        await client.aclose()
