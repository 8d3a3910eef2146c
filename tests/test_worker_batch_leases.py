"""A claim's batch of leases is held, and a settled batch's leases dropped, in one locked pass
each (LeaseKeeper.add_many / remove_settled): the same leases as one add / remove per job."""

from __future__ import annotations

from streamq._core.keys import Keys
from streamq._worker.lease import Lease, LeaseKeeper


def _keeper() -> LeaseKeeper:
    return LeaseKeeper(lambda: None, "c", 10.0)  # type: ignore[arg-type,return-value]


def test_add_many_holds_each_lease_and_remove_settled_drops_only_its_own_token() -> None:
    k = Keys("q")
    keeper = _keeper()
    leases = [Lease(k, f"j{i}", f"{i}-0", f"t{i}") for i in range(5)]
    keeper.add_many(leases)
    assert all(keeper.holds(k.tag, f"{i}-0") for i in range(5))
    assert sorted(x.entry for x in keeper.snapshot()) == [f"{i}-0" for i in range(5)]
    # entry 1-0 was taken over again under a newer token: its old outcome leaves it held
    keeper.add(Lease(k, "j1", "1-0", "newer"))
    settled = [(f"j{i}", f"{i}-0", f"t{i}", "ok", b"", 0, "") for i in range(3)]
    keeper.remove_settled(k.tag, settled)
    assert sorted(x.entry for x in keeper.snapshot()) == ["1-0", "3-0", "4-0"]
    assert keeper.holds(k.tag, "1-0") and not keeper.holds(k.tag, "0-0")
