"""A worker's housekeeping loops: pause flags, heartbeats, gauges, pruning dead consumers,
and promoting its queues' due delayed jobs."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from typing import TYPE_CHECKING

from . import _ops
from ._keys import GROUP, Keys
from ._retry import TRANSIENT
from ._scripts import SCRIPTS

if TYPE_CHECKING:
    from ._worker import Worker

log = logging.getLogger("streamq.worker")
_BATCH = 1000


async def control_loop(w: Worker) -> None:
    """Pause flags every second; heartbeat every heartbeat interval; pruning now and then."""
    assert w._client is not None
    beat_every = w.config.heartbeat_interval_s
    last_beat = -1e9
    last_prune = -1e9
    last_gauges = -1e9
    loop = asyncio.get_running_loop()
    info = json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                       "concurrency": w.config.concurrency, "queues": list(w._qs)})
    while w._running:
        try:
            await refresh_paused(w)
            now = loop.time()
            if now - last_beat >= beat_every:
                last_beat = now
                for qs in w._qs.values():
                    await SCRIPTS["heartbeat"].run_async(
                        w._client, [qs.keys.workers, qs.keys.worker_info(w.consumer)],
                        [w.consumer, info, int(beat_every * 3) + 1])
            if w._gauges_read and now - last_gauges >= w.config.gauges_interval_s:
                last_gauges = now
                w._gauges_read = False
                await refresh_gauges(w)
            if now - last_prune >= w.config.prune_interval_s:
                last_prune = now
                for qs in w._qs.values():
                    await prune(w, qs.keys)
        except TRANSIENT as exc:
            log.warning("control loop: %s", exc)
        await asyncio.sleep(min(1.0, beat_every))


def gauge_values(w: Worker) -> list[tuple[str, dict[str, float]]]:
    w._gauges_read = True  # a metrics reader is collecting: keep the cache fresh
    return [(q, qs.gauges) for q, qs in w._qs.items()]


async def refresh_gauges(w: Worker) -> None:
    from .admin import adrive

    assert w._client is not None
    for qs in w._qs.values():
        st = await adrive(w._client, _ops.stats(qs.keys))
        qs.gauges = {"ready": st.ready, "pending": st.pending,
                     "delayed": st.scheduled + st.retrying, "dead": st.dead,
                     "oldest_ready_age": st.oldest_ready_age_s or 0.0}


async def refresh_paused(w: Worker) -> None:
    assert w._client is not None
    pipe = w._client.pipeline(transaction=False)
    for qs in w._qs.values():
        pipe.exists(qs.keys.paused)
    for qs, flag in zip(w._qs.values(), await pipe.execute(), strict=True):
        qs.paused = bool(flag)


async def prune(w: Worker, keys: Keys) -> None:
    assert w._client is not None
    consumers = await w._client.xinfo_consumers(keys.stream, GROUP)
    stale_ms = int(w.config.consumer_dead_after_s * 1000)
    for c in consumers[:_BATCH]:
        name = c["name"].decode() if isinstance(c["name"], bytes) else c["name"]
        if name == w.consumer or int(c["pending"]) > 0 or int(c["idle"]) < stale_ms:
            continue
        if await SCRIPTS["prune"].run_async(w._client, [keys.stream, keys.workers],
                                             [GROUP, name, stale_ms]):
            log.info("pruned dead consumer %s from %s", name, keys.queue)


async def promote_loop(w: Worker) -> None:
    assert w._client is not None
    for qs in w._qs.values():
        assert qs.promoter is not None
        await qs.promoter.sync_clock(w._client)
    while w._running:
        sleep = w.config.promote_interval_s
        for qs in w._qs.values():
            assert qs.promoter is not None
            try:
                _moved, more = await qs.promoter.run_once(w._client)
            except TRANSIENT as exc:
                log.warning("promotion on %s failed: %s", qs.keys.queue, exc)
                continue
            except Exception:  # keep promoting whatever one round met
                log.exception("promotion on %s failed", qs.keys.queue)
                continue
            sleep = 0 if more else min(sleep, qs.promoter.sleep_s(sleep))
        await asyncio.sleep(sleep)
