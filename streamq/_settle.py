"""Settling: outcomes written with finish.lua in batches, counted when Redis confirms them,
and unfinished work handed back when a worker stops."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from . import _telemetry as tel
from ._errors import ScriptError
from ._keys import GROUP
from ._retry import TRANSIENT
from ._scripts import SCRIPTS

if TYPE_CHECKING:
    from ._worker import Finish, Worker, _QState

log = logging.getLogger("streamq.worker")
_BATCH = 1000


async def flush_loop(w: Worker, qs: _QState) -> None:
    """Settle the outcomes buffered for ``qs`` with finish.lua, a batch per call, until the
    worker stops settling and the buffer is empty."""
    assert w._client is not None
    k = qs.keys
    cfg = w.queue_config
    backoff = 0.05
    while w._settling or qs.buf:
        await qs.flush.wait()
        qs.flush.clear()
        while qs.buf:
            batch = qs.buf[:_BATCH]
            keys = [k.stream, k.delayed, k.dead, k.stats, k.events]
            keys.extend(k.job(b[0]) for b in batch)
            args: list[Any] = [GROUP, cfg.events_maxlen, cfg.dead_ttl_s, cfg.dead_maxlen,
                               k.wake_channel, len(batch)]
            for b in batch:
                args.extend(b)
            try:
                reply = await SCRIPTS["finish"].run_async(w._client, keys, args)
            except TRANSIENT as exc:  # finish is idempotent: retry the same batch
                log.warning("settling %d jobs failed (%s); retrying", len(batch), exc)
                if not w._settling and backoff >= 2.0:
                    qs.flush.set()
                    return  # stopping and Redis is away: the leases lapse, jobs re-run
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            except ScriptError:
                # never expected (finish.lua guards its reads); drop the batch from this
                # worker: the entries stay pending and are taken over after the timeout
                log.exception("settling %d jobs failed; they recover by reclaim", len(batch))
                del qs.buf[:len(batch)]
                w._leases.remove_many(qs.keys.queue, [b[1] for b in batch])
                for b in batch:
                    settled(w, qs, b, b"lost")
                w._settled_n(len(batch))
                continue
            backoff = 0.05
            del qs.buf[:len(batch)]
            w._leases.remove_many(qs.keys.queue, [b[1] for b in batch])
            for b, state in zip(batch, reply, strict=True):
                settled(w, qs, b, state)
            w._settled_n(len(batch))


def settled(w: Worker, qs: _QState, item: Finish, state: bytes) -> None:
    job_id, entry = item[0], item[1]
    w._jobs.pop((qs.keys.queue, entry), None)
    extra = {"job_id": job_id, "queue": qs.keys.queue}
    if state == b"completed":
        w.stats.completed += 1
        tel.COMPLETED.add(1, qs.labels)
    elif state == b"retrying":
        w.stats.retried += 1
        tel.RETRIED.add(1, qs.labels)
    elif state == b"failed":
        w.stats.failed += 1
        tel.FAILED.add(1, qs.labels)
        log.warning("job %s dead-lettered: %s", job_id, item[5] if item[3] == "dead" else
                    "attempts exhausted", extra=extra)
    else:
        w.stats.lost += 1
        tel.LEASE_LOST.add(1, qs.labels)
        log.warning("job %s: lease lost before settling; result discarded", job_id,
                    extra=extra)


async def hand_back(w: Worker) -> None:
    """Release jobs this worker started but did not finish, and entries it never started."""
    assert w._client is not None
    for qs in w._qs.values():
        k = qs.keys
        items: dict[str, tuple[str, str]] = {}
        for lease in w._leases.snapshot():
            if lease.keys.queue == k.queue:
                items[lease.entry] = (lease.job_id, lease.token)
        try:
            reply: Any = await w._client.xreadgroup(
                GROUP, w.consumer, {k.stream: "0"}, count=_BATCH)
            for eid, fields in (reply[0][1] if reply else []):
                jid = (fields or {}).get(b"id")
                if jid and eid.decode() not in items:
                    items[eid.decode()] = (jid.decode(), "")
            for i in range(0, len(items), _BATCH):
                part = list(items.items())[i:i + _BATCH]
                keys = [k.stream, k.stats, k.events, *(k.job(j) for _, (j, _t) in part)]
                args: list[Any] = [GROUP, w.queue_config.events_maxlen, w.consumer]
                for eid, (jid, token) in part:
                    args += [jid, eid, token]
                released = await SCRIPTS["release"].run_async(w._client, keys, args)
                w.stats.released += sum(released)
        except TRANSIENT as exc:
            log.warning("could not hand back jobs of %s (%s); they recover after the"
                        " visibility timeout", k.queue, exc)
        for eid in items:
            w._leases.remove(k.queue, eid)
