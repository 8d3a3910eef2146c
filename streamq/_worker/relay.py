"""The workflow relay and repair sweep of one queue shard (docs/workflows.md), run by every
worker's housekeeping and by the scheduler daemon (no process of its own): outbox messages
(resolves for waiting jobs in other slots) are applied in capped batches, and every
``REPAIR_EVERY_S`` the shard's oldest waiting jobs are checked. Several relays on one shard
are harmless: a resolve applied twice is a no-op (SREM of a set)."""

from __future__ import annotations

import time
from typing import Any

from .._core.driver import adrive
from .._core.flow import relay, repair
from .._core.keys import Keys

REPAIR_EVERY_S = 30.0
"""How often a relay sweeps its shard's waiting jobs."""
REPAIR_MIN_AGE_MS = 60_000
"""A waiting job younger than this is left to its producer (it may still be linking)."""


class Relay:
    """One shard's relay; ``step`` is a supervised loop's step (errors are the loop's)."""

    def __init__(self, keys: Keys, repair_every_s: float = REPAIR_EVERY_S,
                 repair_min_age_ms: int = REPAIR_MIN_AGE_MS) -> None:
        self.keys = keys
        self.repair_every_s = repair_every_s
        self.repair_min_age_ms = repair_min_age_ms
        self.relayed = 0
        self.repaired = 0
        self._cursors: dict[str, int] = {}
        self._last_repair = 0.0

    async def step(self, client: Any, every_s: float) -> float:
        """Apply up to one batch of outbox messages, and sweep when due; returns the sleep
        before the next step (0 when the outbox may hold more)."""
        n, more = await adrive(client, relay(self.keys))
        self.relayed += n
        now = time.monotonic()
        if now - self._last_repair >= self.repair_every_s:
            self._last_repair = now
            _checked, changed = await adrive(client, repair(
                self.keys, None, self.repair_min_age_ms, self._cursors))
            self.repaired += changed
        return 0.0 if more else every_s
