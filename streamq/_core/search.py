"""The write side of job search (docs/search.md): which index sets an enqueue call adds its
jobs to (enqueue.lua's search section), and the declaration a producer stores with the queue.

Only a queue whose ``QueueConfig.search`` is set writes any of it; the read side is
``streamq/_ops/search.py``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .config import QueueConfig, SearchConfig
from .driver import Cmd, Op, ok
from .errors import SerializationError
from .keys import Keys

if TYPE_CHECKING:
    from .scripts import Arg

DECL_FIELDS = "fields"
DECL_SINCE = "since"


def retention_ms(cfg: QueueConfig) -> int:
    sc = cfg.search
    seconds = cfg.dead_ttl_s if sc is None or sc.retention_s is None else sc.retention_s
    return seconds * 1000


def field_value(payload: Any, path: str) -> str | None:
    """The indexed text of a declared field in a payload: a string as is, an int or float
    in JSON form, ``true``/``false``; None for a missing field, null, a container or a value
    longer than ``SearchConfig.MAX_VALUE_BYTES`` (not indexed)."""
    cur = payload
    for part in path.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    if isinstance(cur, bool):
        text = "true" if cur else "false"
    elif isinstance(cur, str):
        text = cur
    elif isinstance(cur, (int, float)):
        text = json.dumps(cur)
    else:
        return None
    if not text or len(text.encode()) > SearchConfig.MAX_VALUE_BYTES:
        return None
    return text


def parts(keys: Keys, cfg: QueueConfig, batch: Sequence[Any]) -> tuple[list[str], list[Arg]]:
    """The search section of a script call for ``batch`` (Prepared jobs of one shard): the
    index keys, and the retention with each index's spec (_lib.lua's ix_write)."""
    sc = cfg.search
    assert sc is not None
    by: dict[str, list[int]] = {}  # index key -> job indexes (1-based), in first-seen order
    every = " ".join(str(i) for i in range(1, len(batch) + 1))
    for i, p in enumerate(batch, 1):
        body: bytes = p.args[2]
        jtype, _, data = body.partition(b" ")
        t = jtype.decode()
        by.setdefault(keys.ix_type(t), []).append(i)
        if p.group:
            by.setdefault(keys.ix_group(p.group), []).append(i)
        names = sc.fields.get(t)
        if names:
            try:
                payload = cfg.serde.loads(data)
            except SerializationError:  # (it was just serialised by this serde)
                continue
            for name in names:
                v = field_value(payload, name)
                if v is not None:
                    by.setdefault(keys.ix_field(t, name, v), []).append(i)
    args: list[Arg] = [retention_ms(cfg), f"A {every}", f"L {every}",
                       *(f"T {' '.join(map(str, ix))}" for ix in by.values())]
    return [keys.ix_all, keys.ix_ids, *by], args


def section(keys: Keys, cfg: QueueConfig, batch: Sequence[Any], k: list[str],
            args: list[Arg]) -> None:
    """Append enqueue.lua's search section for ``batch`` (Prepared jobs of one shard) and
    turn its ARGV[4] into 'N:D:S' (its header)."""
    ks, more = parts(keys, cfg, batch)
    k.extend(ks)
    args.extend(more)
    n = args[3]
    head = n if isinstance(n, str) else f"{len(batch)}:0"
    args[3] = f"{head}:{len(ks)}"


def declare(keys: Keys, cfg: QueueConfig) -> Op[None]:
    """Store the queue's declared search fields (``Admin.find`` checks a field filter
    against them) and, once, when its index starts. Safe to repeat."""
    sc = cfg.search
    if sc is None:
        return
    k0 = keys.of_shard(0)
    fields = json.dumps({t: list(v) for t, v in sorted(sc.fields.items())}, sort_keys=True)
    (t,) = yield [Cmd.of("TIME")]
    sec, usec = ok(t)
    now = int(sec) * 1000 + int(usec) // 1000
    replies = yield [Cmd.of("HSET", k0.ix_decl, DECL_FIELDS, fields),
                     Cmd.of("HSETNX", k0.ix_decl, DECL_SINCE, now)]
    for r in replies:
        ok(r)
