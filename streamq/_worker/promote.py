"""Promotion of due delayed/retry jobs, shared by workers and the scheduler daemon."""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
import redis.asyncio as aredis

from .._core.config import QueueConfig
from .._core.keys import Keys
from .._core.scripts import SCRIPTS

log = logging.getLogger("streamq.worker")
BATCH = 1000
"""Candidates per promote.lua call (loops are capped)."""
_SLACK_MS = 50
RESYNC_S = 10.0
"""Longest time between two readings of the server's clock."""


@attrs.define
class Promoter:
    """Promotes one queue's due jobs. Picks candidates by an estimate of the server's clock:
    the offset of the server's TIME to this host's monotonic clock, which no step of the host's
    wall clock moves; it is refreshed from every script reply and at least every
    ``RESYNC_S`` seconds. The script re-checks every candidate against the server's own TIME,
    so an estimate that runs ahead never promotes a job early."""

    keys: Keys
    config: QueueConfig
    offset_ms: float | None = None
    next_due_ms: int = -1
    synced_at: float = -1e18

    async def sync_clock(self, client: aredis.Redis) -> None:
        sec, usec = await client.time()
        self._observe(sec * 1000 + usec / 1000)

    def _observe(self, server_ms: float) -> None:
        now = time.monotonic()
        self.offset_ms = server_ms - now * 1000
        self.synced_at = now

    def server_now_ms(self) -> float:
        assert self.offset_ms is not None, "sync_clock() first"
        return time.monotonic() * 1000 + self.offset_ms

    async def run_once(self, client: aredis.Redis) -> tuple[int, bool]:
        """Promote one batch of due jobs; returns (moved, whether more may be due now)."""
        if self.offset_ms is None or time.monotonic() - self.synced_at >= RESYNC_S:
            await self.sync_clock(client)  # the server's clock may have been stepped
        horizon = int(self.server_now_ms()) + _SLACK_MS
        ids: Any = await client.zrangebyscore(
            self.keys.delayed, "-inf", horizon, start=0, num=BATCH)
        if not ids:
            first: Any = await client.zrange(self.keys.delayed, 0, 0, withscores=True)
            self.next_due_ms = int(first[0][1]) if first else -1
            return 0, False
        k = self.keys
        names: list[str] = []
        junk: list[bytes] = []
        for i in ids:
            try:
                names.append(i.decode())
            except UnicodeDecodeError:
                junk.append(i)
        if junk:  # no job id can be written like that: not ours, drop it (or it blocks the set)
            await client.zrem(k.delayed, *junk)
            log.warning("dropped %d undecodable members of %s", len(junk), k.delayed)
            if not names:
                return 0, True
        keys = [k.delayed, k.stream, k.dead, k.stats, k.events]
        keys.extend(k.job(i) for i in names)
        keys.extend(k.group_keys)
        keys += (k.levels, *k.level_streams)  # a job with a priority goes to its level
        cfg = self.config
        moved, now, next_due = await SCRIPTS["promote"].run_async(
            client, keys, [cfg.events_arg, cfg.dead_ttl_s, cfg.dead_maxlen, cfg.group_arg,
                           *names])
        self._observe(now)
        self.next_due_ms = int(next_due)
        return int(moved), len(ids) == BATCH

    def sleep_s(self, max_s: float) -> float:
        if self.next_due_ms < 0:
            return max_s
        return max(0.0, min(max_s, (self.next_due_ms - self.server_now_ms()) / 1000))
