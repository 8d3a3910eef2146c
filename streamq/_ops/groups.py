"""Group operations (docs/fairness.md#groups): listing with counts, limits, rates, pause.

Sans-IO generators like ``operations.py``. A sharded queue keeps its group state per shard
(a group's limit and rate apply per shard): listing sums a group's counts over the shards,
and every setting is written to every shard.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from .._core.config import GroupRate, QueueConfig
from .._core.driver import Call, Cmd, Op, _s, ok
from .._core.errors import InvalidArgument
from .._core.keys import Keys, check_group
from .operations import PAGE


@attrs.frozen
class GroupInfo:
    group: str
    waiting: int
    """Ready jobs waiting for a slot of the group (not yet in the stream)."""
    in_flight: int
    """Jobs holding a slot: admitted to the stream (not yet started) or running."""
    limit: int
    """The group's in-flight limit (per shard of a sharded queue)."""
    limit_overridden: bool
    rate: GroupRate | None
    """The group's start rate (per shard), None when unlimited."""
    paused: bool
    parked_ms: int
    """How long its rate holds it back from now, 0 when it does not."""


@attrs.frozen
class GroupPage:
    items: list[GroupInfo]
    cursor: str | None
    """Pass it back for the next page (group names sort in byte order); None at the end."""


def _rate(raw: bytes | None, default: GroupRate | None) -> GroupRate | None:
    if raw is None:
        return default
    n, _, p = _s(raw).partition(" ")
    if not n.isdigit() or not p.isdigit() or int(n) == 0:
        return None
    return GroupRate(int(n), int(p) / 1000)


def _range(g: str) -> tuple[str, str]:
    return f"[{g} ", f"({g}!"


def groups(parts: Sequence[Keys], cfg: QueueConfig, *, cursor: str | None = None,
           limit: int = 100) -> Op[GroupPage]:
    """Groups that have waiting or in-flight jobs, in name order, ``limit`` (<= 1000) a page;
    one ZRANGE BYLEX per shard and a pipelined read per group: no scan of the keyspace."""
    limit = max(1, min(limit, PAGE))
    start = f"({cursor}" if cursor else "-"
    step = yield [Cmd.of("ZRANGE", k.group_index, start, "+", "BYLEX", "LIMIT", 0, limit + 1)
                  for k in parts]
    names = sorted({_s(n) for reply in step for n in ok(reply)})
    more = len(names) > limit
    names = names[:limit]
    if not names:
        return GroupPage([], None)
    items = yield from _infos(parts, cfg, names)
    return GroupPage(items, names[-1] if more else None)


def group(parts: Sequence[Keys], cfg: QueueConfig, name: str) -> Op[GroupInfo]:
    """One group, listed or not (an empty group shows zero counts and its settings)."""
    check_group(name)
    (info,) = yield from _infos(parts, cfg, [name])
    return info


def _infos(parts: Sequence[Keys], cfg: QueueConfig, names: list[str]) -> Op[list[GroupInfo]]:
    cmds: list[Cmd | Call] = [Cmd.of("TIME")]
    for k in parts:
        for g in names:
            lo, hi = _range(g)
            cmds += [Cmd.of("ZLEXCOUNT", k.group_wait, lo, hi),
                     Cmd.of("ZLEXCOUNT", k.group_inflight, lo, hi),
                     Cmd.of("HMGET", k.group_config, f"l:{g}", f"p:{g}", f"r:{g}"),
                     Cmd.of("ZSCORE", k.group_parked, g)]
    r = yield cmds
    t = ok(r[0])
    now = int(t[0]) * 1000 + int(t[1]) // 1000
    out: list[GroupInfo] = []
    for gi, g in enumerate(names):
        waiting = in_flight = parked = 0
        lim_raw: bytes | None = None
        rate_raw: bytes | None = None
        paused = False
        for si in range(len(parts)):
            at = 1 + 4 * (si * len(names) + gi)
            waiting += int(ok(r[at]))
            in_flight += int(ok(r[at + 1]))
            lim, p, rt = ok(r[at + 2])
            lim_raw = lim_raw or lim
            paused = paused or p is not None
            rate_raw = rate_raw or rt
            pk = ok(r[at + 3])
            if pk is not None:
                parked = max(parked, int(float(pk)) - now)
        out.append(GroupInfo(g, waiting, in_flight, int(lim_raw) if lim_raw else
                             cfg.group_concurrency, lim_raw is not None,
                             _rate(rate_raw, cfg.group_rate), paused, max(0, parked)))
    return out


def set_group(parts: Sequence[Keys], cfg: QueueConfig, op: str, name: str, value: str
              ) -> Op[tuple[int, int, int]]:
    """group.lua on every shard: (in flight, waiting, admitted now), summed."""
    check_group(name)
    step = yield [Call("group", [k.stream, *k.group_keys], [cfg.group_arg, op, name, value])
                  for k in parts]
    total = [0, 0, 0]
    for reply in step:
        for i, v in enumerate(ok(reply)):
            total[i] += int(v)
    return total[0], total[1], total[2]


def limit_arg(limit: int | None) -> str:
    if limit is None:
        return ""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= 1_000_000:
        raise InvalidArgument(f"group limit must be an integer 1..1000000, got {limit!r}")
    return str(limit)


def rate_arg(rate: GroupRate | None) -> str:
    if rate is None:
        return ""
    if not isinstance(rate, GroupRate):
        raise InvalidArgument(f"rate must be a GroupRate or None, got {rate!r}")
    return rate.arg
