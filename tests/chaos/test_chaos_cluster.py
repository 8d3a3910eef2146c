"""The bounded cluster chaos run (about 2-3 minutes): ``python -m tests.chaos --cluster``,
shorter. A sharded (3 shards on 3 primaries), grouped (limit 3 per group and shard) and
prioritised (levels 0-4) queue with ``min_replicas=1`` drains on the loopback Redis Cluster
while a primary under it is SIGKILLed (its replica takes over, the node comes back as a
replica) and one of its slots is migrated to another primary, twice each. Every accepted job
ends, its outcome written by a recorded execution; every dead letter is explained; no group
ran over its limit outside a fault. Marked ``cluster`` and ``slow`` (the Valkey leg skips it).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .cluster import CLUSTER_FAULTS, ClusterOptions, render_cluster, run_cluster

SEED = int(os.environ.get("STREAMQ_CHAOS_SEED", "20261129"))


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_cluster_chaos_failover_and_slot_migration(tmp_path: Path) -> None:
    rep = run_cluster(ClusterOptions(minutes=1.5, seed=SEED, out=tmp_path / "chaos.json",
                                     workdir=tmp_path / "run", verbose=False))
    summary = render_cluster(rep)
    print("\n" + summary)
    where = f"\n(logs and ledger in {tmp_path / 'run'})"
    assert rep["ok"], summary + where
    assert rep["lost"] == 0 and rep["accepted"] >= 4000, summary
    assert all(rep["faults"][f] >= 2 for f in CLUSTER_FAULTS), summary
    dead = dict(rep["dead_letters"]["by_reason"])
    assert dead.pop("Fail raised by the handler") == rep["jobs"]["fail"]["accepted"], summary
    assert all(why.startswith("lease lapsed") for why in dead), summary
    assert rep["groups"]["over_limit_outside_faults"] == 0, summary
    assert not rep["unexpected_exits"], summary + where
