"""The sans-IO operation protocol and its two drivers.

An operation is a generator: it yields a *step* (a list of commands and script calls, sent as
one pipeline) and receives the replies (an exception object in place of a failed command).
:func:`drive` runs one over a blocking client, :func:`adrive` over an asyncio client; every
part (producer, worker, ops, schedulers, spark) runs its operations through them, so no
operation touches a connection itself.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeVar

import attrs
import redis
import redis.asyncio as aredis
from redis.exceptions import MovedError, NoScriptError

from . import nodes as _nodes
from .conn import is_cluster, standalone_on_cluster
from .scripts import SCRIPTS, Arg

T = TypeVar("T")


@attrs.frozen
class Cmd:
    args: tuple[Any, ...]

    @classmethod
    def of(cls, *args: Any) -> Cmd:
        return cls(args)


@attrs.frozen
class Call:
    script: str
    keys: list[str]
    args: list[Arg]


Step = list[Cmd | Call]
Op = Generator[Step, list[Any], T]


def ok(reply: Any) -> Any:
    if isinstance(reply, Exception):
        raise reply
    return reply


def _s(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _dict(reply: Any) -> dict[str, Any]:
    """A flat [k, v, k, v] reply, or a dict from a redis-py callback, with str keys."""
    if isinstance(reply, dict):
        return {_s(k): v for k, v in reply.items()}
    it = iter(reply)
    return {_s(k): v for k, v in zip(it, it, strict=True)}


def _server_ms(t: Any) -> int:
    sec, usec = t
    return int(sec) * 1000 + int(usec) // 1000


def _raw_pipe(client: Any) -> Any:
    """A pipeline without redis-py's reply callbacks: the operations parse raw RESP2."""
    return type(client.pipeline())(client.connection_pool, {}, False, None)


def _queue_pipe(pipe: Any, step: Step) -> None:
    for c in step:
        if isinstance(c, Call):
            s = SCRIPTS[c.script]
            pipe.evalsha(s.sha, len(c.keys), *c.keys, *c.args)
        else:
            pipe.execute_command(*c.args)


def _commands(step: Step) -> list[tuple[Any, ...]]:
    return [("EVALSHA", SCRIPTS[c.script].sha, len(c.keys), *c.keys, *c.args)
            if isinstance(c, Call) else tuple(c.args) for c in step]


def _send(client: Any, step: Step) -> list[Any]:
    """One step's calls in one round trip (on a cluster: one pipeline per node)."""
    if is_cluster(client):
        return _nodes.run(client, _commands(step))
    pipe = _raw_pipe(client)
    _queue_pipe(pipe, step)
    replies: list[Any] = pipe.execute(raise_on_error=False)
    return _not_moved(replies)


async def _asend(client: Any, step: Step) -> list[Any]:
    if is_cluster(client):
        return await _nodes.arun(client, _commands(step))
    pipe = _raw_pipe(client)
    _queue_pipe(pipe, step)
    replies: list[Any] = await pipe.execute(raise_on_error=False)
    return _not_moved(replies)


def _not_moved(replies: list[Any]) -> list[Any]:
    """A MOVED reply on a plain client: the URL names one node of a Redis Cluster."""
    if any(isinstance(r, MovedError) for r in replies):
        raise standalone_on_cluster(None)
    return replies


def _noscript(step: Step, replies: list[Any]) -> list[int]:
    return [i for i, (c, r) in enumerate(zip(step, replies, strict=True))
            if isinstance(c, Call) and isinstance(r, NoScriptError)]


def drive(client: redis.Redis, op: Op[T]) -> T:
    """Run an operation over a blocking client."""
    try:
        step = next(op)
        while True:
            replies = _send(client, step)
            retry = _noscript(step, replies)
            if retry:  # a restarted server lost its script cache: load and resend those
                for name in {step[i].script for i in retry}:  # type: ignore[union-attr]
                    client.script_load(SCRIPTS[name].source)
                for i, rep in zip(retry, _send(client, [step[i] for i in retry]),
                                  strict=True):
                    replies[i] = rep
            step = op.send(replies)
    except StopIteration as stop:
        result: T = stop.value
        return result


async def adrive(client: aredis.Redis, op: Op[T]) -> T:
    """Run an operation over an asyncio client."""
    try:
        step = next(op)
        while True:
            replies = await _asend(client, step)
            retry = _noscript(step, replies)
            if retry:
                for name in {step[i].script for i in retry}:  # type: ignore[union-attr]
                    await client.script_load(SCRIPTS[name].source)
                for i, rep in zip(retry, await _asend(client, [step[i] for i in retry]),
                                  strict=True):
                    replies[i] = rep
            step = op.send(replies)
    except StopIteration as stop:
        result: T = stop.value
        return result
