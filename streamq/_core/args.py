"""Checks of arguments that are easy to get wrong, refused where they are written."""

from __future__ import annotations

import datetime as dt
import math
from typing import Any

from .errors import InvalidArgument

MAX_SECONDS = 100 * 365 * 24 * 3600
"""Longest delay, relative deadline or result TTL (100 years): beyond it a due time no longer
fits a datetime or an exact Lua number, and Redis's EXPIRE refuses the TTL."""


def check_queue_list(queues: Any, where: str = "Worker") -> None:
    """A list of queue names, not one name: ``Worker(url, "emails", ...)`` would otherwise
    iterate the string and serve the queues ``e``, ``m``, ``a``, ``i``, ``l``, ``s``."""
    if isinstance(queues, str | bytes):
        raise InvalidArgument(
            f"{where} takes a list of queue names, got the string {queues!r}:"
            f" write {where}(url, [{queues!r}], registry)")
    if not hasattr(queues, "__iter__"):
        raise InvalidArgument(
            f"{where} takes a list of queue names, got {type(queues).__name__} {queues!r}")


def seconds(name: str, v: Any, *, allow_zero: bool) -> float:
    if isinstance(v, dt.timedelta):
        v = v.total_seconds()
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidArgument(f"{name} must be a finite number of seconds, got {v!r}")
    if v < 0 or (v == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgument(f"{name} must be {bound} seconds, got {v!r}")
    if v > MAX_SECONDS:
        raise InvalidArgument(f"{name} must be at most {MAX_SECONDS} seconds (100 years),"
                              f" got {v!r}")
    return float(v)
