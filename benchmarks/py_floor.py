"""What a worker's Python costs per job at the least: ``python -m benchmarks.py_floor``.

Not streamq's worker: a loop over claim replies shaped like claim.lua's were before its
4-value rows (75 entries of 10 elements, RESP bytes; kept so that its figures compare with
those in docs/performance.md) that does only what a worker cannot skip for a no-op job: parse the
reply with hiredis, decode id and token, make a frozen attrs ``Job``, decode the JSON
payload, run the handler's coroutine to its end, and pack the settling call's arguments with
hiredis. No I/O, no event loop, no leases, context, metrics or time limits. Prints the best of
``--rounds`` runs in µs of CPU per job: the floor under ``benchmarks.floor``'s
``worker_run_us`` (docs/performance.md, "Worker CPU per job: a claim's batch in one pass").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from typing import Any

import attrs
import hiredis


@attrs.frozen(slots=False)
class _Job:
    id: str
    type: str
    payload: Any
    attempt: int
    token: str
    queue: str


async def _noop(job: _Job) -> None:
    return None


def _replies(batches: int, n: int) -> list[bytes]:
    out = []
    for _ in range(batches):
        rep = [b"ok", b"", str(n).encode(), b"0"]
        for k in range(n):
            rep += [b"1", b"1795979451791-%d" % k, os.urandom(11).hex().encode(), b"run",
                    b"w1:%x" % k, b"1", b'noop {"n":%d}' % k, b"0", b"3", b"5"]
        out.append(b"*%d\r\n" % len(rep)
                   + b"".join(b"$%d\r\n%s\r\n" % (len(x), x) for x in rep))
    return out


def run(batches: int = 400, n: int = 75) -> float:
    replies = _replies(batches, n)
    t0 = time.process_time()
    for buf in replies:
        reader = hiredis.Reader()
        reader.feed(buf)
        rep: Any = reader.gets()
        settle: list[Any] = []
        for i in range(4, len(rep), 10):
            jid, tok, body = rep[i + 2].decode(), rep[i + 4].decode(), rep[i + 6]
            sp = body.index(b" ")
            job = _Job(jid, body[:sp].decode(), json.loads(body[sp + 1:]), int(rep[i + 5]),
                       tok, "q")
            coro = _noop(job)
            with contextlib.suppress(StopIteration):
                coro.send(None)
            settle += [jid, tok, rep[i + 1]]
        hiredis.pack_command(("EVALSHA", "x" * 40, "3", "a", "b", "c", *settle))
    return (time.process_time() - t0) / (batches * n) * 1e6


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.py_floor")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(json.dumps({"us_per_job": round(min(run() for _ in range(args.rounds)), 2)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
