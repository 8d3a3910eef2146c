"""Group upkeep, one per queue shard (docs/fairness.md): unpark groups whose rate held them
back (soon after their time comes), and reconcile slots (heal drift) every
``WorkerConfig.group_reconcile_interval_s``. Both are scripts that are safe to repeat and to
run from any number of workers at once; each step reads at most a page of 1,000 members."""

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
PAGE = 1000
BUSY_S = 2.0
BUSY_POLL_S = 0.05
"""After unparking (or seeing parked groups or limiter times ahead), the loop looks again at
least every BUSY_POLL_S for BUSY_S: the admitted jobs' starts set the next times to wake for."""
MIN_SLEEP_S = 0.01
"""Shortest pause between two unpark calls (many rate-limited groups whose times are close
together are taken in one call)."""
RECONCILE_PAGES = 10
"""Pages (of PAGE members or groups) one reconcile round reads at most; the next round
goes on from there."""


@attrs.define
class GroupKeeper:
    keys: Keys
    config: QueueConfig
    reconcile_every_s: float
    next_reconcile: float = 0.0
    fl_cursor: str = "-"
    idx_cursor: str = "-"
    busy_until: float = 0.0
    healed: int = 0
    """Slots the reconcile step found leaked and freed (a counter for tests and logs)."""

    async def unpark(self, client: aredis.Redis, max_sleep_s: float) -> float:
        """Admit groups whose rate time came; returns how long to sleep."""
        k = self.keys
        admitted, now, next_at = await SCRIPTS["unpark"].run_async(
            client, [k.stream, *k.group_keys], [self.config.group_arg, PAGE])
        mono = time.monotonic()
        if int(admitted) > 0 or int(next_at) >= 0:
            self.busy_until = mono + BUSY_S  # rate-limited groups at work: look often
        if int(next_at) < 0:
            # a job just admitted sets its group's next limiter time when it starts, which
            # this call could not see yet: look again soon while groups are busy
            return min(max_sleep_s, BUSY_POLL_S) if mono < self.busy_until else max_sleep_s
        return max(MIN_SLEEP_S, min(max_sleep_s, (int(next_at) - int(now)) / 1000))

    async def step(self, client: aredis.Redis, max_sleep_s: float) -> float:
        if time.monotonic() >= self.next_reconcile:
            await self.reconcile(client)
            self.next_reconcile = time.monotonic() + self.reconcile_every_s
        return await self.unpark(client, max_sleep_s)

    async def reconcile(self, client: aredis.Redis, pages: int = RECONCILE_PAGES) -> int:
        """Check up to ``pages`` pages of in-flight members against their records, then
        refill (or forget) up to ``pages`` pages of listed groups. Returns slots healed."""
        k = self.keys
        healed = 0
        for _ in range(pages):
            raw: Any = await client.zrange(k.group_inflight, self.fl_cursor, "+", bylex=True,
                                           offset=0, num=PAGE)
            members = [m.decode() for m in raw]
            if members:
                jobs = [k.job(m.partition(" ")[2] or "-") for m in members]
                h, _adm = await SCRIPTS["reconcile"].run_async(
                    client, [k.stream, *k.group_keys, *jobs],
                    [self.config.group_arg, len(members), *members])
                healed += int(h)
            if len(members) < PAGE:
                self.fl_cursor = "-"
                break
            self.fl_cursor = f"({members[-1]}"
        for _ in range(pages):
            raw = await client.zrange(k.group_index, self.idx_cursor, "+", bylex=True,
                                      offset=0, num=PAGE)
            names = [g.decode() for g in raw]
            if names:
                await SCRIPTS["reconcile"].run_async(
                    client, [k.stream, *k.group_keys], [self.config.group_arg, 0, *names])
            if len(names) < PAGE:
                self.idx_cursor = "-"
                break
            self.idx_cursor = f"({names[-1]}"
        if healed:
            log.warning("reconciled groups of %s: %d leaked slots freed", k.tag, healed)
        self.healed += healed
        return healed
