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

Redis Cluster: the calls are grouped by the primary that owns each call's slot, one pipeline
per node (``nodes.run_tailed``), and each pipeline ends with barriers and a WAIT of its own,
on that node's connection, after its calls. There ``PUBLISH`` is not replicated (it travels
over the cluster bus), so the barrier is a keyed write (``SET <prefix>:{<tag>}:barrier 1 PX
60000``) in the slot of each call of the pipeline (one per slot): with a stale slot map
(after a reshard) some of those slots may have left the node, and their calls and barriers
meet MOVED, but one barrier in a slot the node still owns is enough for the WAIT to cover
every call that ran there. Every call gets the replica count of the WAIT that followed it, so
a producer is told which jobs sat on a node whose replicas fell short. A call redirected
(MOVED, ASK, TRYAGAIN: it did not run) goes with the next round's pipeline of its new node,
behind that pipeline's own WAIT; a call is never sent twice blindly (the scripts are
repeat-safe, and only calls that did not run, or met NOSCRIPT, are sent again).

:func:`run_each` answers per call: a call whose node failed, or that the server refused, gets
its own error in place of its reply, and the other calls keep theirs (a bulk enqueue answers
per job: DESIGN.md invariant 16).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from redis.exceptions import (
    AskError,
    MovedError,
    NoScriptError,
    RedisError,
    ResponseError,
    TryAgainError,
)

from . import nodes
from .config import QueueConfig
from .conn import is_cluster
from .driver import Call as DCall
from .driver import Op, adrive, drive
from .errors import ReplicationTimeout, ScriptError
from .keys import barrier_key
from .scripts import Arg, Script, _pack, _sort

Call = tuple[Sequence[str], Sequence[Arg]]
T = TypeVar("T")


BARRIER_TTL_MS = 60_000
"""How long a cluster barrier key lives (it only has to be written; it need not stay)."""

BARRIER_TAG = "barrier"
"""The waiter-channel tag of the producer's barrier (never a producer's own: those are hex)."""


def _wait_cmds(config: QueueConfig, barrier: str | None) -> list[tuple[Any, ...]]:
    wait = ("WAIT", config.min_replicas, config.min_replicas_timeout_ms)
    return [("PUBLISH", barrier, ""), wait] if barrier else [wait]


def _cluster_tail(config: QueueConfig, barrier: str | None) -> nodes.Tail:
    """A node's pipeline tail on a Redis Cluster: a keyed barrier in the slot of each of the
    group's calls (behind ASKING when that call is; one per slot), then WAIT."""
    wait = ("WAIT", config.min_replicas, config.min_replicas_timeout_ms)

    def tail(cmds: Sequence[nodes.Command], asking: Sequence[bool]
             ) -> list[tuple[nodes.Command, bool]]:
        out: list[tuple[nodes.Command, bool]] = []
        if barrier:
            seen: set[str] = set()
            for cmd, ask in zip(cmds, asking, strict=True):
                key = nodes.key_of(cmd)
                if key is None:
                    continue
                bk = barrier_key(key.decode() if isinstance(key, bytes) else str(key))
                if bk not in seen:
                    seen.add(bk)
                    out.append((("SET", bk, "1", "PX", BARRIER_TTL_MS), ask))
        out.append((wait, False))
        return out
    return tail


def _acked(tail: list[Any]) -> int:
    """The replicas a node's WAIT counted; 0 when the WAIT failed, or every barrier before it
    did (then nothing is confirmed: the caller is told, never reassured). One barrier that
    was written is enough: the WAIT covers everything the node had written by then."""
    if not tail or isinstance(tail[-1], BaseException):
        return 0
    barriers = tail[:-1]
    if barriers and all(isinstance(x, BaseException) for x in barriers):
        return 0
    return int(tail[-1])


