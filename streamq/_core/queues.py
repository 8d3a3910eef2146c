"""The queue registry: the known queues (a SET under the key prefix that producers, workers
and schedulers add their queues to) and the job types the workers of a queue have published
(for producers that refuse the others). Sans-IO operations and their blocking and asyncio
forms; checking or forgetting a queue is the ops part's (``_ops/queues.py``)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import NoPermissionError

from .driver import Cmd, Op, _dict, _s, _server_ms, adrive, drive, ok
from .keys import Keys, queues_key


def publish_types_op(keys: Keys, names: Sequence[str]) -> Op[None]:
    """Record that a worker of this queue has handlers for these job types (server time)."""
    if not names:
        return None
    (t,) = yield [Cmd.of("TIME")]
    now = _server_ms(ok(t))
    args: list[Any] = []
    for n in names:
        args += [n, now]
    (r,) = yield [Cmd.of("HSET", keys.types, *args)]
    ok(r)
    return None


def registered_types_op(keys: Keys) -> Op[dict[str, int]]:
    """Job type -> when a worker of the queue last published a handler for it (epoch ms)."""
    (h,) = yield [Cmd.of("HGETALL", keys.types)]
    return {_s(k): int(v) for k, v in _dict(ok(h)).items()}


def known(client: redis.Redis, prefix: str) -> list[str]:
    names: Any = client.smembers(queues_key(prefix))
    return sorted(n.decode() for n in names)


def registered_types(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """Job type -> when a worker of the queue last published a handler for it (epoch ms)."""
    return drive(client, registered_types_op(keys))


async def aregistered_types(client: aredis.Redis, keys: Keys) -> dict[str, int]:
    return await adrive(client, registered_types_op(keys))


def note_queue(client: redis.Redis, keys: Keys) -> None:
    """Add the queue to the known queues (a producer does it once, so a queue with jobs and
    no worker still shows in ``streamq stats``). An ACL user without access is tolerated."""
    with contextlib.suppress(NoPermissionError):
        client.sadd(queues_key(keys.prefix), keys.queue)


async def anote_queue(client: aredis.Redis, keys: Keys) -> None:
    with contextlib.suppress(NoPermissionError):
        await client.sadd(queues_key(keys.prefix), keys.queue)


async def publish_types(client: aredis.Redis, keys: Sequence[Keys], names: Sequence[str]
                        ) -> None:
    """What a worker calls once at start: record, for each of its queues, the job types its
    registry has handlers for. An ACL user without access to the key is tolerated."""
    for k in keys:
        with contextlib.suppress(NoPermissionError):
            await adrive(client, publish_types_op(k, names))
