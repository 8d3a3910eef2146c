"""A job's record by id for ``Queue.get`` / ``AsyncQueue.get``, across reshards
(``_core/locate.py``). An id with one home (every id of a queue never resharded, about half
of them after 3 -> 6) is read with one plain HGETALL, as before resharding existed (a
pipelined operation costs about 40 µs more per call on this path); an id that may be in
several homes is read in all of them in one step (``locate.lookup``). A miss reads the stored
layout again and, if a reshard changed it, looks again."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aredis

from .._core.driver import adrive, drive
from .._core.keys import Keys
from .._core.locate import homes, lookup, newer_layout
from .._core.retry import acall, call
from .._core.shards import Layout

Record = dict[bytes, bytes]


def _plain(exc: redis.exceptions.ResponseError) -> None:
    if "WRONGTYPE" not in str(exc):
        raise exc  # (WRONGTYPE: the key holds something else than a job record)


def record(client: redis.Redis, keys: Keys, layout: Layout, job_id: str
           ) -> tuple[Record | None, Layout]:
    """The job's record (None: there is none) and the layout to keep."""
    hs = homes(layout, job_id)
    if len(hs) == 1:
        key = keys.of_shard(hs[0]).job(job_id)
        try:
            h: Any = call(lambda _r: client.hgetall(key))
        except redis.exceptions.ResponseError as exc:
            _plain(exc)
            h = None
        if h:
            return h, layout
        newer = call(lambda _r: drive(client, newer_layout(keys, layout)))
        if newer is None:
            return None, layout
        layout = newer
    _k, rec, layout = call(lambda _r: drive(client, lookup(keys, layout, job_id)))
    return rec, layout


async def arecord(client: aredis.Redis, keys: Keys, layout: Layout, job_id: str
                  ) -> tuple[Record | None, Layout]:
    """``record``, awaitable."""
    hs = homes(layout, job_id)
    if len(hs) == 1:
        key = keys.of_shard(hs[0]).job(job_id)

        async def once(_retried: bool) -> Any:
            return await client.hgetall(key)

        try:
            h: Any = await acall(once)
        except redis.exceptions.ResponseError as exc:
            _plain(exc)
            h = None
        if h:
            return h, layout
        newer = await acall(lambda _r: adrive(client, newer_layout(keys, layout)))
        if newer is None:
            return None, layout
        layout = newer
    _k, rec, layout = await acall(lambda _r: adrive(client, lookup(keys, layout, job_id)))
    return rec, layout
