"""``QueueConfig.min_replicas``: a script call followed by ``WAIT`` on the same connection.

Redis replicates asynchronously: a primary acknowledges a write before any replica has it, so
a primary that dies right after an enqueue can lose the job. ``WAIT n timeout`` blocks until
``n`` replicas have acknowledged every write made *by the connection that sends it*, so it
must follow the script call on the very connection that ran it (another pooled connection
would wait for nothing). Here the script calls and the WAIT are written back to back on one
connection (one round trip) and every reply is read.

A call that wrote nothing (every job a duplicate, sent again after a timeout) leaves the
connection's offset behind the write it found; so a producer puts a ``PUBLISH`` on a channel
nobody listens to (``barrier``: replicated like any write) before the WAIT, which then covers
everything the primary had written by then, whoever wrote it.

``WAIT`` does not undo anything: when fewer replicas answer in time, the write stands on the
primary and is lost only if that primary dies before it replicates. The caller decides what
that means (the producer raises :class:`~streamq.ReplicationTimeout`; a worker logs it).

Redis Cluster: a WAIT has to go to the node that took the write, on that connection; that is
not wired yet, so ``min_replicas > 0`` with a cluster client is refused up front.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from redis.exceptions import ResponseError

from .config import QueueConfig
from .conn import is_cluster
from .errors import InvalidArgument, ReplicationTimeout, ScriptError
from .scripts import Arg, Script, _pack, _sort

Call = tuple[Sequence[str], Sequence[Arg]]


def check(client: Any, config: QueueConfig) -> None:
    """Refuse ``min_replicas`` where it cannot be honoured (a Redis Cluster client, for now)."""
    if config.min_replicas and is_cluster(client):
        raise InvalidArgument(
            "QueueConfig.min_replicas is not supported on Redis Cluster yet (WAIT must follow"
            " each write on the node that took it): use min_replicas=0 there")


BARRIER_TAG = "barrier"
"""The waiter-channel tag of the producer's barrier (never a producer's own: those are hex)."""


def _wait_cmds(config: QueueConfig, barrier: str | None) -> list[tuple[Any, ...]]:
    wait = ("WAIT", config.min_replicas, config.min_replicas_timeout_ms)
    return [("PUBLISH", barrier, ""), wait] if barrier else [wait]


def _packable(script: Script, client: Any) -> bool:
    return script._plain(client)


def run_waited(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
               barrier: str | None = None) -> tuple[list[Any], int]:
    """Run ``calls`` of ``script`` pipelined, then WAIT on the same connection: (replies in
    order, replicas that acknowledged). NOSCRIPT is handled as in ``Script.run_many``: the
    script is loaded and only the calls that met it are sent again (with a WAIT again)."""
    if not _packable(script, client):
        return _run_pipeline(script, client, calls, config, barrier)
    pool: Any = client.connection_pool
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        conn = pool.get_connection()
        try:
            tail = _wait_cmds(config, barrier)
            conn.send_packed_command([*script._packed([calls[i] for i in todo]),
                                      *(_pack(c) for c in tail)])
            got: list[Any] = []
            for _ in todo:
                try:
                    got.append(conn.read_response())
                except ResponseError as exc:  # the reply was read whole: read on
                    got.append(exc)
            for _ in tail[1:]:
                conn.read_response()  # the barrier's PUBLISH
            acked = int(conn.read_response())
            todo, failed = _sort(todo, got, replies)
        except BaseException:  # replies may be left unread: never reuse it
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if failed is not None:
            raise ScriptError(f"{script.name}.lua failed: {failed}") from failed
        if not todo:
            return replies, acked
        if attempt == 0:
            client.script_load(script.source)
    raise ScriptError(f"{script.name}.lua: NOSCRIPT after loading it")


async def arun_waited(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
                      barrier: str | None = None) -> tuple[list[Any], int]:
    """:func:`run_waited` for an asyncio client."""
    if not _packable(script, client):
        return await _arun_pipeline(script, client, calls, config, barrier)
    pool: Any = client.connection_pool
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        conn = await pool.get_connection()
        try:
            tail = _wait_cmds(config, barrier)
            await conn.send_packed_command(b"".join(
                [*script._packed([calls[i] for i in todo]), *(_pack(c) for c in tail)]))
            got: list[Any] = []
            for _ in todo:
                try:
                    got.append(await conn.read_response())
                except ResponseError as exc:
                    got.append(exc)
            for _ in tail[1:]:
                await conn.read_response()
            acked = int(await conn.read_response())
            todo, failed = _sort(todo, got, replies)
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
        if failed is not None:
            raise ScriptError(f"{script.name}.lua failed: {failed}") from failed
        if not todo:
            return replies, acked
        if attempt == 0:
            await client.script_load(script.source)
    raise ScriptError(f"{script.name}.lua: NOSCRIPT after loading it")


def _pipeline(pipe: Any, script: Script, calls: Sequence[Call], config: QueueConfig,
              barrier: str | None) -> int:
    for keys, args in calls:
        pipe.evalsha(script.sha, len(keys), *keys, *args)
    tail = _wait_cmds(config, barrier)
    for cmd in tail:
        pipe.execute_command(*cmd)
    return len(tail)


def _run_pipeline(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
                  barrier: str | None) -> tuple[list[Any], int]:
    """Without hiredis, or for a client with a pinned connection: a redis-py pipeline (one
    connection), loading the script first when the server does not have it."""
    check(client, config)
    if not all(client.script_exists(script.sha)):
        client.script_load(script.source)
    pipe = client.pipeline(transaction=False)
    tail = _pipeline(pipe, script, calls, config, barrier)
    return _unpipe(script, pipe.execute(raise_on_error=False), tail)


async def _arun_pipeline(script: Script, client: Any, calls: Sequence[Call],
                         config: QueueConfig, barrier: str | None) -> tuple[list[Any], int]:
    check(client, config)
    if not all(await client.script_exists(script.sha)):
        await client.script_load(script.source)
    pipe = client.pipeline(transaction=False)
    tail = _pipeline(pipe, script, calls, config, barrier)
    return _unpipe(script, await pipe.execute(raise_on_error=False), tail)


def _unpipe(script: Script, out: list[Any], tail: int) -> tuple[list[Any], int]:
    for x in out:
        if isinstance(x, ResponseError):
            raise ScriptError(f"{script.name}.lua failed: {x}") from x
        if isinstance(x, BaseException):
            raise x
    return list(out[:-tail]), int(out[-1])


def run(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
        barrier: str | None = None) -> tuple[list[Any], int]:
    """The replies of ``calls`` and the replicas that confirmed them (0 when
    ``min_replicas`` is 0: no WAIT is sent, the calls go out exactly as without this module)."""
    if not config.min_replicas:
        if len(calls) == 1:
            return [script(client, *calls[0])], 0
        return script.run_many(client, calls), 0
    return run_waited(script, client, calls, config, barrier)


async def arun(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
               barrier: str | None = None) -> tuple[list[Any], int]:
    """:func:`run` for an asyncio client."""
    if not config.min_replicas:
        if len(calls) == 1:
            return [await script.run_async(client, *calls[0])], 0
        return await script.run_many_async(client, calls), 0
    return await arun_waited(script, client, calls, config, barrier)


def confirm(config: QueueConfig, results: Sequence[Any], acked: int) -> None:
    """Raise :class:`ReplicationTimeout` when fewer than ``min_replicas`` replicas confirmed
    an enqueue call that wrote (or found) jobs. ``results``: its EnqueueResults."""
    if not config.min_replicas or acked >= config.min_replicas:
        return
    ids = [r.job_id for r in results if r.status != "rejected"]
    if ids:
        raise ReplicationTimeout(ids, acked, config.min_replicas,
                                 config.min_replicas_timeout_ms, list(results))


class Unreplicated:
    """A worker's rate-limited warning about settled batches that fewer than ``min_replicas``
    replicas confirmed in time (the outcomes stand on the primary; if it dies before
    replicating them, those jobs run again: at-least-once, nothing is lost)."""

    def __init__(self, log: logging.Logger, every_s: float = 30.0) -> None:
        self.log = log
        self.every_s = every_s
        self.jobs = 0
        """Outcomes not confirmed, since the worker started."""
        self._pending = 0
        self._last = -1e9

    def note(self, queue: str, jobs: int, acked: int, config: QueueConfig) -> None:
        if acked >= config.min_replicas:
            return
        self.jobs += jobs
        self._pending += jobs
        now = time.monotonic()
        if now - self._last < self.every_s:
            return
        self.log.warning(
            "%d job outcome(s) of %s applied on the primary but confirmed by %d of %d"
            " replica(s) within %d ms (this and the last %.0f s): if the primary dies before"
            " replicating them, those jobs run again", self._pending, queue, acked,
            config.min_replicas, config.min_replicas_timeout_ms, self.every_s,
            extra={"queue": queue})
        self._pending = 0
        self._last = now
