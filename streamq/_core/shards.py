"""The shard count stored with a queue, checked by every part that opens one (producer,
worker, scheduler, spark, the admin API) before it writes (docs/scaling.md)."""

from __future__ import annotations

from .driver import Cmd, Op, ok
from .errors import ShardCountMismatch
from .keys import Keys

SHARDS_FIELD = "shards"


def check(keys: Keys, shards: int) -> Op[int]:
    """Compare ``shards`` with the count stored with the queue (``keys.meta`` on shard 0)
    and store it when the queue has none yet. A queue with keys and no stored count has 1
    shard (the layout before sharding). Raises ShardCountMismatch; writes nothing then.

    Safe to repeat: HSETNX writes only the first count; a second caller reads it back. The
    unsharded count is never written (an N = 1 queue keeps exactly its old keys). Two first
    users at once agree: keys found after an empty read send the reader back to the count
    (the other one stored it before its first key)."""
    k0 = keys.of_shard(0)
    (stored,) = yield [Cmd.of("HGET", k0.meta, SHARDS_FIELD)]
    if stored is None or isinstance(stored, Exception):
        ok(stored)
        if shards == 1:
            return 1
        (present,) = yield [Cmd.of("EXISTS", k0.stream, k0.delayed, k0.dead, k0.stats)]
        if ok(present):
            # another first user may have stored its count and created keys since the HGET
            # (it stores the count before it writes a key): read the count again
            (again,) = yield [Cmd.of("HGET", k0.meta, SHARDS_FIELD)]
            if ok(again) is None:
                raise ShardCountMismatch(keys.queue, shards, 1)
            stored = again
        else:
            (wrote,) = yield [Cmd.of("HSETNX", k0.meta, SHARDS_FIELD, shards)]
            if ok(wrote):
                return shards
            (stored,) = yield [Cmd.of("HGET", k0.meta, SHARDS_FIELD)]
    n = int(ok(stored))
    if n != shards:
        raise ShardCountMismatch(keys.queue, shards, n)
    return n
