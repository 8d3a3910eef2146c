"""``streamq reshard QUEUE N``: change a queue's shard count while producers and workers run
(docs/scaling.md#resharding); ``--status`` says where it stands, ``--wait`` waits until the
old shards are drained and deleted (running the finish step itself meanwhile)."""

from __future__ import annotations

import argparse
import time
from typing import Any

import attrs

from .._core.errors import InvalidArgument
from ..admin import Admin
from .common import Ctx, _duration

WAIT_EVERY_S = 1.0


def cmd_reshard(ctx: Ctx) -> None:
    a = ctx.args
    queue = ctx.queue(a.queue)
    admin = ctx.admin
    if a.min_replicas:  # a barrier and WAIT after its writes, as a producer's (ReplicationTimeout)
        admin = Admin(admin.client, attrs.evolve(ctx.config, min_replicas=a.min_replicas))
    if a.count is None and not (a.status or a.wait):
        raise InvalidArgument("reshard needs a shard count N (or --status, --wait)")
    st = admin.reshard(queue, a.count) if a.count is not None else admin.reshard_status(queue)
    if a.wait:
        end = time.monotonic() + a.timeout
        while True:
            st = admin.reshard_finish(queue)  # (safe to repeat; workers run it too)
            if st.done or time.monotonic() >= end:
                break
            time.sleep(WAIT_EVERY_S)
    ctx.out(st, lambda: "\n".join(st.lines()))
    if a.wait and not st.done:
        raise SystemExit(f"old shards of {queue} not all drained after {a.timeout:g}s"
                         " (see above; run again to keep waiting)")


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("reshard", parents=[common],
                       help="change a queue's shard count live; --status, --wait")
    p.add_argument("queue")
    p.add_argument("count", nargs="?", type=int, metavar="N",
                   help="the new shard count (1..256); omit with --status or --wait")
    p.add_argument("--status", action="store_true", help="where the reshard stands")
    p.add_argument("--wait", action="store_true",
                   help="wait until the old shards are drained and deleted")
    p.add_argument("--timeout", type=_duration, default=600.0, metavar="DURATION",
                   help="--wait at most this long (default 10m)")
    p.add_argument("--min-replicas", type=int, default=0, metavar="N",
                   help="WAIT until N replicas have the reshard's writes (up to 1 s; fails"
                        " when fewer confirm: run it again); default 0, no WAIT")
