"""Dedup by an explicit key at enqueue (docs/dedup.md): the ``Dedup`` option and its checks.

enqueue.lua applies it atomically per job: the dedup key (``Keys.dedup``, a STRING holding
the id of the job that owns it, in the job's shard) folds later enqueues into that job while
the mode's window lasts; the job record keeps the key's full name (field 'dk', after a mode
letter) so that the transition that ends the window (start, or a terminal one) deletes it,
only while it still names that job. Every key also carries a TTL as a backstop.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from .errors import InvalidDedup

Mode = Literal["throttle", "debounce", "keep_last", "until_start", "until_finish"]
MODES: tuple[str, ...] = ("throttle", "debounce", "keep_last", "until_start", "until_finish")
LETTER = {"throttle": "t", "debounce": "d", "keep_last": "k", "until_start": "s",
          "until_finish": "f"}
"""The mode's letter in enqueue.lua's arguments and the record's 'dk' field."""
MODE_OF = {v: k for k, v in LETTER.items()}
DEFAULT_BACKSTOP_S = 86_400
"""A dedup key's TTL when ``ttl_s`` is not given (every mode but throttle): the backstop that
frees a key whose clearing transition never ran (a record deleted by hand)."""
MAX_KEY = 200


def _key(_inst: object, _att: object, v: Any) -> None:
    if not isinstance(v, str) or not 1 <= len(v) <= MAX_KEY or any(
            c.isspace() or not c.isprintable() for c in v):
        raise InvalidDedup(f"dedup key must be 1-{MAX_KEY} printable characters without"
                           f" spaces, got {v!r}")


def _mode(_inst: object, _att: object, v: Any) -> None:
    if v not in MODES:
        raise InvalidDedup(f"dedup mode must be one of {', '.join(MODES)}; got {v!r}")


def _positive(name: str, v: object, *, whole: bool) -> None:
    ok = isinstance(v, int if whole else int | float) and not isinstance(v, bool) and (
        0 < v < 10**12)
    if not ok:
        raise InvalidDedup(f"dedup {name} must be a positive {'integer' if whole else 'number'},"
                           f" got {v!r}")


@attrs.frozen
class Dedup:
    """``enqueue(..., dedup=Dedup(key="user:42", mode="debounce", delay_ms=2000,
    max_wait_ms=30000))``: one job per ``key`` while the mode's window lasts (docs/dedup.md).

    - ``throttle``: the first enqueue creates the job; every other one within ``ttl_s``
      (required) is folded into it, whatever becomes of the job.
    - ``debounce``: the job waits ``delay_ms`` (required); an enqueue while it waits replaces
      its payload and pushes its start back to ``delay_ms`` from now, but never later than
      ``max_wait_ms`` (required) after the first enqueue. From its start, a new job.
    - ``keep_last``: an enqueue while the job waits replaces its payload; while it runs (or
      waits to retry), the enqueue creates one follow-up job held until the running one ends
      (at most ``ttl_s``), whose payload later enqueues replace: never two of the key running.
    - ``until_start``: folded into the job until it starts.
    - ``until_finish``: folded into the job until it completes, is dead-lettered, cancelled
      or purged.

    ``ttl_s``: throttle's window; for every other mode the key's backstop TTL (default one
    day), refreshed when an enqueue is folded in.
    """

    key: str = attrs.field(validator=_key)
    mode: Mode = attrs.field(default="until_finish", validator=_mode)
    ttl_s: float | None = None
    delay_ms: int | None = None
    max_wait_ms: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.ttl_s is not None:
            _positive("ttl_s", self.ttl_s, whole=False)
        elif self.mode == "throttle":
            raise InvalidDedup("dedup mode throttle needs ttl_s (the window)")
        if self.mode == "debounce":
            if self.delay_ms is None or self.max_wait_ms is None:
                raise InvalidDedup("dedup mode debounce needs delay_ms and max_wait_ms (the"
                                   " longest a job waits while newer enqueues push it back)")
            _positive("delay_ms", self.delay_ms, whole=True)
            _positive("max_wait_ms", self.max_wait_ms, whole=True)
            if self.max_wait_ms < self.delay_ms:
                raise InvalidDedup(f"dedup max_wait_ms ({self.max_wait_ms}) must be at least"
                                   f" delay_ms ({self.delay_ms})")
            if self.ttl_s is not None and self.ttl_s * 1000 < self.max_wait_ms:
                raise InvalidDedup("dedup ttl_s must cover max_wait_ms (the key outlives the"
                                   " wait)")
        elif self.delay_ms is not None or self.max_wait_ms is not None:
            raise InvalidDedup(f"dedup delay_ms and max_wait_ms are debounce's; mode"
                               f" {self.mode} takes neither")

    @property
    def ttl_ms(self) -> int:
        """The key's TTL in ms (throttle's window, or the backstop)."""
        return max(1, round((self.ttl_s if self.ttl_s is not None
                             else DEFAULT_BACKSTOP_S) * 1000))


def check(dedup: object) -> Dedup:
    if not isinstance(dedup, Dedup):
        raise InvalidDedup(f"dedup must be a streamq.Dedup, got {type(dedup).__name__}")
    return dedup


def decode_dk(raw: bytes | str | None) -> tuple[str, str] | None:
    """A record's 'dk' field as (mode, key as the user gave it); None without one. The field
    is '<mode letter><key name>', the name '<prefix>:{<tag>}:dd:<key>' (Keys.dedup)."""
    if not raw:
        return None
    s = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    mode = MODE_OF.get(s[:1], s[:1])
    at = s.find("}:dd:")
    return mode, (s[at + 5:] if at >= 0 else s[1:])
