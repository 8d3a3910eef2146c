"""Promotion of due delayed/retry jobs, shared by workers and the scheduler daemon."""

from __future__ import annotations

import logging
import time
from typing import Any

import attrs
import redis.asyncio as aredis

from ._config import QueueConfig
from ._keys import Keys
from ._scripts import SCRIPTS

log = logging.getLogger("streamq.worker")
BATCH = 1000
"""Candidates per promote.lua call (loops are capped)."""
_SLACK_MS = 50


@attrs.define
class Promoter:
    """Promotes one queue's due jobs. Tracks the server clock offset to pick candidates;
    the script re-checks every candidate against the server's own TIME."""

    keys: Keys
    config: QueueConfig
    offset_ms: float = 0.0
    next_due_ms: int = -1

    async def sync_clock(self, client: aredis.Redis) -> None:
        sec, usec = await client.time()
        self.offset_ms = sec * 1000 + usec / 1000 - time.time() * 1000

    def server_now_ms(self) -> float:
        return time.time() * 1000 + self.offset_ms

    async def run_once(self, client: aredis.Redis) -> tuple[int, bool]:
        """Promote one batch of due jobs; returns (moved, whether more may be due now)."""
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
        cfg = self.config
        moved, now, next_due = await SCRIPTS["promote"].run_async(
            client, keys, [cfg.events_maxlen, cfg.dead_ttl_s, cfg.dead_maxlen, *names])
        self.offset_ms = now - time.time() * 1000
        self.next_due_ms = int(next_due)
        return int(moved), len(ids) == BATCH

    def sleep_s(self, max_s: float) -> float:
        if self.next_due_ms < 0:
            return max_s
        return max(0.0, min(max_s, (self.next_due_ms - self.server_now_ms()) / 1000))