def _cluster_file(script: Script, calls: Sequence[Call], got: list[Any],
                  tails: list[list[Any]], replies: list[Any], acks: list[int],
                  todo: list[int], each: bool = False) -> list[int]:
    """File a cluster round's replies of the calls ``todo``; return those that met NOSCRIPT
    (they did not run: load the script, send them again). A redirect still standing after
    ``nodes`` followed it is raised as itself (transient: the call did not run); ``each``:
    every error is filed as the call's reply instead (a failed node's error as it is, an
    error reply as a ScriptError, a redirect as itself)."""
    again: list[int] = []
    for i, rep, tail in zip(todo, got, tails, strict=True):
        if isinstance(rep, NoScriptError):
            again.append(i)
        elif isinstance(rep, MovedError | AskError | TryAgainError) or (
                each and not isinstance(rep, ResponseError) and isinstance(rep, Exception)):
            if not each:
                raise rep
            replies[i] = rep
        elif isinstance(rep, BaseException):
            err = ScriptError(f"{script.name}.lua failed: {rep}")
            if not each:
                raise err from rep
            err.__cause__ = rep
            replies[i] = err
        else:
            replies[i], acks[i] = rep, _acked(tail)
    return again


def _cluster_waited(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
                    barrier: str | None, each: bool = False) -> tuple[list[Any], list[int]]:
    replies: list[Any] = [None] * len(calls)
    acks = [0] * len(calls)
    todo = list(range(len(calls)))
    tail = _cluster_tail(config, barrier) if config.min_replicas else None
    for attempt in range(2):
        got, tails = nodes.run_tailed(client, script._commands([calls[i] for i in todo]), tail,
                                      each=each)
        todo = _cluster_file(script, calls, got, tails, replies, acks, todo, each)
        if not todo:
            return replies, acks
        if attempt == 0:
            try:
                client.script_load(script.source)  # every primary
            except Exception as exc:
                if not each:
                    raise
                return _unloaded(exc, todo, replies), acks
    raise ScriptError(f"{script.name}.lua: NOSCRIPT after loading it")


def _unloaded(exc: Exception, todo: list[int], replies: list[Any]) -> list[Any]:
    """``each``: the calls that met NOSCRIPT get the error of loading the script."""
    for i in todo:
        replies[i] = exc
    return replies


async def _acluster_waited(script: Script, client: Any, calls: Sequence[Call],
                           config: QueueConfig, barrier: str | None, each: bool = False
                           ) -> tuple[list[Any], list[int]]:
    replies: list[Any] = [None] * len(calls)
    acks = [0] * len(calls)
    todo = list(range(len(calls)))
    tail = _cluster_tail(config, barrier) if config.min_replicas else None
    for attempt in range(2):
        got, tails = await nodes.arun_tailed(
            client, script._commands([calls[i] for i in todo]), tail, each=each)
        todo = _cluster_file(script, calls, got, tails, replies, acks, todo, each)
        if not todo:
            return replies, acks
        if attempt == 0:
            try:
                await client.script_load(script.source)
            except Exception as exc:
                if not each:
                    raise
                return _unloaded(exc, todo, replies), acks
    raise ScriptError(f"{script.name}.lua: NOSCRIPT after loading it")


def run_each(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
             barrier: str | None = None) -> tuple[list[Any], list[int]]:
    """:func:`run`, answering per call: (each call's reply, or its own error as an
    exception object; the replicas that confirmed it). A call the server refused (a
    ScriptError) fails alone; on a Redis Cluster so do the calls of a node that fails as a
    whole (down, stalled past the socket timeout), while on one server a connection error is
    every call's own."""
    if is_cluster(client):
        return _cluster_waited(script, client, calls, config, barrier, each=True)
    try:
        if _packable(script, client):
            return run_waited(script, client, calls, config, barrier, each=True)
        return run(script, client, calls, config, barrier)
    except (RedisError, ScriptError) as exc:  # one server: its error is every call's own
        return [exc] * len(calls), [0] * len(calls)


