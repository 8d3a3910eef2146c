"""The write side of job search (docs/search.md): which index sets an enqueue call adds its
jobs to (enqueue.lua's search section), and the declaration a producer stores with the queue.

Only a queue whose ``QueueConfig.search`` is set writes any of it; the read side is
``streamq/_ops/search.py``.
"""

from __future__ import annotations

import json
import re
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


# Error text (docs/search.md#error-text): the one rule of an ``error=`` filter, the same as
# _lib.lua's err_text and err_match (the error-word index, ixdead.lua, and search.lua's checks).
EW_MAX = 16
"""Distinct words of an error text that are searchable (and indexed)."""
EW_WORD_MAX = 32
"""Bytes of a word the index keeps (a longer word is found by its first 32 bytes)."""
_WORD = re.compile(rb"[0-9a-z]+")


def error_text(etype: str, reason: str, err: bytes | str | None) -> bytes:
    """The searchable text of an error: '<error type> <reason> <message>' (``etype``, else
    the error's 'type'; the message of the record's error, a JSON object), lower case (ASCII
    letters only), cut just before its 17th distinct word (a word: a run of a-z 0-9)."""
    msg = ""
    if err:
        try:
            e = json.loads(err)
        except (ValueError, UnicodeDecodeError, RecursionError):
            e = None
        if isinstance(e, dict):
            if isinstance(e.get("message"), str):
                msg = e["message"]
            if not etype and isinstance(e.get("type"), str):
                etype = e["type"]
    text = f"{etype} {reason} {msg}".encode(errors="surrogateescape").lower()
    seen: set[bytes] = set()
    for m in _WORD.finditer(text):
        w = m.group()
        if w not in seen:
            if len(seen) == EW_MAX:
                return text[:m.start()]
            seen.add(w)
    return text


def error_match(text: bytes, query: str) -> bool:
    """Whether ``query`` (any case) occurs in ``text`` (``error_text``) where a word starts:
    a query that starts with a letter or digit must not follow one there (``declin`` finds
    'card declined', ``eclined`` does not)."""
    q = query.encode(errors="surrogateescape").lower()
    wb = bool(_WORD.match(q))
    at = text.find(q)
    while at >= 0:
        if not wb or at == 0 or not _WORD.match(text, at - 1, at):
            return True
        at = text.find(q, at + 1)
    return False


def word_spec(query: str) -> str | None:
    """The error-word index lookup for a query (search.lua's ARGV[12]): 'x<word>' for its
    longest whole word (every word but the last, and the last when the query ends with
    another character), else 'p<prefix>' (its only word, a prefix of the text's word); None
    when the query has no word (only a scan answers it)."""
    q = query.encode(errors="surrogateescape").lower()
    toks = [m.group() for m in _WORD.finditer(q)]
    if not toks:
        return None
    whole = toks if not _WORD.match(q, len(q) - 1) else toks[:-1]
    if whole:
        w = max(whole, key=len)[:EW_WORD_MAX]
        return "x" + w.decode()
    t = toks[-1]
    return ("x" if len(t) >= EW_WORD_MAX else "p") + t[:EW_WORD_MAX].decode()
