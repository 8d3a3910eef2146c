"""``streamq groups``: list a queue's groups (waiting, in flight, limit, rate, paused) and change
a group's limit, rate or pause state at run time (docs/fairness.md, docs/operations.md)."""

from __future__ import annotations

import argparse
from typing import Any

from .._core.config import GroupRate
from .._core.errors import InvalidArgument
from .common import Ctx, _duration, _plain, _table
from .hints import page_limit

_COLUMNS = ["group", "waiting", "in_flight", "limit", "rate", "paused", "parked_ms"]


def _rate_text(rate: GroupRate | None) -> str:
    return "" if rate is None else f"{rate.limit}/{rate.period_s:g}s"


def parse_rate(text: str) -> GroupRate | None:
    """'10/1s', '5/2m', '100/1h' or '10' (per second); 'default' -> None."""
    if text == "default":
        return None
    n, _, per = text.partition("/")
    try:
        return GroupRate(int(n), _duration(per) if per else 1.0)
    except (ValueError, argparse.ArgumentTypeError):
        raise InvalidArgument(f"rate must be N/PERIOD (e.g. 10/1s) or 'default', got {text!r}"
                              ) from None


def cmd_groups(ctx: Ctx) -> None:
    a = ctx.args
    queue = ctx.queue(a.queue)
    admin = ctx.admin
    if a.action in ("show", "limit", "rate", "pause", "resume") and not a.group:
        raise InvalidArgument(f"groups {a.action} needs a group name")
    if a.action == "limit":
        if a.value is None:
            raise InvalidArgument("groups limit needs a value: N or 'default'")
        admin.set_group_limit(queue, a.group, None if a.value == "default" else int(a.value))
    elif a.action == "rate":
        if a.value is None:
            raise InvalidArgument("groups rate needs a value: N/PERIOD or 'default'")
        admin.set_group_rate(queue, a.group, parse_rate(a.value))
    elif a.action == "pause":
        admin.pause_group(queue, a.group)
    elif a.action == "resume":
        admin.resume_group(queue, a.group)
    if a.action != "list":
        info = admin.group(queue, a.group)
        row = {**_plain(info), "rate": _rate_text(info.rate)}
        ctx.out(info, lambda: _table([row], _COLUMNS))
        return
    page = admin.groups(queue, cursor=a.cursor, limit=a.limit, shard=ctx.shard)
    rows: list[dict[str, Any]] = [{**_plain(g), "rate": _rate_text(g.rate)}
                                  for g in page.items]
    ctx.out(page, lambda: _table(rows, _COLUMNS)
            + (f"\nmore: --cursor {page.cursor}" if page.cursor else ""))


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("groups", parents=[common],
                       help="groups of a queue: list, show, limit, rate, pause, resume")
    p.add_argument("queue")
    p.add_argument("action", nargs="?", default="list",
                   choices=["list", "show", "limit", "rate", "pause", "resume"])
    p.add_argument("group", nargs="?")
    p.add_argument("value", nargs="?", help="limit: N | default; rate: N/PERIOD | default")
    p.add_argument("--limit", type=page_limit, default=100,
                   help="list: groups per page (<= 1000)")
    p.add_argument("--cursor", help="list: the page after this group name")
    p.add_argument("--shard", type=int, default=None, metavar="I",
                   help="list: only shard I of a sharded queue")
