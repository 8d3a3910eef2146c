"""The workflow relay and repair sweep of one queue shard (docs/workflows.md), run by every
worker's housekeeping and by the scheduler daemon (no process of its own): outbox messages
(resolves for waiting jobs in other slots) are applied in capped batches, and every
``REPAIR_EVERY_S`` the shard's oldest waiting jobs are checked. Several relays on one shard
are harmless: a resolve applied twice is a no-op (SREM of a set).

A worker's relay (``wait_ms`` > 0) does not sleep between steps when the outbox is drained:
it waits in blocking ``XREAD`` calls on the outbox, after the last entry it read, for at most
the interval (each read at most ``wait_ms``, under the client's socket timeout), so a message
written by a finishing child is applied at once (one step per interval when idle, as with
the sleep). The entries such a read brings are applied at once (resolve.lua, then deleted),
without reading them again; the next step reads what is left. A message whose resolve failed
is tried once more by that step, then not again until the next interval (the read waits
after it). The scheduler daemon, which steps every shard's relay in one loop,
keeps the sleep."""

from __future__ import annotations

import time
from typing import Any

from .._core.driver import adrive
from .._core.flow import RELAY_BATCH, relay, relay_read, repair
from .._core.keys import Keys
from .._core.sends import xread_wait

REPAIR_EVERY_S = 30.0
"""How often a relay sweeps its shard's waiting jobs."""
REPAIR_MIN_AGE_MS = 60_000
"""A waiting job younger than this is left to its producer (it may still be linking)."""


class Relay:
    """One shard's relay; ``step`` is a supervised loop's step (errors are the loop's)."""

    def __init__(self, keys: Keys, repair_every_s: float = REPAIR_EVERY_S,
                 repair_min_age_ms: int = REPAIR_MIN_AGE_MS, wait_ms: int = 0) -> None:
        self.keys = keys
        self.wait_ms = wait_ms
        """When > 0: wait for the next outbox entry in blocking reads of at most this long
        instead of sleeping (a worker's relay: its fetch loop's ``block_ms``)."""
        self.repair_every_s = repair_every_s
        self.repair_min_age_ms = repair_min_age_ms
        self.relayed = 0
        self.repaired = 0
        self._cursors: dict[str, int] = {}
        self._last_repair = 0.0

    async def step(self, client: Any, every_s: float) -> float:
        """Apply up to one batch of outbox messages, and sweep when due; returns the sleep
        before the next step (0 when the outbox may hold more)."""
        n, more, last = await adrive(client, relay(self.keys))
        self.relayed += n
        now = time.monotonic()
        if now - self._last_repair >= self.repair_every_s:
            self._last_repair = now
            _checked, changed = await adrive(client, repair(
                self.keys, None, self.repair_min_age_ms, self._cursors))
            self.repaired += changed
        if more:
            return 0.0
        if self.wait_ms <= 0:
            return every_s
        # idle: wake on the next entry (one written since the XRANGE included), or after the
        # interval, in reads of at most wait_ms (under the client's socket timeout)
        end = time.monotonic() + every_s
        while (left := end - time.monotonic()) > 0:
            got = await xread_wait(client, self.keys.outbox, last,
                                   max(1, min(self.wait_ms, int(left * 1000))), RELAY_BATCH)
            if got:  # applied at once (no XRANGE first); the next step reads what is left
                self.relayed += await adrive(client, relay_read(self.keys, got))
                break
        return 0.0
