"""A job's record by id for ``Queue.get`` / ``AsyncQueue.get``, and a cancel by id, across
reshards (``_core/locate.py``). An id with one home (every id of a queue never resharded, about half
of them after 3 -> 6) is read with one plain HGETALL, as before resharding existed (a
pipelined operation costs about 40 µs more per call on this path); an id that may be in
several homes is read in all of them in one step (``locate.lookup``). A miss reads the stored
layout again and, if a reshard changed it, looks again."""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio as aredis

from .._core import cancel as _cancel
from .._core.config import QueueConfig
from .._core.driver import adrive, drive
from .._core.keys import Keys
from .._core.locate import homes, locate, lookup, newer_layout
from .._core.model import CancelResult
from .._core.retry import acall, call
from .._core.scripts import SCRIPTS
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



def _cancel_in(client: redis.Redis, keys: Keys, cfg: QueueConfig, layout: Layout,
               job_id: str) -> tuple[CancelResult, Keys]:
    k = call(lambda _r: drive(client, locate(keys, layout, job_id)))
    ks, args = _cancel.cancel_call(k, cfg, job_id)
    return call(lambda retried: _cancel.parse_cancel(
        job_id, SCRIPTS["cancel"](client, ks, args), retried=retried)), k


def cancel(client: redis.Redis, keys: Keys, cfg: QueueConfig, layout: Layout, job_id: str
           ) -> tuple[CancelResult, Keys, Layout]:
    """cancel.lua in the shard that holds the job; on ``not_found`` with a layout a reshard
    changed since, once more under the new one. Returns the answer, the job's shard keys
    (for the cascade) and the layout to keep."""
    res, k = _cancel_in(client, keys, cfg, layout, job_id)
    if res.code == "not_found":
        newer = call(lambda _r: drive(client, newer_layout(keys, layout)))
        if newer is not None:
            layout = newer
            res, k = _cancel_in(client, keys, cfg, layout, job_id)
    return res, k, layout


async def _acancel_in(client: aredis.Redis, keys: Keys, cfg: QueueConfig, layout: Layout,
                      job_id: str) -> tuple[CancelResult, Keys]:
    k = await acall(lambda _r: adrive(client, locate(keys, layout, job_id)))
    ks, args = _cancel.cancel_call(k, cfg, job_id)

    async def once(retried: bool) -> CancelResult:
        reply = await SCRIPTS["cancel"].run_async(client, ks, args)
        return _cancel.parse_cancel(job_id, reply, retried=retried)

    return await acall(once), k


async def acancel(client: aredis.Redis, keys: Keys, cfg: QueueConfig, layout: Layout,
                  job_id: str) -> tuple[CancelResult, Keys, Layout]:
    """``cancel``, awaitable."""
    res, k = await _acancel_in(client, keys, cfg, layout, job_id)
    if res.code == "not_found":
        newer = await acall(lambda _r: adrive(client, newer_layout(keys, layout)))
        if newer is not None:
            layout = newer
            res, k = await _acancel_in(client, keys, cfg, layout, job_id)
    return res, k, layout
