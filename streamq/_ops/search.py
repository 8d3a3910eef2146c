"""Job search (docs/search.md): sans-IO, over the index sets enqueue.lua writes for queues with
``QueueConfig(search=...)`` (``_core/search.py``), the dead-letter streams and job records.

A query picks one candidate source per queue shard, the most selective it has: an exact id
(a record read, no index needed: works on every queue), the id-prefix set, the dead stream
(error filters, ``state="failed"``), a declared field's set, the group's, the type's, or the
time index. Candidates come newest first; every other filter is checked on the job record,
and reading stops when the page is full or ``max_scan`` candidates were checked (the page
says so: ``bound_hit``). Nothing reads the keyspace.

Results from several queues and shards are merged newest first by (time, source, member);
the cursor is the last one returned, so the next page starts right after it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from .._core.driver import Call, Cmd, Op, Step, _s, ok
from .._core.errors import InvalidSearch, SerializationError
from .._core.keys import Keys, levels_in_use, queues_key
from .._core.locate import homes, span
from .._core.model import STATE_NAMES, _entry_ms, record_state
from .._core.scripts import Arg
from .._core.search import DECL_FIELDS, DECL_SINCE, error_match, error_text, field_value, word_spec
from .._core.serde import JsonSerde, Serde
from .._core.shards import LAYOUT_FIELDS, Layout, parse
from . import search_words as _words
from .search_model import Hit, SearchPage, SearchQuery, check_query, decode_cursor, encode_cursor

__all__ = ["Hit", "SearchPage", "SearchQuery", "check_query", "decode_cursor", "encode_cursor",
           "find"]

PAGE_MAX = 1000
SCAN_DEFAULT = 10_000
"""Candidates a query checks at most by default before it returns what it found
(``bound_hit``)."""
PREFIX_MAX = 1000
"""Ids an id prefix matches at most per shard (ZRANGEBYLEX ... LIMIT)."""
STATE_LIST_MAX = 10_000
"""A state with a set of its own (scheduled and retrying: the delayed ZSET; waiting: the
waiting index) answers from that set in a shard where it holds at most this many ids and no
more than the index the other filters picked; above it, the index is read and the state
checked on records (a state that common is dense there)."""
_STATE_SET = {"scheduled": "delayed", "retrying": "delayed", "waiting": "waiting"}
CHUNK_MAX = 4000
"""Entries one search.lua call reads at most (a long search's later slices grow to it)."""
_SEQ_MAX = 2**64 - 1
_REC = ("s", "state", "b", "type", "g", "c", "error", "reason")
_REFUSED: list[Any] = []
_LETTER = {v: k.decode() for k, v in STATE_NAMES.items()}


@attrs.define
class _Src:
    """One candidate source: a sorted set by rank ('z'), a dead stream ('d'), the dead
    letters of a word of the error-word index ('e') or a fixed list ('l'), of one queue
    shard."""

    kind: str
    queue: str
    shard: int
    label: str
    key: str = ""
    rank: int = 0
    end: tuple[int, int] = (0, 0)  # 'd': the next entry at or before (ms, seq)
    buf: list[tuple[int, str, str, str]] = attrs.field(factory=list)  # (score, label, member, id)
    done: bool = False
    extra: dict[str, tuple[str, str]] = attrs.field(factory=dict)  # 'd': id -> reason, etype
    removed: list[str] = attrs.field(factory=list)
    codes: dict[str, int] = attrs.field(factory=dict)  # member -> search.lua's code
    rec: str = ""  # the shard's job record key prefix
    seen: set[str] = attrs.field(factory=set)  # 'd': job ids met in this call
    lo: str = ""  # 'd', 'e': the oldest entry to read ('' = since_ms's)
    aux: list[str] = attrs.field(factory=list)  # 'e': the dead stream, Keys.ix_ewl
    mark: tuple[int, int] | None = None  # 'e': the newest dead letter indexed


def _gkey(c: tuple[int, str, str, str]) -> tuple[int, str, str]:
    return c[0], c[1], c[2]


def find(q: SearchQuery, *, prefix: str = "streamq", limit: int = 50,
         cursor: str | None = None, max_scan: int = SCAN_DEFAULT,
         serde: Serde | None = None) -> Op[SearchPage]:
    """One page of jobs matching ``q``, newest first (module docstring)."""
    check_query(q)
    limit = max(1, min(int(limit), PAGE_MAX))
    max_scan = max(limit, int(max_scan))
    after = decode_cursor(cursor) if cursor else None
    serde = serde or JsonSerde()
    if q.queue is not None:
        queues = [Keys(q.queue, prefix).queue]
    else:
        (names,) = yield [Cmd.of("SMEMBERS", queues_key(prefix))]
        queues = sorted(_s(n) for n in ok(names) or [])
    infos = yield [c for name in queues for c in (
        Cmd.of("HMGET", Keys(name, prefix).meta, *LAYOUT_FIELDS),
        Cmd.of("HMGET", Keys(name, prefix).ix_decl, DECL_FIELDS, DECL_SINCE))]
    lays: dict[str, Layout] = {}  # (a reshard: records in the homes of earlier counts too)
    decl: dict[str, dict[str, list[str]]] = {}
    since: dict[str, int | None] = {}
    for i, name in enumerate(queues):
        n, d = infos[2 * i], infos[2 * i + 1]
        lays[name] = parse(n) if isinstance(n, list) and n[0] is not None else Layout(1)
        fields_raw, since_raw = (d if isinstance(d, list) else [None, None])[:2]
        since[name] = int(since_raw) if since_raw else None
        try:
            decl[name] = json.loads(fields_raw) if fields_raw else {}
        except ValueError:
            decl[name] = {}
    source = _source_kind(q)
    if q.fields:
        _check_fields(q, queues, decl, since)
    srcs: list[_Src] = []
    scanned = 0
    bound_hit = False
    if source == "id":
        assert q.id is not None
        jid = q.id
        at = [(name, sh) for name in queues for sh in homes(lays[name], jid)]
        found = yield [Cmd.of("HMGET", Keys(name, prefix, sh).job(jid), "c", "e")
                       for name, sh in at]
        for (name, sh), rep in zip(at, found, strict=True):
            if isinstance(rep, list) and any(v is not None for v in rep) and not any(
                    s.queue == name for s in srcs):  # (the first found in homes order)
                ms = _ms(rep[0]) or _ms(_entry_ms(rep[1]))
                s = _Src("l", name, sh, _label(name, sh), rec=Keys(name, prefix, sh).job(""))
                s.buf = [(ms, s.label, jid, jid)]
                s.done = True
                srcs.append(s)
    else:
        for name in queues:
            if source != "dead" and since[name] is None:
                continue  # no index: nothing but an exact id finds its jobs
            for sh in range(span(lays[name])):
                srcs.extend(_sources(q, source, name, Keys(name, prefix, sh), decl[name]))
        for s in srcs:
            s.rec = Keys(s.queue, prefix, s.shard).job("")
        if source == "prefix":
            b = yield from _prefix_init(q, srcs)
            bound_hit = bound_hit or b
        else:
            if q.state in _STATE_SET and source != "dead":
                srcs, used = yield from _state_init(q, srcs, prefix)
                source = "state" if used else source
            if q.state == "queued" and source == "time":
                srcs, used = yield from _queued_init(srcs, prefix)
                source = "stream" if used else source
            spec = _spec(q) if source == "dead" else None
            if spec is not None:
                srcs, used = yield from _words_init(q, srcs, prefix, since)
                source = "words" if used else source
            yield from _init(q, srcs, after)
    by_label = {s.label: s for s in srcs}
    items: list[Hit] = []
    chunk = max(10, min(2 * limit, PAGE_MAX) // max(1, len(srcs)) + 1)
    last: tuple[int, str, str] | None = after
    while len(items) < limit:
        need = [s for s in srcs if not s.buf and not s.done]
        while need:  # (a fetch moves each source on: this ends)
            yield from _fetch(q, need, chunk, last)
            chunk = min(chunk * 2, CHUNK_MAX, max(10, max_scan - scanned))
            need = [s for s in need if not s.buf and not s.done]
        live = [s for s in srcs if s.buf or not s.done]
        if not live:
            last = None
            break
        # entries newer than the oldest of any source still to read are in final order
        horizon = max((_gkey(s.buf[-1]) for s in live if not s.done and s.buf), default=None)
        cands = sorted((c for s in live for c in s.buf
                        if horizon is None or _gkey(c) >= horizon), key=_gkey, reverse=True)
        if last is not None:
            cands = [c for c in cands if _gkey(c) < last]
        room = max_scan - scanned
        if room <= 0:
            bound_hit = True
            break
        cands = cands[:room]
        recs: list[Any] = [None] * len(cands)
        todo = []
        for i, c in enumerate(cands):  # search.lua's codes; fixed lists: read them all
            code = by_label[c[1]].codes.pop(c[2], 2)
            if code == 2:
                todo.append(i)
            elif code == 1:
                recs[i] = _REFUSED
        if todo:
            full = yield [Cmd.of("HMGET", by_label[cands[i][1]].rec + cands[i][3], *_REC)
                          for i in todo]
            for i, rec in zip(todo, full, strict=True):
                recs[i] = rec
        stop = None
        for c, rec in zip(cands, recs, strict=True):
            scanned += 1
            last = _gkey(c)
            src = by_label[c[1]]
            if rec is _REFUSED:  # by search.lua
                continue
            hit = _match(q, src, c, rec, serde)
            if hit is not None:
                items.append(hit)
                if len(items) == limit:
                    stop = c
                    break
        for s in live:
            s.buf = [c for c in s.buf if last is None or _gkey(c) < last]
        drop: Step = []
        for s in srcs:
            if s.removed and s.kind == "z":
                drop.append(Cmd.of("ZREM", s.key, *s.removed))
                s.rank -= len(s.removed)
            s.removed = []
        if drop:
            yield drop  # expired records' index entries, dropped as met
        if stop is not None:
            break
        if scanned >= max_scan and any(s.buf or not s.done for s in srcs):
            bound_hit = True
            break
    more = last is not None and any(s.buf or not s.done for s in srcs)
    return SearchPage(items, encode_cursor(last) if more and last else None, scanned,
                      bound_hit, source, {n: since[n] for n in queues})


def _spec(q: SearchQuery) -> str | None:
    """The error-word index lookup of an error filter (None: the stream answers)."""
    if q.error is not None:
        return word_spec(q.error)
    if q.error_type is not None:
        return word_spec(q.error_type + " ")  # (the text starts with the error type)
    return None


def _words_init(q: SearchQuery, srcs: list[_Src], prefix: str,
                since: dict[str, int | None]) -> Op[tuple[list[_Src], bool]]:
    """Per dead-stream source of a queue with search on: the error-word index up to its mark
    (an 'e' source), and the stream only after the mark (dead letters not indexed yet)."""
    on = [s for s in srcs if since[s.queue] is not None]
    marks = yield from _words.sync([Keys(s.queue, prefix, s.shard) for s in on])
    out = list(srcs)
    used = False
    for s, (mark, _more) in zip(on, marks, strict=True):
        if not mark:
            continue
        used = True
        k = Keys(s.queue, prefix, s.shard)
        m = _words.mark_ms(mark)
        # the same label and shared bookkeeping: a dead letter sorts (and pages) the same
        # whichever of the two reads it, also when the mark moved on between pages
        e = _Src("e", s.queue, s.shard, s.label, k.ix_ew, extra=s.extra, codes=s.codes,
                 rec=s.rec, seen=s.seen, aux=[k.dead, k.ix_ewl], mark=m)
        out.append(e)
        s.lo = (f"{q.since_ms}-0" if q.since_ms is not None and q.since_ms > m[0]
                else f"({mark}")
    return out, used


def _queued_init(srcs: list[_Src], prefix: str) -> Op[tuple[list[_Src], bool]]:
    """``state="queued"`` alone (no index filter): per shard, its ready streams (one per
    priority level in use), newest entry first, in place of the time index; an entry's job is
    checked on its record (the stream also holds delivered entries, of active jobs). Grouped
    jobs waiting for their group's slot are queued in no stream: their ids (at most
    ``STATE_LIST_MAX`` per shard, with their enqueue times from the time index) join as a
    fixed list; a shard with more keeps the time index."""
    step: Step = []
    for s in srcs:
        k = Keys(s.queue, prefix, s.shard)
        step += [Cmd.of("SMEMBERS", k.levels), Cmd.of("ZCARD", k.group_wait)]
    replies = yield step
    out: list[_Src] = []
    lists: list[tuple[_Src, Keys]] = []
    used = False
    for i, s in enumerate(srcs):
        waiting = replies[2 * i + 1]
        if isinstance(waiting, Exception) or int(waiting or 0) > STATE_LIST_MAX:
            out.append(s)
            continue
        used = True
        k = Keys(s.queue, prefix, s.shard)
        out.extend(_Src("d", s.queue, s.shard, _label(s.queue, s.shard, f"p{lv}"),
                        k.stream_level(lv), rec=s.rec) for lv in levels_in_use(replies[2 * i]))
        if int(waiting or 0):
            lists.append((_Src("l", s.queue, s.shard, _label(s.queue, s.shard, "gw"),
                               k.group_wait, rec=s.rec, done=True), k))
    if lists:
        got = yield [Cmd.of("ZRANGE", k.group_wait, 0, -1) for _, k in lists]
        ids = [[_s(m).rpartition(" ")[2][17:] for m in ok(r) or []] for r in got]
        scores = yield [Cmd.of("ZMSCORE", k.ix_all, *js) if js else Cmd.of("ECHO", "")
                        for (_, k), js in zip(lists, ids, strict=True)]
        for (lst, _), js, sc in zip(lists, ids, scores, strict=True):
            vals = (ok(sc) or []) if js else []
            lst.buf = sorted(((int(float(v)), lst.label, j, j)
                              for j, v in zip(js, vals, strict=True) if v is not None),
                             reverse=True)
            out.append(lst)
    return out, used


def _source_kind(q: SearchQuery) -> str:
    if q.id is not None:
        return "id"
    if q.id_prefix is not None:
        return "prefix"
    if q.error is not None or q.error_type is not None or q.state == "failed":
        return "dead"
    if q.fields:
        return "field"
    if q.group is not None:
        return "group"
    if q.type is not None:
        return "type"
    return "time"


def _check_fields(q: SearchQuery, queues: Sequence[str], decl: Mapping[str, Any],
                  since: Mapping[str, int | None]) -> None:
    for name in q.fields:
        ok_somewhere = any(
            name in fields for queue in queues for t, fields in decl[queue].items()
            if q.type is None or t == q.type)
        if not ok_somewhere:
            where = f"job type {q.type!r}" if q.type else "any job type"
            declared = sorted({f"{t}:{f}" for queue in queues for t, fs in decl[queue].items()
                               for f in fs})
            raise InvalidSearch(
                f"payload field {name!r} is not declared indexable for {where} in"
                f" {'queue ' + repr(queues[0]) if len(queues) == 1 else 'any queue'}"
                f" (SearchConfig.fields; declared: {', '.join(declared) or 'none'})")


def _label(queue: str, shard: int, extra: str = "") -> str:
    return f"{queue}/{shard:03d}{'/' + extra if extra else ''}"


def _sources(q: SearchQuery, source: str, name: str, k: Keys,
             decl: Mapping[str, list[str]]) -> list[_Src]:
    sh = k.shard
    if source == "dead":
        return [_Src("d", name, sh, _label(name, sh), k.dead)]
    if source == "prefix":
        return [_Src("l", name, sh, _label(name, sh), k.ix_ids)]
    if source == "field":
        fname, value = next(iter(q.fields.items()))
        types = [t for t, fs in decl.items() if fname in fs and (q.type in (None, t))]
        return [_Src("z", name, sh, _label(name, sh, t), k.ix_field(t, fname, value))
                for t in sorted(types)]
    if source == "group":
        assert q.group is not None
        return [_Src("z", name, sh, _label(name, sh), k.ix_group(q.group))]
    if source == "type":
        assert q.type is not None
        return [_Src("z", name, sh, _label(name, sh), k.ix_type(q.type))]
    return [_Src("z", name, sh, _label(name, sh), k.ix_all)]


def _init(q: SearchQuery, srcs: Sequence[_Src], after: tuple[int, str, str] | None) -> Op[None]:
    """Each source's first position: after the cursor, and not after ``until``."""
    step: Step = []
    for s in srcs:
        if s.kind == "l":
            continue
        if s.kind in "de":
            end = (q.until_ms, _SEQ_MAX) if q.until_ms is not None else (2**63, 0)
            if after is not None:
                sc, lab, mem = after
                if s.label > lab:
                    e2 = (sc - 1, _SEQ_MAX)
                elif s.label < lab:
                    e2 = (sc, _SEQ_MAX)
                else:
                    seq = int(mem.split("|", 1)[0])
                    e2 = (sc, seq - 1) if seq > 0 else (sc - 1, _SEQ_MAX)
                end = min(end, e2)
            s.end = min(end, s.mark) if s.mark is not None else end
            continue
        step.append(Cmd.of("ZCOUNT", s.key, f"({q.until_ms}", "+inf") if q.until_ms is not None
                    else Cmd.of("ECHO", "0"))
        if after is None:
            step.extend((Cmd.of("ECHO", "0"), Cmd.of("ECHO", "0")))
            continue
        sc, lab, mem = after
        if s.label > lab:
            step.extend((Cmd.of("ZCOUNT", s.key, sc, "+inf"), Cmd.of("ECHO", "0")))
        elif s.label < lab:
            step.extend((Cmd.of("ZCOUNT", s.key, f"({sc}", "+inf"), Cmd.of("ECHO", "0")))
        else:
            step.extend((Cmd.of("ZREVRANK", s.key, mem), Cmd.of("ZSCORE", s.key, mem)))
    if not step:
        return
    replies = yield step
    i = 0
    for s in srcs:
        if s.kind in "del":
            continue
        r_until, r1, r2 = replies[i:i + 3]
        i += 3
        start = int(ok(r_until) or 0)
        if after is not None:
            sc, lab, _ = after
            if s.label != lab:
                start = max(start, int(ok(r1) or 0))
            elif r1 is not None and not isinstance(r1, Exception) and r2 is not None and (
                    int(float(r2)) == sc):
                start = max(start, int(r1) + 1)
            else:  # the cursor's member is gone: resume after its whole millisecond
                (n,) = yield [Cmd.of("ZCOUNT", s.key, sc, "+inf")]
                start = max(start, int(ok(n) or 0))
        s.rank = start


def _state_init(q: SearchQuery, srcs: list[_Src], prefix: str
                ) -> Op[tuple[list[_Src], bool]]:
    """Per shard, the state's own set (``_STATE_SET``) in place of the picked index when it is
    the smaller side and at most ``STATE_LIST_MAX``: its ids, with their enqueue times from
    the time index, as a fixed list (the rest of the filter is checked on the records)."""
    assert q.state is not None
    shards = sorted({(s.queue, s.shard) for s in srcs})
    keys = {qs: getattr(Keys(qs[0], prefix, qs[1]), _STATE_SET[q.state]) for qs in shards}
    step: Step = [Cmd.of("ZCARD", keys[qs]) for qs in shards]
    step += [Cmd.of("ZCARD", s.key) for s in srcs]
    replies = yield step
    n_state = {qs: _ms(ok(r)) for qs, r in zip(shards, replies, strict=False)}
    n_index: dict[tuple[str, int], int] = {}
    for s, r in zip(srcs, replies[len(shards):], strict=True):
        n_index[s.queue, s.shard] = n_index.get((s.queue, s.shard), 0) + _ms(
            r if not isinstance(r, Exception) else 0)
    picked = [qs for qs in shards
              if n_state[qs] <= min(STATE_LIST_MAX, n_index[qs]) or n_state[qs] == 0]
    if not picked:
        return srcs, False
    ids_of = yield [Cmd.of("ZRANGE", keys[qs], 0, -1) for qs in picked]
    ids = [[_s(m) for m in ok(r) or []] for r in ids_of]
    scores = yield [Cmd.of("ZMSCORE", Keys(qs[0], prefix, qs[1]).ix_all, *js) if js
                    else Cmd.of("ECHO", "") for qs, js in zip(picked, ids, strict=True)]
    out = [s for s in srcs if (s.queue, s.shard) not in set(picked)]
    for qs, js, sc in zip(picked, ids, scores, strict=True):
        lst = _Src("l", qs[0], qs[1], _label(*qs), keys[qs],
                   rec=Keys(qs[0], prefix, qs[1]).job(""), done=True)
        vals = (ok(sc) or []) if js else []
        lst.buf = sorted(((ms, lst.label, j, j) for j, v in zip(js, vals, strict=True)
                          if v is not None for ms in (int(float(v)),)
                          if (q.since_ms is None or ms >= q.since_ms)
                          and (q.until_ms is None or ms <= q.until_ms)), reverse=True)
        out.append(lst)
    return out, True


def _prefix_init(q: SearchQuery, srcs: Sequence[_Src]) -> Op[bool]:
    """The id-prefix sources' candidates: matching ids (at most PREFIX_MAX per shard) with
    their enqueue time from the time index, as fixed lists."""
    p = q.id_prefix
    assert p is not None
    replies = yield [Cmd.of("ZRANGEBYLEX", s.key, f"[{p}", f"[{p}\xff", "LIMIT", 0, PREFIX_MAX)
                     for s in srcs]
    bound = False
    ids_of = [[_s(m) for m in ok(r) or []] for r in replies]
    steps: Step = [Cmd.of("ZMSCORE", s.key.removesuffix(":ix:ids") + ":ix:all", *ids)
                   if ids else Cmd.of("ECHO", "") for s, ids in zip(srcs, ids_of, strict=True)]
    scores = yield steps
    for s, ids, sc in zip(srcs, ids_of, scores, strict=True):
        bound = bound or len(ids) >= PREFIX_MAX
        vals = ok(sc) or [None] * len(ids)
        s.buf = sorted(((int(float(v)), s.label, j, j) for j, v in zip(ids, vals, strict=True)
                        if v is not None), reverse=True)
        s.done = True
    return bound


def _fetch(q: SearchQuery, srcs: Sequence[_Src], n: int,
           last: tuple[int, str, str] | None) -> Op[None]:
    """The next ``n`` entries of each source, checked on their records by search.lua."""
    flt: list[Arg] = [_LETTER.get(q.state or "", ""), q.state or "", q.group or "",
                      q.type or "", _ascii_lower(q.error or ""), q.error_type or ""]
    lo = f"{q.since_ms}-0" if q.since_ms is not None else "-"
    spec = _spec(q) or ""
    replies = yield [Call("search", [s.key], ["z", s.rec, s.rank, "", n, *flt]) if s.kind == "z"
                     else Call("search", [s.key, *s.aux], [
                         s.kind, s.rec, f"{s.end[0]}-{s.end[1]}", s.lo or lo, n, *flt, spec])
                     for s in srcs]
    for s, rep in zip(srcs, replies, strict=True):
        if s.kind == "e" and _words.is_broad(rep):  # a prefix of too many words:
            s.kind, s.key, s.aux = "d", s.aux[0], []  # read the stream up to the mark
            continue
        if isinstance(rep, Exception):  # a key of another type (overwritten by hand)
            s.done = True
            continue
        got: list[tuple[int, str, str, str]] = []
        flat = rep or []
        if s.kind == "z":
            for j in range(0, len(flat), 3):
                m, sc = _s(flat[j]), int(float(flat[j + 1]))
                if q.since_ms is not None and sc < q.since_ms:
                    s.done = True
                    break
                got.append((sc, s.label, m, m))
                s.codes[m] = int(flat[j + 2])
            s.rank += len(flat) // 3
            if len(flat) // 3 < n:
                s.done = True
        else:
            for j in range(0, len(flat), 5):
                eid, jid = _s(flat[j]), _s(flat[j + 1])
                ms, _, seq = eid.partition("-")
                s.end = (int(ms), int(seq) - 1) if int(seq) > 0 else (int(ms) - 1, _SEQ_MAX)
                if not jid or jid in s.seen:  # (a job dead-lettered again after a re-drive:
                    continue                      # its newest dead letter only)
                s.seen.add(jid)
                member = f"{int(seq):020d}|{jid}"
                got.append((int(ms), s.label, member, jid))
                code = int(flat[j + 4])
                s.codes[member] = code
                if code == 2:
                    s.extra[member] = (_s(flat[j + 2]), _s(flat[j + 3]))
            if len(flat) // 5 < n:
                s.done = True
        if last is not None:
            got = [c for c in got if _gkey(c) < last]
        s.buf.extend(got)


def _match(q: SearchQuery, src: _Src, c: tuple[int, str, str, str], rec: Any,
           serde: Serde) -> Hit | None:
    if not isinstance(rec, list) or (rec[0] is None and rec[1] is None):
        if src.kind == "z":
            src.removed.append(c[2])  # the record expired: its index entry goes
        return None
    s, s1, body, t1, g, _c, err, reason = rec
    state = record_state(s if s is not None else s1)
    jtype = (body.partition(b" ")[0] if body else (t1 or b"")).decode(errors="replace")
    group = (g or b"").decode(errors="replace")
    if q.state is not None and state != q.state:
        return None
    if q.type is not None and jtype != q.type:
        return None
    if q.group is not None and group != q.group:
        return None
    if q.since_ms is not None and c[0] < q.since_ms:
        return None
    if q.until_ms is not None and c[0] > q.until_ms:
        return None
    dead_reason, dead_etype = src.extra.get(c[2], ("", ""))
    err_text = (err or b"").decode(errors="replace")
    etype, message = dead_etype, ""
    if err_text:
        try:
            e = json.loads(err_text)
        except ValueError:
            e = None
        if isinstance(e, dict):
            etype = etype or str(e.get("type", ""))
            message = str(e.get("message", ""))
    shown = (f"{etype}: {message}" if message else
             dead_reason or (reason or b"").decode(errors="replace") or err_text)
    if q.error_type is not None and etype != q.error_type and (
            f'"type": "{q.error_type}"' not in err_text):
        return None
    if q.error is not None and not error_match(error_text(
            dead_etype, dead_reason or (reason or b"").decode(errors="replace"), err), q.error):
        return None
    if q.fields:
        if not body:
            return None
        try:
            payload = serde.loads(body.partition(b" ")[2])
        except (SerializationError, RecursionError):
            return None
        for name, want in q.fields.items():
            if field_value(payload, name) != want:
                return None
    return Hit(src.queue, c[3], jtype, state, c[0], group, shown[:300], src.shard)


def _ms(v: Any) -> int:
    try:
        return int(v) if v else 0
    except (TypeError, ValueError):
        return 0


def _ascii_lower(text: str) -> str:
    """Lower case as search.lua's string.lower does it: ASCII letters only (the error-text
    rule; ``str.lower`` would also change other letters, which the text keeps as they are)."""
    return text.encode(errors="surrogateescape").lower().decode(errors="surrogateescape")