async def arun_each(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
                    barrier: str | None = None) -> tuple[list[Any], list[int]]:
    """:func:`run_each` for an asyncio client."""
    if is_cluster(client):
        return await _acluster_waited(script, client, calls, config, barrier, each=True)
    try:
        if _packable(script, client):
            return await arun_waited(script, client, calls, config, barrier, each=True)
        return await arun(script, client, calls, config, barrier)
    except (RedisError, ScriptError) as exc:
        return [exc] * len(calls), [0] * len(calls)


def _packable(script: Script, client: Any) -> bool:
    return script._plain(client)


def _sorted(script: Script, todo: list[int], got: list[Any], replies: list[Any], each: bool
            ) -> tuple[list[int], ResponseError | None]:
    """``scripts._sort``; ``each``: every other error reply is filed as its call's reply (a
    ScriptError naming the script), and none is returned to raise."""
    if not each:
        return _sort(todo, got, replies)
    again: list[int] = []
    for i, x in zip(todo, got, strict=True):
        if isinstance(x, NoScriptError):
            again.append(i)
        elif isinstance(x, ResponseError):
            err = ScriptError(f"{script.name}.lua failed: {x}")
            err.__cause__ = x
            replies[i] = err
        else:
            replies[i] = x
    return again, None


def run_waited(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
               barrier: str | None = None, each: bool = False) -> tuple[list[Any], list[int]]:
    """Run ``calls`` of ``script`` pipelined, then WAIT on the same connection: (replies in
    order, for each call the replicas that acknowledged it). NOSCRIPT is handled as in
    ``Script.run_many``: the script is loaded and only the calls that met it are sent again
    (with a WAIT again). On a Redis Cluster: one pipeline and one WAIT per node. ``each``:
    an error reply is filed as that call's reply (a ScriptError) instead of raised, and with
    ``min_replicas`` 0 no WAIT is sent (``run_each``)."""
    if is_cluster(client):
        return _cluster_waited(script, client, calls, config, barrier, each)
    if not _packable(script, client):
        return _run_pipeline(script, client, calls, config, barrier)
    pool: Any = client.connection_pool
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        conn = pool.get_connection()
        try:
            tail = _wait_cmds(config, barrier) if config.min_replicas else []
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
            acked = int(conn.read_response()) if tail else 0
            todo, failed = _sorted(script, todo, got, replies, each)
        except BaseException:  # replies may be left unread: never reuse it
            conn.disconnect()
            raise
        finally:
            pool.release(conn)
        if failed is not None:
            raise ScriptError(f"{script.name}.lua failed: {failed}") from failed
        if not todo:
            return replies, [acked] * len(calls)
        if attempt == 0:
            client.script_load(script.source)
    raise ScriptError(f"{script.name}.lua: NOSCRIPT after loading it")


async def arun_waited(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
                      barrier: str | None = None, each: bool = False
                      ) -> tuple[list[Any], list[int]]:
    """:func:`run_waited` for an asyncio client."""
    if is_cluster(client):
        return await _acluster_waited(script, client, calls, config, barrier, each)
    if not _packable(script, client):
        return await _arun_pipeline(script, client, calls, config, barrier)
    pool: Any = client.connection_pool
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        conn = await pool.get_connection()
        try:
            tail = _wait_cmds(config, barrier) if config.min_replicas else []
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
            acked = int(await conn.read_response()) if tail else 0
            todo, failed = _sorted(script, todo, got, replies, each)
        except BaseException:
            await conn.disconnect()
            raise
        finally:
            await pool.release(conn)
        if failed is not None:
            raise ScriptError(f"{script.name}.lua failed: {failed}") from failed
        if not todo:
            return replies, [acked] * len(calls)
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
                  barrier: str | None) -> tuple[list[Any], list[int]]:
    """Without hiredis, or for a client with a pinned connection: a redis-py pipeline (one
    connection), loading the script first when the server does not have it."""
    if not all(client.script_exists(script.sha)):
        client.script_load(script.source)
    pipe = client.pipeline(transaction=False)
    tail = _pipeline(pipe, script, calls, config, barrier)
    return _unpipe(script, pipe.execute(raise_on_error=False), tail)


