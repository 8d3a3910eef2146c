"""KEYS and ARGV of the fetch path's script calls (start.lua, claim.lua, the latter's fixed
runs packed once) and the reading of claim.lua's reply (its header)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from .._core.config import QueueConfig
from .._core.keys import GROUP, Keys
from .._core.scripts import SCRIPTS, pack_run

CLAIM_HEAD = 4
"""Values before the arrays of entries in claim.lua's reply."""
CLAIM_WIDTH = 4
"""Values per entry in each of claim.lua's arrays of entries read (after its level)."""


def start_call(k: Keys, consumer: str, cfg: QueueConfig, part: Sequence[tuple[str, str, str]],
               bad: Sequence[tuple[str, str]], resume: str = "", *, rate: bool = False
               ) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one start.lua call: (entry, job id, token) per entry to start, and
    (entry, description) per malformed entry; resume: the worker's token prefix when these
    are its own pending entries read again; rate: check the queue's rate limit (if any)."""
    keys = [k.stream, k.dead, k.stats, k.events, k.paused, *(k.job(j) for _, j, _t in part)]
    args: list[Any] = [GROUP, consumer, cfg.events_arg, cfg.dead_ttl_s, cfg.dead_maxlen,
                       resume, len(part)]
    for eid, jid, token in part:
        args += [eid, jid, token]
    args.append(len(bad))
    for eid, desc in bad:
        args += [eid, desc]
    keys += k.group_keys  # a grouped job starts through its group's gate
    args.append(cfg.group_arg)
    if rate and cfg.rate_limit is not None:
        keys.append(k.rate)
        args += cfg.rate_args(k.shard)
    return keys, args


def claim_call(k: Keys, consumer: str, cfg: QueueConfig, token_prefix: str, first: int, n: int,
               streams: Sequence[str] | None = None, shares: Sequence[int] | None = None
               ) -> tuple[list[str], list[Any]]:
    """KEYS and ARGV of one claim.lua call: up to n entries, tokens from number first on,
    from the level streams given (in reading order; default: the shard's default level)
    with their shares of n."""
    streams = [k.stream] if streams is None else list(streams)
    shares = [n] if shares is None else list(shares)
    keys = [k.dead, k.stats, k.events, k.paused, k.rate, *streams, *k.group_keys]
    args: list[Any] = [GROUP, consumer, cfg.events_arg, cfg.dead_ttl_s, cfg.dead_maxlen,
                       k.job(""), token_prefix, first, n, *cfg.rate_args(k.shard), *shares,
                       cfg.group_arg]
    return keys, args


@attrs.frozen
class ClaimPack:
    """The runs of a shard's claim.lua calls that do not change between calls, packed once
    (``scripts.pack_run``) for the levels in ``order`` and the token prefix ``prefix``:
    :meth:`call` packs only the token number, N, the rate arguments and the shares. The
    consumer and the queue's config are the worker's own, fixed while it runs."""

    order: list[int]
    prefix: str
    head: bytes
    """Every key, then ARGV[1..7]."""
    nkeys: int
    tail: bytes
    """The group defaults argument."""

    @classmethod
    def make(cls, k: Keys, consumer: str, cfg: QueueConfig, token_prefix: str,
             order: list[int], streams: Sequence[str]) -> ClaimPack:
        keys, args = claim_call(k, consumer, cfg, token_prefix, 0, 0, streams,
                                [0] * len(streams))
        return cls(list(order), token_prefix, pack_run([*keys, *args[:7]]), len(keys),
                   pack_run(args[-1:]))

    def call(self, first: int, n: int, rate: tuple[int, int], shares: Sequence[int]
             ) -> bytes:
        """The packed EVALSHA of ``claim_call(..., first, n, streams, shares)`` (rate: the
        shard's ``QueueConfig.rate_args``)."""
        var = (first, n, *rate, *shares)
        return SCRIPTS["claim"].packed(self.nkeys, self.nkeys + 8 + len(var),
                                       (self.head, pack_run(var), self.tail))


def claim_read(reply: Sequence[Any]) -> int:
    """How many entries a claim.lua reply says were read."""
    return sum((len(rows) - 1) // CLAIM_WIDTH for rows in reply[CLAIM_HEAD:])


def lease_tokens(token_prefix: str, first: int, n: int) -> list[str]:
    """The lease tokens of a claim's n entries, in reading order, as claim.lua names them
    (``<prefix><hex(first + k)>``): one ``%`` format over the run, not a format spec per
    entry (about 500 CPU instructions less per job)."""
    if n <= 0:
        return []
    text = (token_prefix.replace("%", "%%") + "%x\n") * n % tuple(range(first, first + n))
    return text[:-1].split("\n")


def claim_rows(reply: Sequence[Any], token_prefix: str, first: int
               ) -> list[tuple[int, str, str, str, str, int, Any, int, int, int]]:
    """The entries of a claim.lua reply (``claim_call(..., token_prefix, first, ...)``), each
    as (l: the place of its level's stream in the call, 1 = the first; entry id, job id,
    code, token, attempt, data or reason, deadline ms, ms since it entered the stream, ms
    since it was created): the reply in full, for tests and tools (the worker's ``_claim``
    decodes it in place). An entry not started has code 'skip', 'dead', 'paused' or
    'limited' and zeros for the numbers."""
    out: list[tuple[int, str, str, str, str, int, Any, int, int, int]] = []
    k = first
    for rows in reply[CLAIM_HEAD:]:
        level = int(rows[0])
        for i in range(1, len(rows), CLAIM_WIDTH):
            eid, jid, data, t = rows[i:i + CLAIM_WIDTH]
            token = f"{token_prefix}{k:x}"
            k += 1
            if isinstance(t, int):
                out.append((level, eid.decode(), jid.decode(), "run", token, 1, data, 0, t, t))
            elif isinstance(t, list):
                attempt, deadline, wait_ms, age_ms = (int(x) for x in t)
                out.append((level, eid.decode(), jid.decode(), "run", token, attempt, data,
                            deadline, wait_ms, age_ms))
            else:
                out.append((level, eid.decode(), jid.decode(errors="replace"), t.decode(),
                            token, 0, data, 0, 0, 0))
    return out
