"""Where a no-op drain's time goes: ``python -m benchmarks.profile_drain [--jobs 20000]``.

Two drains of N pre-enqueued no-op jobs by one worker process (concurrency 100), each
against a fresh private redis-server:

1. unprofiled: worker CPU and redis-server CPU per job, and Redis's own accounting per
   command (``INFO commandstats``; commands run inside a script are counted under their
   own names as well as in EVALSHA's total);
2. the same drain with the worker under ``cProfile`` (which slows Python down, so read its
   shares, not its absolute times): the functions with the most time of their own.

Prints Markdown; ``--out FILE`` also writes it to a file.
"""

from __future__ import annotations

import argparse
import os
import pstats
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis

from streamq import Queue
from streamq._core.server import RedisServer

from .workloads import REPO, _env, _jobs, _last_json, redis_cpu_s, worker_cmd


def _drain(n: int, profile_to: str | None) -> tuple[dict[str, Any], float, dict[str, Any]]:
    with RedisServer() as srv:
        client = redis.Redis.from_url(srv.url)
        with Queue.from_url(srv.url, "prof") as q:
            q.enqueue_many(_jobs(n))
        client.config_resetstat()
        cpu0 = redis_cpu_s(client)
        cmd = worker_cmd(srv.url, "prof", "drain", "--jobs", str(n), "--concurrency", "100")
        if profile_to:
            cmd = [cmd[0], "-m", "cProfile", "-o", profile_to, *cmd[1:]]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, env=_env(),
                              timeout=600, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"drain worker failed: {proc.stderr[-2000:]}")
        rcpu = redis_cpu_s(client) - cpu0
        stats: dict[str, Any] = client.info("commandstats")
        return _last_json(proc.stdout), rcpu, stats


def report(n: int) -> str:
    out, rcpu, stats = _drain(n, None)
    lines = [f"# No-op drain profile: {n:,} jobs, one worker process, concurrency 100", "",
             f"- wall: {n / float(out['wall_s']):,.0f} jobs/s",
             f"- worker CPU: {float(out['cpu_s']) / n * 1e6:.1f} µs per job",
             f"- redis-server CPU: {rcpu / n * 1e6:.1f} µs per job", "",
             "## Redis, per command (INFO commandstats)", "",
             "| command | calls per job | µs per job |", "|---|--:|--:|"]
    rows = sorted(((k.removeprefix("cmdstat_"), v) for k, v in stats.items()),
                  key=lambda kv: -float(kv[1]["usec"]))
    for name, v in rows:
        if float(v["usec"]) / n >= 0.05:
            lines.append(f"| {name} | {int(v['calls']) / n:.3f} | {float(v['usec']) / n:.2f} |")
    with tempfile.TemporaryDirectory() as tmp:
        prof = os.path.join(tmp, "worker.prof")
        _drain(n, prof)
        st = pstats.Stats(prof)
        entries: Any = st.stats  # type: ignore[attr-defined]
        total = sum(v[2] for v in entries.values())
        top = sorted(entries.items(), key=lambda kv: -kv[1][2])[:20]
        lines += ["", "## Worker, by own time under cProfile (shares of the profiled run)", "",
                  "| function | calls per job | share of own time |", "|---|--:|--:|"]
        for (file, line, func), v in top:
            where = f"{Path(file).name}:{line} {func}" if line else func
            lines.append(f"| `{where}` | {v[1] / n:.2f} | {v[2] / total:.1%} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=20_000)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    text = report(args.jobs)
    sys.stdout.write(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
