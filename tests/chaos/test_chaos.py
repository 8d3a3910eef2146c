"""The bounded chaos runs: the same harness as ``make soak``, shorter. The full menu (about
2-3 minutes), and the graceful stops alone (about 1 minute), which must dead-letter nothing.

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

from .common import GRACEFUL_FAULTS
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
                               "dead_len": rep["dead_letters"]["total"]}, summary
    # the always-failing jobs, and max_attempts=1 or last-retry jobs whose lease lapsed in a
    # fault (each explained: the run would have failed otherwise); never a completing job
    dead = rep["dead_letters"]["by_reason"]
    assert dead["Fail raised by the handler"] == rep["jobs"]["fail"]["accepted"], summary
    assert all(why.startswith(("Fail", "lease lapsed")) for why in dead), summary
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


GRACEFUL_MIX = (20, 5, 5, 10, 5, 5, 35, 15)
"""instant, delayed, retry, slow, slow_sync, fail, once (max_attempts=1), last (2nd attempt is
the last): mostly jobs with no attempt to spare, many of them running for a while."""


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_chaos_graceful_stops_dead_letter_nothing(tmp_path: Path) -> None:
    """Deploys and reloads only: SIGTERM with a short grace period (running jobs handed back)
    and a long one, and ``uvicorn --reload``-style restarts of the embedded worker (in the
    process, and a replacement process), a fault every ~2 s for a minute, while jobs with
    ``max_attempts=1`` and jobs on their last retry flow. No lease lapses, so no job may be
    dead-lettered but the always-failing ones, and every handler interrupted by a stop must run
    again under the same attempt number (refunded, invariant 15). With release.lua's refund
    taken out, jobs handed back at a stop are dead-lettered never run (or run fewer times than
    max_attempts) and the run fails: checked by hand, see docs/reliability.md."""
    seed = int(os.environ.get("STREAMQ_CHAOS_SEED", "20261129"))
    rep = run(Options(minutes=1.0, seed=seed, out=tmp_path / "chaos.json",
                      workdir=tmp_path / "run", verbose=False, faults=GRACEFUL_FAULTS,
                      fault_every_s=2.0, filler_keys=0, mix=GRACEFUL_MIX))
    summary = render(rep)
    print("\n" + summary)
    where = f"\n(logs, ledger and Redis directory in {tmp_path / 'run'})"
    assert rep["ok"], summary + where
    assert rep["lost"] == 0 and rep["wrong_state"] == 0, summary + where
    assert all(rep["faults"][f] >= 1 for f in GRACEFUL_FAULTS), summary
    assert sum(rep["faults"].values()) >= 10, summary
    # a starved machine may stall a worker past its lease (the watchdog sees it): only that
    # may dead-letter a job here; a graceful stop never does
    dead = dict(rep["dead_letters"]["by_reason"])
    assert dead.pop("Fail raised by the handler") == rep["jobs"]["fail"]["accepted"], summary
    assert set(dead) <= {"lease lapsed: stall"}, summary + where
    assert rep["jobs"]["once"]["accepted"] > 1000 and rep["jobs"]["last"]["accepted"] > 500
    assert rep["jobs"]["once"]["completed"] + rep["jobs"]["last"]["completed"] \
        + sum(dead.values()) == rep["jobs"]["once"]["accepted"] + rep["jobs"]["last"]["accepted"]
    # not vacuous: stops did interrupt running handlers, whose attempts then ran again
    assert rep["duplicates_by_cause"]["handed_back"] > 0, summary
    lapses = {k for k, n in rep["duplicates_by_cause"].items() if n}
    assert lapses <= {"handed_back", "stall"}, summary + where
    assert rep["keyspace"] == {"stream_len": 0, "pel": 0, "delayed": 0,
                               "dead_len": rep["dead_letters"]["total"]}, summary
