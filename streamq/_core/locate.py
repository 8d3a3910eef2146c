"""Finding a job's shard by its id across reshards (docs/scaling.md, "Calls by id during
and after a reshard").

Jobs and records are never moved: a record stays in the shard it was written to until it
expires, so a job written before a reshard is in one of ``Layout.homes(id)`` (its current
home first, then its homes under the earlier counts in ``layout.prev``). While a reshard is
begun and not yet published (``layout.next``), a job routed by the new count may already sit
in its home under that count: it is looked at last.

``locate`` answers the keys of the shard that holds a job: one home -> that shard, with no
I/O (the operation returns without yielding a step: an id that did not move costs nothing);
several -> an EXISTS of the job record in each, in one pipelined step (on a cluster the
driver splits it per node), and the first found in ``homes`` order wins; none found -> the
current home (where a job with that id would be written now). ``locate_many`` and
``locate_refs`` do the same for many ids (of one queue, of several), in one step.

A record found stays where it is (nothing moves it), so the answer stays true for as long as
the record lives; a caller that finds nothing and holds a layout that may be stale reads the
layout again (``read_layouts``) before it says "not found".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from redis.exceptions import ResponseError

from .driver import Cmd, Op, ok
from .keys import DEFAULT_PRIORITY, Keys, shard_of
from .shards import LAYOUT_FIELDS, Layout, parse, read


def homes(layout: Layout, job_id: str) -> tuple[int, ...]:
    """The shards a record of ``job_id`` may be in, in the order they are looked at:
    ``layout.homes(job_id)``, then its home under a reshard begun (``layout.next``)."""
    out = layout.homes(job_id)
    if layout.next is not None:
        s = shard_of(job_id, layout.next)
        if s not in out:
            out = (*out, s)
    return out


def span(layout: Layout) -> int:
    """How many shards (0 .. span-1) may hold records or live work: the shards a search over
    every shard of the queue reads."""
    return max(layout.read, *layout.prev) if layout.prev else layout.read


def _keys_of(keys: Keys, shard: int) -> Keys:
    return keys if keys.shard == shard and keys.level == DEFAULT_PRIORITY else keys.of_shard(
        shard)


def locate(keys: Keys, layout: Layout, job_id: str) -> Op[Keys]:
    """The keys of the shard that holds ``job_id`` (see the module docstring). ``keys``: any
    key set of the queue."""
    hs = homes(layout, job_id)
    if len(hs) == 1:
        return _keys_of(keys, hs[0])
    found = yield [Cmd.of("EXISTS", keys.of_shard(s).job(job_id)) for s in hs]
    for s, v in zip(hs, found, strict=True):
        if ok(v):
            return _keys_of(keys, s)
    return _keys_of(keys, hs[0])


def locate_refs(prefix: str, layouts: Mapping[str, Layout],
                refs: Sequence[tuple[str, str]]) -> Op[list[int]]:
    """The shard that holds each (queue, job id) of ``refs`` (``layouts``: each queue's), in
    one step for every id that may have moved; none for ids that did not."""
    hs = [homes(layouts[q], jid) for q, jid in refs]
    out = [h[0] for h in hs]
    ask = [(i, s) for i, h in enumerate(hs) if len(h) > 1 for s in h]
    if not ask:
        return out
    found = yield [Cmd.of("EXISTS", Keys(refs[i][0], prefix, s).job(refs[i][1]))
                   for i, s in ask]
    done: set[int] = set()
    for (i, s), v in zip(ask, found, strict=True):
        if i not in done and ok(v):
            out[i] = s
            done.add(i)
    return out


def locate_many(keys: Keys, layout: Layout, job_ids: Sequence[str]) -> Op[list[Keys]]:
    """``locate`` for many ids of one queue: each one's shard keys, in one step at most."""
    shards = yield from locate_refs(keys.prefix, {keys.queue: layout},
                                    [(keys.queue, j) for j in job_ids])
    return [_keys_of(keys, s) for s in shards]


def read_layouts(prefix: str, queues: Iterable[str],
                 known: Mapping[str, Layout] | None = None,
                 counts: Mapping[str, int] | None = None) -> Op[dict[str, Layout]]:
    """The stored layout of each queue not in ``known`` (one HMGET each, in one step; a queue
    without a stored count has ``counts[queue]`` shards, else 1), with ``known`` added."""
    out = dict(known or {})
    ask = sorted({q for q in queues if q not in out})
    if ask:
        got = yield [Cmd.of("HMGET", Keys(q, prefix).meta, *LAYOUT_FIELDS) for q in ask]
        for q, v in zip(ask, got, strict=True):
            r = ok(v)
            out[q] = Layout((counts or {}).get(q, 1)) if r[0] is None else parse(r)
    return out


def read_record(keys: Keys, layout: Layout, job_id: str
                ) -> Op[tuple[Keys, dict[bytes, bytes] | None]]:
    """The job's record (HGETALL) and the keys of its shard, read in each of its homes in one
    step (no EXISTS first): the first found in ``homes`` order. None when there is none (the
    current home's keys then), also where the key holds something else than a record."""
    hs = homes(layout, job_id)
    got = yield [Cmd.of("HGETALL", keys.of_shard(s).job(job_id)) for s in hs]
    for s, v in zip(hs, got, strict=True):
        if isinstance(v, ResponseError) and "WRONGTYPE" in str(v):
            continue  # the key holds something else than a job record
        flat: Any = ok(v)
        if flat:
            rec = flat if isinstance(flat, dict) else dict(zip(flat[::2], flat[1::2],
                                                               strict=True))
            return _keys_of(keys, s), rec
    return _keys_of(keys, hs[0]), None


def same_homes(a: Layout, b: Layout) -> bool:
    """Whether two layouts look for a record in the same shards (a re-read layout that does
    not differ so is not worth a second look)."""
    return a.shards == b.shards and a.prev == b.prev and a.next == b.next


def newer_layout(keys: Keys, layout: Layout) -> Op[Layout | None]:
    """The stored layout when it looks for records elsewhere than ``layout`` (a reshard since
    it was read), else None: one HMGET, for a caller that found nothing."""
    got = yield from read(keys)
    return None if got is None or same_homes(got, layout) else got


def lookup(keys: Keys, layout: Layout, job_id: str
           ) -> Op[tuple[Keys, dict[bytes, bytes] | None, Layout]]:
    """``read_record``; when nothing is found, the layout is read again and, if a reshard
    changed it, the record looked for under the new one. Returns the shard's keys, the
    record or None, and the layout the answer was found with (to keep)."""
    k, rec = yield from read_record(keys, layout, job_id)
    if rec is None:
        newer = yield from newer_layout(keys, layout)
        if newer is not None:
            layout = newer
            k, rec = yield from read_record(keys, layout, job_id)
    return k, rec, layout
