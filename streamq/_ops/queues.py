"""Queue names: is a queue known (with "did you mean ..."), forget one. Blocking and asyncio
forms of the operations in ``operations.py``; the registry itself (known queues, published job
types) is ``_core/queues.py``."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aredis

from .._core.driver import adrive, drive
from .._core.keys import Keys, queues_key
from .._core.queues import known
from . import operations as _ops


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
