"""``streamq find``: job search over every queue and shard (docs/search.md)."""

from __future__ import annotations

import argparse
import datetime as dt
import time
from typing import Any

from .common import Ctx, _duration, _plain, _table
from .hints import page_limit


def when_ms(text: str) -> int:
    """A time on the command line: epoch ms, an ISO 8601 date/time (UTC unless it says), or a
    duration meaning that long ago ('15m', '2h', '1d')."""
    t = text.strip()
    if t.isdigit() and len(t) >= 10:
        return int(t)
    try:
        d = dt.datetime.fromisoformat(t)
    except ValueError:
        try:
            return int((time.time() - _duration(t)) * 1000)
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"not a time: {text!r} (epoch ms, 2026-11-29T07:00, or 15m/2h/1d ago)") from None
    if d.tzinfo is None:
        d = d.replace(tzinfo=dt.UTC)
    return int(d.timestamp() * 1000)


def field_arg(text: str) -> tuple[str, str]:
    name, eq, value = text.partition("=")
    if not eq or not name or not value:
        raise argparse.ArgumentTypeError(f"--field takes name=value, got {text!r}")
    return name, value


def cmd_find(ctx: Ctx) -> None:
    a = ctx.args
    if a.queue:
        ctx.queue(a.queue)
    prefix = a.id if a.id and a.id.endswith("*") else None
    page = ctx.admin.find(
            a.queue, id=None if prefix or not a.id else a.id,
        id_prefix=prefix.rstrip("*") if prefix else None, type=a.type, state=a.state,
        group=a.group, error=a.error, error_type=a.error_type, since_ms=a.since,
        until_ms=a.until, fields=dict(a.field or ()), limit=a.limit, cursor=a.cursor,
        max_scan=a.max_scan)
    data: dict[str, Any] = {"items": [_plain(h) for h in page.items], "cursor": page.cursor,
                            "scanned": page.scanned, "bound_hit": page.bound_hit,
                            "source": page.source, "index_since_ms": page.index_since_ms}

    def human() -> str:
        rows = [{**_plain(h), "at": dt.datetime.fromtimestamp(h.at_ms / 1000, dt.UTC).strftime(
            "%Y-%m-%d %H:%M:%S")} for h in page.items]
        lines = [_table(rows, ["queue", "job_id", "type", "state", "group", "at", "error"])
                 if rows else "no job matches"]
        lines.append(f"({page.scanned} checked via the {page.source} index"
                     + ("; stopped at the scan bound: more may match" if page.bound_hit else "")
                     + ")")
        unindexed = sorted(q for q, s in page.index_since_ms.items() if s is None)
        if unindexed and page.source not in ("id", "dead"):
            lines.append(f"not indexed (QueueConfig(search=...) off; an exact --id still"
                         f" finds their jobs): {', '.join(unindexed)}")
        if page.cursor:
            lines.append(f"more: --cursor {page.cursor}")
        return "\n".join(lines)

    ctx.out(data, human)


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("find", parents=[common],
                       help="search jobs by id, prefix, type, state, group, error, time, field")
    p.add_argument("--queue", help="one queue (default: every known queue)")
    p.add_argument("--id", help="an exact job id, or a prefix ending in * (abc*)")
    p.add_argument("--type", help="job type")
    p.add_argument("--state", help="waiting, scheduled, queued, active, retrying, completed,"
                   " failed, cancelled")
    p.add_argument("--group", help="the job's group")
    p.add_argument("--error", help="text in the error (case-insensitive; dead letters)")
    p.add_argument("--error-type", help="the error class, e.g. TimeoutError")
    p.add_argument("--since", type=when_ms, help="enqueued at or after: epoch ms, ISO time,"
                   " or a duration ago (15m)")
    p.add_argument("--until", type=when_ms, help="enqueued at or before (same forms)")
    p.add_argument("--field", type=field_arg, action="append",
                   help="declared payload field: name=value (repeatable)")
    p.add_argument("--limit", type=page_limit, default=50, help="items per page (<= 1000)")
    p.add_argument("--cursor")
    p.add_argument("--max-scan", type=int, default=10_000,
                   help="candidates to check at most before answering (default 10000)")
