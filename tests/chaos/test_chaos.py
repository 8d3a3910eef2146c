"""The bounded chaos run (about 2-3 minutes): the same harness as ``make soak``, shorter.

The seed is fixed (``STREAMQ_CHAOS_SEED`` overrides it) so a failure can be replayed; timing
still differs from run to run. Every fault kind is injected at least once: the first faults of
a run are one of each kind (in a seeded order), which takes about a minute. On failure the
Redis directory, ledger and process logs are kept in the test's temporary directory (the path
is in the message).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from .harness import FAULTS, REPORT_KINDS, Options, render, run

SEED = int(os.environ.get("STREAMQ_CHAOS_SEED", "20261122"))
MINUTES = float(os.environ.get("STREAMQ_CHAOS_MINUTES", "2"))
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(int(MINUTES * 60) + 360)
def test_chaos_bounded_run(tmp_path: Path) -> None:
    rep = run(Options(minutes=MINUTES, seed=SEED, out=tmp_path / "chaos.json",
                      workdir=tmp_path / "run", verbose=False))
    summary = render(rep)
    print("\n" + summary)
    where = f"\n(logs, ledger and Redis directory in {tmp_path / 'run'})"
    assert rep["ok"], summary + where
    assert rep["lost"] == 0 and rep["wrong_state"] == 0, summary + where
    assert rep["accepted"] >= 10_000 * MINUTES / 2, summary
    assert all(rep["faults"][f] >= 1 for f in FAULTS), summary
    assert rep["duplicates_by_cause"]["unexplained"] == 0, summary + where
    assert rep["keyspace"] == {"stream_len": 0, "pel": 0, "delayed": 0,
                               "dead_len": rep["jobs"]["fail"]["accepted"]}, summary
    # every loop was seen making progress, and no check was vacuous
    assert set(rep["liveness_checks"]) == {"heartbeat", "fetch", "promotion", "cron",
                                           "dead_owner"}, summary
    for name, c in rep["liveness_checks"].items():
        assert c["ok"], f"liveness {name}: {c}\n{summary}{where}"
        if name != "dead_owner":  # only when a killed worker held work at that instant
            assert c["checked"] > 0, f"liveness {name} checked nothing\n{summary}"
    assert set(rep["jobs"]) == set(REPORT_KINDS) and rep["jobs"]["cron"]["accepted"] > 0, summary


def test_worker_and_scheduler_take_wall_time_from_time_time() -> None:
    """The clock-step faults patch ``time.time``/``time.time_ns`` in the children
    (``fakeclock.py``); a worker or scheduler that read the wall clock another way would
    escape them. ``streamq stats --watch`` (``cli/ops.py``) only prints the time."""
    other = re.compile(r"datetime\.now\(|\.utcnow\(|date\.today\(|clock_gettime\(|"
                       r"CLOCK_REALTIME|\.today\(\)")
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
             for d in ("streamq", "schedulers") for p in sorted((ROOT / d).rglob("*.py"))
             if p.parts[-2:] != ("cli", "ops.py") and "dashboard" not in p.parts
             for n, line in enumerate(p.read_text().splitlines(), 1) if other.search(line)]
    assert not found, found
