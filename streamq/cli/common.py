"""What the CLI's commands share: the command context (``Ctx``: arguments, admin client, the
queue check, output and confirmation), tables, JSON-ready values, durations, URL redaction."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import attrs

from .._core.config import QueueConfig
from .._core.driver import drive
from .._core.errors import InvalidArgument
from .._core.keys import Keys, shard_keys
from .._ops import operations as _ops
from .._ops import shards as _shards
from .._ops.queues import check_queue
from ..admin import Admin


def _plain(obj: Any) -> Any:
    if attrs.has(type(obj)):
        return {k: _plain(v) for k, v in attrs.asdict(obj, recurse=False).items()}
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, dt.datetime):
        return obj.isoformat()
    if isinstance(obj, bytes):
        return obj.decode(errors="replace")
    return obj


def _table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    if not rows:
        return "(none)"
    cells = [[("" if r.get(c) is None else str(r.get(c))) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def _duration(text: str) -> float:
    """'90', '90s', '5m', '2h', '1d' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    t = text.strip().lower()
    try:
        if t and t[-1] in units:
            return float(t[:-1]) * units[t[-1]]
        return float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 90s, 5m, 2h)") from None


def redact(url: str) -> str:
    """The URL without its password (user info or a ?password= query parameter)."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if parts.password:
        netloc = netloc.replace(f":{parts.password}@", ":***@")
    query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


class Ctx:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.config = QueueConfig(key_prefix=args.prefix, shards=args.shards,
                                  group_concurrency=args.group_concurrency)
        self.admin = Admin.from_url(args.url, self.config, socket_timeout_s=15.0)
        self.admin.check_server()

    def queue(self, name: str) -> str:
        """The queue named on the command line, refused (with "did you mean ...") when none
        of its keys exist: every command fails the same way on a typo."""
        keys = Keys(name, self.config.key_prefix)
        if self.config.shards == 1:
            check_queue(self.admin.client, keys)
        elif not drive(self.admin.client, _shards.exists(shard_keys(
                name, self.config.shards, self.config.key_prefix))):
            raise _ops.unknown_queue(keys, self.admin.queues())
        return name

    @property
    def shard(self) -> int | None:
        """--shard: one shard of a sharded queue (None: the whole queue)."""
        value: int | None = getattr(self.args, "shard", None)
        return value

    def out(self, data: Any, human: Callable[[], str]) -> None:
        if self.args.json:
            print(json.dumps(_plain(data), indent=2, default=str))
        else:
            print(human())

    def confirm(self, what: str) -> None:
        if self.args.yes:
            return
        if not sys.stdin.isatty():
            raise InvalidArgument(f"refusing to {what} without --yes (not a terminal)")
        answer = input(f"{what}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            raise SystemExit("aborted")
