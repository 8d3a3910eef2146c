"""A promoter-only process for the promotion race test.

Usage: ``python promote_proc.py URL QUEUE READY_FILE GO_FILE TIMEOUT_S``

Connects, writes READY_FILE, waits for GO_FILE to exist (so racing processes start together),
then calls ``Promoter.run_once`` in a tight loop until the delayed ZSET is empty (or TIMEOUT_S
passes). Prints ``{"moved": n, "calls": c, "busy_calls": b}`` as JSON on stdout, where
``busy_calls`` counts calls that saw due candidates.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from streamq import ALL_EVENTS, QueueConfig
from streamq._core.conn import async_client, sync_client
from streamq._core.keys import Keys
from streamq._worker.promote import Promoter


async def run(url: str, queue: str, end: float) -> dict[str, int]:
    client = async_client(url)
    keys = Keys(queue)
    promoter = Promoter(keys, QueueConfig(event_kinds=ALL_EVENTS))  # 'queued' events: checked
    moved = calls = busy = 0
    try:
        await promoter.sync_clock(client)
        while time.monotonic() < end:
            n, more = await promoter.run_once(client)
            calls += 1
            moved += n
            if n or more:
                busy += 1
            if not more and not await client.zcard(keys.delayed):
                break
            if not n and not more:
                await asyncio.sleep(0.001)
    finally:
        await client.aclose()
    return {"moved": moved, "calls": calls, "busy_calls": busy}


def main(argv: list[str]) -> int:
    url, queue, ready, go, timeout_s = argv
    end = time.monotonic() + float(timeout_s)
    probe = sync_client(url)
    probe.ping()  # the server answers and every import is done: ready to race
    probe.close()
    Path(ready).touch()
    while not Path(go).exists():
        if time.monotonic() > end:
            raise SystemExit("promote_proc: never told to go")
        time.sleep(0.002)
    out = asyncio.run(run(url, queue, end))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