async def _arun_pipeline(script: Script, client: Any, calls: Sequence[Call],
                         config: QueueConfig, barrier: str | None
                         ) -> tuple[list[Any], list[int]]:
    if not all(await client.script_exists(script.sha)):
        await client.script_load(script.source)
    pipe = client.pipeline(transaction=False)
    tail = _pipeline(pipe, script, calls, config, barrier)
    return _unpipe(script, await pipe.execute(raise_on_error=False), tail)


def _unpipe(script: Script, out: list[Any], tail: int) -> tuple[list[Any], list[int]]:
    for x in out:
        if isinstance(x, ResponseError):
            raise ScriptError(f"{script.name}.lua failed: {x}") from x
        if isinstance(x, BaseException):
            raise x
    return list(out[:-tail]), [int(out[-1])] * (len(out) - tail)


def run(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
        barrier: str | None = None) -> tuple[list[Any], list[int]]:
    """The replies of ``calls`` and, for each, the replicas that confirmed it (0 when
    ``min_replicas`` is 0: no WAIT is sent, the calls go out exactly as without this module)."""
    if not config.min_replicas:
        if len(calls) == 1:
            return [script(client, *calls[0])], [0]
        return script.run_many(client, calls), [0] * len(calls)
    return run_waited(script, client, calls, config, barrier)


async def arun(script: Script, client: Any, calls: Sequence[Call], config: QueueConfig,
               barrier: str | None = None) -> tuple[list[Any], list[int]]:
    """:func:`run` for an asyncio client."""
    if not config.min_replicas:
        if len(calls) == 1:
            return [await script.run_async(client, *calls[0])], [0]
        return await script.run_many_async(client, calls), [0] * len(calls)
    return await arun_waited(script, client, calls, config, barrier)


def confirm(config: QueueConfig, results: Sequence[Any],
            parts: Sequence[tuple[Sequence[Any], int]]) -> None:
    """Raise :class:`ReplicationTimeout` when fewer than ``min_replicas`` replicas confirmed
    some enqueue call that wrote (or found) jobs. ``results``: every EnqueueResult in the
    caller's order; ``parts``: each call's results with the replicas that confirmed it (on a
    cluster, the WAIT of the node that ran it): only the jobs of short calls are named."""
    if not config.min_replicas:
        return
    short = [(r, acked) for rs, acked in parts if acked < config.min_replicas for r in rs
             if r.status != "rejected"]
    if short:
        raise ReplicationTimeout([r.job_id for r, _ in short], min(a for _, a in short),
                                 config.min_replicas, config.min_replicas_timeout_ms,
                                 list(results))


def split(exc: ReplicationTimeout, results: Sequence[Any]) -> list[Any]:
    """An auto-batched call's answer per caller: ``results`` (the batch's, in order) with
    each job the timeout names replaced by a ReplicationTimeout of its own."""
    named = set(exc.job_ids)
    return [ReplicationTimeout([r.job_id], exc.replicas, exc.wanted, exc.timeout_ms, [r])
            if r.job_id in named and r.status != "rejected" else r for r in results]


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


# --- operations of several steps (workflows): one barrier and WAIT after the last step -------

def _noting(op: Op[T], seen: set[str]) -> Op[T]:
    """``op``, step for step, noting the first key of every script call it sends (each
    call's keys are in one slot, so one key names the node that ran it)."""
    try:
        step = next(op)
        while True:
            seen.update(c.keys[0] for c in step if isinstance(c, DCall) and c.keys)
            step = op.send((yield step))
    except StopIteration as stop:
        result: T = stop.value
        return result


