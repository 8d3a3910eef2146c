"""Queue names and job types: is a queue known (with "did you mean ..."), forget one, and
the job types the workers of a queue have published (for producers that refuse the others).

Blocking and asyncio forms of the operations in ``operations.py``."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aredis
from redis.exceptions import NoPermissionError

from .._core.driver import adrive, drive
from .._core.keys import Keys, queues_key
from . import operations as _ops


def known(client: redis.Redis, prefix: str) -> list[str]:
    names: Any = client.smembers(queues_key(prefix))
    return sorted(n.decode() for n in names)


def check_queue(client: redis.Redis, keys: Keys) -> None:
    """Raise UnknownQueue, naming the closest known queues, when no key of the queue exists."""
    if not drive(client, _ops.exists(keys)):
        raise _ops.unknown_queue(keys, known(client, keys.prefix))


async def acheck_queue(client: aredis.Redis, keys: Keys) -> None:
    if not await adrive(client, _ops.exists(keys)):
        names: Any = await client.smembers(queues_key(keys.prefix))
        raise _ops.unknown_queue(keys, sorted(n.decode() for n in names))


def forget(client: redis.Redis, keys: Keys, *, force: bool = False) -> bool:
    """Drop the queue from the known queues; refused while it has jobs, unless ``force``."""
    return drive(client, _ops.forget(keys, force))


def registered_types(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """Job type -> when a worker of the queue last published a handler for it (epoch ms)."""
    return drive(client, _ops.registered_types(keys))


async def aregistered_types(client: aredis.Redis, keys: Keys) -> dict[str, int]:
    return await adrive(client, _ops.registered_types(keys))


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
            await adrive(client, _ops.publish_types(k, names))
