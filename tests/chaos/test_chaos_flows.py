"""The bounded flow chaos run (about 70-90 s): ``python -m tests.chaos --cluster --flows``,
at a tenth of the long run's sizes. On the loopback Redis Cluster (3 primaries, 3 replicas),
two sharded queues carry a 1,000 -> 1 fan-in, a 100-step chain whose steps alternate between
the queues, a 200-node random DAG with fail / continue / ignore edges and handlers that fail on
purpose, and two batches with callbacks, while workers (the relays) are SIGKILLed and stopped
gracefully and a primary is SIGKILLed and failed over. Checked against the ledger kept outside
Redis: every node that should run ran (a duplicate only inside a fault's window), none started
before its dependencies were terminal, no parent was left waiting a repair interval after its
last dependency ended, each policy did what docs/workflows.md says, and no workflow key is left
but the ones a dead-lettered job keeps for its re-drive. Marked ``cluster`` and ``slow``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from .flows import FLOW_FAULTS, LONG, FlowOptions, render_flows, run_flows

SEED = int(os.environ.get("STREAMQ_CHAOS_SEED", "20261129"))


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_flows_under_worker_kills_stops_and_failover(tmp_path: Path) -> None:
    sizes: dict[str, Any] = {k: v // 10 for k, v in LONG.items()}
    # strand_slack_s: CI's machine may be loaded; 5 s + 10 s is still half the production
    # repair interval (30 s), and a stranded parent would never be released at all
    rep = run_flows(FlowOptions(minutes=0.75, seed=SEED, concurrency=4, out=tmp_path / "f.json",
                                workdir=tmp_path / "run", verbose=False, strand_slack_s=10.0,
                                **sizes))
    summary = render_flows(rep)
    print("\n" + summary)
    assert rep["ok"], summary + f"\n(logs and ledger in {tmp_path / 'run'})"
    assert all(rep["faults"][f] >= 1 for f in FLOW_FAULTS), summary
    flows = rep["flows"]
    assert flows["fan"]["completed"] == sizes["fan"] + 1, summary
    assert flows["chain"]["completed"] == sizes["chain"], summary
    # the DAG's policies were all at work: some nodes dead-lettered by a fail edge, some run
    # after a dead dependency under continue / ignore (the checks above hold each to its rule)
    assert 0 < flows["dag"]["failed"] < sizes["dag"], summary
    assert flows["bat2"]["cancelled"] == 1, summary  # on_death: no job died
    assert rep["keys_left"]["n_unexpected"] == 0, summary
