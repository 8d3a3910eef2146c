"""The bounded chaos run (about 2-3 minutes): the same harness as ``make soak``, shorter.

The seed is fixed (``STREAMQ_CHAOS_SEED`` overrides it) so a failure can be replayed; timing
still differs from run to run. On failure the Redis directory, ledger and process logs are
kept in the test's temporary directory (the path is in the message).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .harness import FAULTS, Options, render, run

SEED = int(os.environ.get("STREAMQ_CHAOS_SEED", "20261122"))
MINUTES = float(os.environ.get("STREAMQ_CHAOS_MINUTES", "2"))


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
