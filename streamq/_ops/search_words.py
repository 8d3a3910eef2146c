"""The error-word index of job search (docs/search.md#error-text): ``ixdead.lua`` indexes a
queue shard's dead letters by the words of their error text (``Keys.ix_ew``), and an
``error=`` (or ``error_type=``) search reads a word's dead letters from it newest first
instead of scanning the dead-letter stream.

The index follows the stream: each search first brings it up to date (at most
``SYNC_MAX`` dead letters per shard and call; a worker's housekeeping does the same every
``ERROR_INDEX_EVERY_S``, and at once again while more wait), and the dead letters it has
not reached yet (newer than its mark) are read from the stream, with the same rule
(``_core.search.error_text``/``error_match``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._core.driver import Call, Op, _s
from .._core.keys import Keys

SYNC_MAX = 200
"""Dead letters one ixdead.lua call indexes at most: ~50 µs of Redis CPU each (1M-job
benchmark: a dead letter's record read, its error's JSON decoded, ~4 words written), so a
call holds Redis ~10 ms."""
DROP_MAX = 1000
"""Dead letters gone from the stream one ixdead.lua call drops from the index at most."""
ERROR_INDEX_EVERY_S = 10.0
"""How often a worker brings the error-word index of each of its queue shards up to date."""


def sync_call(k: Keys, n: int | None = None) -> Call:
    return Call("ixdead", [k.dead, k.ix_all, k.ix_ew, k.ix_ewl],
                [k.job(""), SYNC_MAX if n is None else n, DROP_MAX])


def sync(shards: Sequence[Keys]) -> Op[list[tuple[str, bool]]]:
    """Bring each shard's error-word index up to its dead-letter stream (one bounded call
    each): per shard, the entry id of the newest dead letter indexed ('' = none: read the
    stream) and whether more wait."""
    if not shards:
        return []
    replies = yield [sync_call(k) for k in shards]
    out: list[tuple[str, bool]] = []
    for rep in replies:
        if isinstance(rep, Exception) or not isinstance(rep, list) or len(rep) < 4:
            out.append(("", True))  # (a key of another type: no index, read the stream)
            continue
        out.append((_s(rep[2]), bool(int(rep[3]))))
    return out


def mark_ms(mark: str) -> tuple[int, int]:
    ms, _, seq = mark.partition("-")
    return int(ms), int(seq or 0)


def is_broad(rep: Any) -> bool:
    """search.lua's answer when a one-word prefix starts more than 64 indexed words."""
    return isinstance(rep, list) and len(rep) == 1 and _s(rep[0]) == "!broad"
