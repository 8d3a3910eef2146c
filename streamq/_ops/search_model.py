"""The query, hit and page types of job search (docs/search.md), its filter checks and its
cursor; the search itself is ``search.py``."""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping

import attrs

from .._core.errors import InvalidSearch
from .._core.keys import check_job_id
from .._core.model import STATES


@attrs.frozen
class SearchQuery:
    """Filters of ``Admin.find`` (all optional; all given must match)."""

    queue: str | None = None
    """One queue, or None: every queue of the registry (``Admin.queues``)."""
    id: str | None = None
    id_prefix: str | None = None
    type: str | None = None
    state: str | None = None
    group: str | None = None
    error: str | None = None
    """Text in the error (case-insensitive), where a word starts (docs/search.md#error-text):
    the dead letter's error type and reason and the record's error message."""
    error_type: str | None = None
    since_ms: int | None = None
    """Enqueued at or after (epoch ms; dead letters: dead-lettered at)."""
    until_ms: int | None = None
    fields: Mapping[str, str] = attrs.field(factory=dict)
    """Declared payload fields (``SearchConfig.fields``) -> value as text."""


@attrs.frozen
class Hit:
    queue: str
    job_id: str
    type: str
    state: str
    at_ms: int
    """Enqueued at (from the index) or dead-lettered at (from the dead stream)."""
    group: str = ""
    error: str = ""
    shard: int = 0


@attrs.frozen
class SearchPage:
    items: list[Hit]
    cursor: str | None
    """Pass it back for the next page; None: nothing more matches."""
    scanned: int
    """Candidates checked (index entries and records read)."""
    bound_hit: bool
    """Reading stopped at ``max_scan`` (or an id prefix matched more than ``PREFIX_MAX`` ids in
    a shard) before the page was full: there may be more; ``cursor`` continues."""
    source: str
    """What answered: id, prefix, dead, words (the error-word index, and the dead stream for
    dead letters it has not reached yet), state, field, group, type or time."""
    index_since_ms: dict[str, int | None]
    """Per queue searched: when its index starts (ms), None when it has none (a queue
    without ``QueueConfig.search``: only an exact id finds its jobs)."""


def check_query(q: SearchQuery) -> SearchQuery:
    if q.state is not None and q.state not in STATES:
        raise InvalidSearch(f"unknown state {q.state!r}: one of {', '.join(STATES)}")
    if q.id is not None:
        try:
            check_job_id(q.id)
        except Exception as exc:
            raise InvalidSearch(str(exc)) from exc
    if q.id_prefix is not None and (not q.id_prefix or any(
            c in q.id_prefix for c in "[]()\x00\xff ")):
        raise InvalidSearch(f"invalid id prefix {q.id_prefix!r}")
    for name in ("since_ms", "until_ms"):
        v = getattr(q, name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise InvalidSearch(f"{name} must be epoch milliseconds (an int), got {v!r}")
    if (q.since_ms is not None and q.until_ms is not None and q.since_ms > q.until_ms):
        raise InvalidSearch(f"since ({q.since_ms}) is after until ({q.until_ms})")
    for name, v in q.fields.items():
        if not isinstance(name, str) or not isinstance(v, str) or not v:
            raise InvalidSearch(f"a field filter is a name and a non-empty text value, got"
                                f" {name!r}={v!r}")
    return q


def encode_cursor(key: tuple[int, str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[int, str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        s, label, member = json.loads(raw)
        if isinstance(s, int) and isinstance(label, str) and isinstance(member, str):
            return s, label, member
    except (ValueError, TypeError):
        pass
    raise InvalidSearch(f"invalid search cursor {cursor!r}")
