"""Cron entries: a cron expression or a fixed interval, firing jobs onto a queue."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from streamq import InvalidArgument, QueueConfig
from streamq._core.keys import Keys, check_job_id, check_queue_name
from streamq._producer import prepare as prod

from ._cron import CronExpr, prev_at_or_before

UTC = dt.UTC
CatchUp = Literal["once", "skip"]


def _ms(t: dt.datetime) -> int:
    return int(t.timestamp() * 1000)


@attrs.frozen
class Cron:
    """A periodic job. ``Cron("reports.daily", "0 6 * * *", job_type=..., queue=..., tz=...)``
    or ``Cron("cache.refresh", every=30, job_type=..., queue=...)`` (seconds).

    ``catch_up`` decides what happens to ticks missed while no scheduler ran: ``"once"``
    fires the latest missed tick once; ``"skip"`` fires nothing until the next tick. Never a
    burst of every missed tick.
    """

    name: str
    expr: str | None = None
    every: float | None = None
    job_type: str = ""
    payload: Any = None
    queue: str = "default"
    tz: str = "UTC"
    catch_up: CatchUp = "once"
    job_options: Mapping[str, Any] = attrs.field(factory=dict)
    """Extra enqueue options for each fired job (max_attempts, result_ttl, deadline, ...)."""
    cron: CronExpr | None = attrs.field(init=False, default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        try:
            check_job_id(self.name)
        except InvalidArgument as exc:
            raise InvalidArgument(f"cron entry name: {exc}") from None
        check_queue_name(self.queue)
        if not self.job_type:
            raise InvalidArgument(f"cron entry {self.name!r} needs a job_type")
        if (self.expr is None) == (self.every is None):
            raise InvalidArgument(f"cron entry {self.name!r}: give a cron expression or"
                                  " every=seconds, not both")
        if self.every is not None:
            if (isinstance(self.every, bool) or not isinstance(self.every, (int, float))
                    or not math.isfinite(self.every) or self.every < 1):
                raise InvalidArgument(f"cron entry {self.name!r}: every must be >= 1 second")
        else:
            object.__setattr__(self, "cron", CronExpr(self.expr or "", self.tz))
        if self.catch_up not in ("once", "skip"):
            raise InvalidArgument(f"cron entry {self.name!r}: catch_up is 'once' or 'skip'")
        if "job_id" in self.job_options:
            raise InvalidArgument(f"cron entry {self.name!r}: job ids are made per tick;"
                                  " job_options may not set job_id")
        try:  # build one job now, so a bad entry fails here and not at its first tick
            self.prepare(Keys(self.queue), QueueConfig(), 10**13)
        except (InvalidArgument, TypeError) as exc:
            raise InvalidArgument(f"cron entry {self.name!r}: {exc}") from None

    def prepare(self, keys: Keys, config: QueueConfig, tick_ms: int) -> prod.Prepared:
        """The job this entry enqueues for one tick."""
        options = dict(self.job_options)
        headers = {"cron": self.name, "tick": str(tick_ms), **options.pop("headers", {})}
        return prod.prepare(keys, config, self.job_type, self.payload,
                            job_id=self.job_id(tick_ms), headers=headers, **options)

    def next_after(self, t_ms: int) -> int:
        """The first tick strictly after t_ms (ms since the epoch)."""
        if self.every is not None:
            step = int(self.every * 1000)
            return (t_ms // step + 1) * step
        assert self.cron is not None
        return _ms(self.cron.next_after(dt.datetime.fromtimestamp(t_ms / 1000, UTC)))

    def latest_at_or_before(self, t_ms: int) -> int | None:
        if self.every is not None:
            step = int(self.every * 1000)
            return (t_ms // step) * step
        assert self.cron is not None
        prev = prev_at_or_before(self.cron, dt.datetime.fromtimestamp(t_ms / 1000, UTC))
        return None if prev is None else _ms(prev)

    def job_id(self, tick_ms: int) -> str:
        """Deterministic per (name, tick): a second firing of a tick is a duplicate."""
        return f"cron:{self.name}:{tick_ms // 1000}"

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "expr": self.expr, "every": self.every, "tz": self.tz,
                "job_type": self.job_type, "queue": self.queue, "catch_up": self.catch_up}
