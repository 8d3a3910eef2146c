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


@pytest.mark.slow
@pytest.mark.cluster
@pytest.mark.timeout(600)
def test_cluster_chaos_with_a_reshard_up_and_down(tmp_path: Path) -> None:
    """``--reshard``, bounded (about 50 s): 3 -> 6 begun and abandoned half-way (a producer
    or the next call finishes it), then 6 -> 3, while a primary is killed, a slot migrates and
    workers are SIGKILLed; nothing lost, dedup by id exact, the old shards deleted at the end."""
    rep = run_cluster(ClusterOptions(minutes=0.6, seed=SEED, out=tmp_path / "chaos.json",
                                     workdir=tmp_path / "run", verbose=False, reshard=True,
                                     reshard_every_s=8.0, reshard_turns=2, fault_every_s=8.0))
    summary = render_cluster(rep)
    print("\n" + summary)
    assert rep["ok"], summary + f"\n(logs and ledger in {tmp_path / 'run'})"
    assert rep["lost"] == 0 and rep["accepted"] >= 1000, summary
    r = rep["reshard"]
    assert (r["abandoned"], r["down"]) == (1, 1), summary
    assert sum(r["abandoned_finished_by"].values()) == 1, summary
    assert r["resent_not_duplicate_outside_faults"] == r["ids_in_both_homes"] == 0, summary
    assert r["resent_ids"] > 0, summary
    end = r["end"]
    assert end["after"]["live"] == end["after"]["shards"] == 3, summary
    assert end["left_on_old_shards"] == 0, summary
