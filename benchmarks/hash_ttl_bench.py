"""Hash-field TTL against a key per entry, for dedup keys (docs/performance.md, newer servers).

    python -m benchmarks.hash_ttl_bench --server /path/to/valkey-server [--entries 100000]

Today a dedup key is one STRING per key (``SET <prefix>:{Q}:dd:<key> <job id> PX <ttl>``,
read with GET). A server with hash-field TTL (``HSETEX``: Valkey 9.0+, Redis 8.0+) could keep
them as fields of one HASH per queue shard (``HSETEX <prefix>:{Q}:dd PX <ttl> FIELDS 1 <key>
<job id>``, read with HGET). For ``entries`` entries each way, in pipelines of 1,000, on a
private server (persistence off): server CPU µs per call from INFO commandstats (the server's
own time, not the client's; steadier than wall time on a shared machine), and the memory
each entry adds (used_memory before and after, divided by entries). Run ``--rounds`` times,
interleaved (strings, hash, strings, hash…), and the medians are printed as JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

import redis

from streamq._core.server import RedisServer

TTL_MS = 600_000
BATCH = 1000


def _usec(client: redis.Redis, cmd: str) -> float:
    stats: Any = client.info("commandstats")
    row = stats.get(f"cmdstat_{cmd}")
    return float(row["usec_per_call"]) if row else float("nan")


def _mem(client: redis.Redis) -> int:
    info: Any = client.info("memory")
    return int(info["used_memory"])


def _round(client: Any, entries: int, hashed: bool) -> dict[str, float]:
    client.execute_command("FLUSHALL", "SYNC")  # not lazily: used_memory must settle first
    client.config_resetstat()
    before = _mem(client)
    for start in range(0, entries, BATCH):
        pipe: Any = client.pipeline(transaction=False)
        for i in range(start, min(entries, start + BATCH)):
            if hashed:
                pipe.execute_command("HSETEX", "streamq:{q}:dd", "PX", TTL_MS, "FIELDS", 1,
                                     f"user:{i}", f"job-{i:012d}")
            else:
                pipe.execute_command("SET", f"streamq:{{q}}:dd:user:{i}", f"job-{i:012d}",
                                     "PX", TTL_MS)
        pipe.execute()
    grown = _mem(client) - before
    for start in range(0, entries, BATCH):
        pipe = client.pipeline(transaction=False)
        for i in range(start, min(entries, start + BATCH)):
            if hashed:
                pipe.execute_command("HGET", "streamq:{q}:dd", f"user:{i}")
            else:
                pipe.execute_command("GET", f"streamq:{{q}}:dd:user:{i}")
        pipe.execute()
    write, read = ("hsetex", "hget") if hashed else ("set", "get")
    return {"write_usec": _usec(client, write), "read_usec": _usec(client, read),
            "bytes_per_entry": grown / entries}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", required=True, help="a server binary with HSETEX")
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    with RedisServer(binary=args.server) as srv:
        client: Any = redis.Redis(port=srv.port, protocol=2)
        version = client.info("server")
        rows: dict[str, list[dict[str, float]]] = {"strings": [], "hash": []}
        for _ in range(args.rounds):
            rows["strings"].append(_round(client, args.entries, False))
            rows["hash"].append(_round(client, args.entries, True))
        out: dict[str, Any] = {"server": version.get("valkey_version")
                               or version.get("redis_version"), "entries": args.entries,
                               "rounds": args.rounds}
        for name, got in rows.items():
            out[name] = {k: round(statistics.median(r[k] for r in got), 3) for k in got[0]}
        print(json.dumps(out, indent=2))
        client.close()


if __name__ == "__main__":
    main()