def _confirm_cmds(config: QueueConfig, seen: set[str], barrier: str
                  ) -> tuple[list[nodes.Command], nodes.Tail]:
    """On a Redis Cluster: a keyed barrier in each slot the operation wrote to, each node's
    pipeline ending with its WAIT."""
    wait = ("WAIT", config.min_replicas, config.min_replicas_timeout_ms)
    cmds: list[nodes.Command] = [("SET", bk, "1", "PX", BARRIER_TTL_MS)
                                 for bk in sorted({barrier_key(k) for k in seen})]
    return cmds, lambda _cmds, _asking: [(wait, False)]


def _fewest(got: list[Any], tails: list[list[Any]]) -> int:
    """The fewest replicas any node confirmed (0 for a node whose barrier or WAIT failed)."""
    acks = [0 if isinstance(rep, BaseException) else _acked(tail)
            for rep, tail in zip(got, tails, strict=True)]
    return min(acks, default=0)


def drive_confirmed(client: Any, op: Op[T], config: QueueConfig, barrier: str
                    ) -> tuple[T, int | None]:
    """Run ``op`` (an operation of several steps, whose calls may run on any pooled
    connection), then, with ``min_replicas``, write a barrier and WAIT: the WAIT follows the
    barrier on its connection, so it covers everything the primary had written by then,
    every call of ``op`` included (on a cluster: a barrier in each slot ``op`` wrote to, and
    a WAIT per node). Returns (op's answer, the fewest replicas that confirmed it, or None
    without ``min_replicas``)."""
    if not config.min_replicas:
        return drive(client, op), None
    seen: set[str] = set()
    out = drive(client, _noting(op, seen))
    if not seen:
        return out, config.min_replicas
    return out, replicated(client, config, seen, barrier)


def replicated(client: Any, config: QueueConfig, keys: Iterable[str], barrier: str) -> int:
    """Write a barrier and WAIT (``config.min_replicas``, its timeout): the fewest replicas
    that confirmed everything the primaries of ``keys`` had written by then, whoever wrote
    it (on one server: a PUBLISH on ``barrier`` then WAIT on its connection; on a cluster: a
    keyed barrier in each slot of ``keys`` and a WAIT per node)."""
    if is_cluster(client):
        cmds, tail = _confirm_cmds(config, set(keys), barrier)
        got, tails = nodes.run_tailed(client, cmds, tail, each=True)
        return _fewest(got, tails)
    pipe = client.pipeline(transaction=False)
    for cmd in _wait_cmds(config, barrier):
        pipe.execute_command(*cmd)
    return int(pipe.execute()[-1])


async def adrive_confirmed(client: Any, op: Op[T], config: QueueConfig, barrier: str
                           ) -> tuple[T, int | None]:
    """:func:`drive_confirmed` for an asyncio client."""
    if not config.min_replicas:
        return await adrive(client, op), None
    seen: set[str] = set()
    out = await adrive(client, _noting(op, seen))
    if not seen:
        return out, config.min_replicas
    return out, await areplicated(client, config, seen, barrier)


async def areplicated(client: Any, config: QueueConfig, keys: Iterable[str], barrier: str
                      ) -> int:
    """:func:`replicated` for an asyncio client."""
    if is_cluster(client):
        cmds, tail = _confirm_cmds(config, set(keys), barrier)
        got, tails = await nodes.arun_tailed(client, cmds, tail, each=True)
        return _fewest(got, tails)
    pipe = client.pipeline(transaction=False)
    for cmd in _wait_cmds(config, barrier):
        pipe.execute_command(*cmd)
    return int((await pipe.execute())[-1])


def confirm_ids(config: QueueConfig, acked: int | None, job_ids: list[str],
                results: list[Any] | None = None) -> None:
    """Raise :class:`ReplicationTimeout` naming ``job_ids`` when ``acked`` (from
    :func:`drive_confirmed`) is short of ``min_replicas``."""
    if acked is not None and acked < config.min_replicas and job_ids:
        raise ReplicationTimeout(job_ids, acked, config.min_replicas,
                                 config.min_replicas_timeout_ms, results)
