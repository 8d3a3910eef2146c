"""The worker builds each attempt's Job and Lease without calling their classes
(model.new_job, lease.new_lease: the once-per-job path). Handlers must get the same objects
the classes make: equal, frozen, with every field and method."""

from __future__ import annotations

import attrs
import pytest

from streamq import Job
from streamq._core.context import Context
from streamq._core.model import new_job
from streamq._worker.lease import Lease, new_lease


def test_a_job_built_by_the_worker_is_the_job_the_class_makes() -> None:
    ctx = Context()
    lease = Lease("keys", "j1", "1-1", "t1", 5.0)  # type: ignore[arg-type]
    args = ("j1", "resize", {"w": 3}, 2, 5, "images", 1, "idem-1", {"h": "v"}, {"tp": "x"},
            123, 4, None, lease, ctx)
    made, built = new_job(*args), Job(*args)
    assert made == built and made.__dict__ == built.__dict__
    assert made.dependency_results() == [] and made.previous_result() is None
    assert not made.cancel_requested
    lease.set()
    assert made.cancel_requested
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        made.payload = {}


def test_a_lease_built_by_the_fetch_path_is_the_lease_the_class_makes() -> None:
    made = new_lease("keys", "j1", "1-1", "t1", 5.0)  # type: ignore[arg-type]
    built = Lease("keys", "j1", "1-1", "t1", 5.0)  # type: ignore[arg-type]
    for field in attrs.fields(Lease):
        assert getattr(made, field.name) == getattr(built, field.name), field.name
    assert made.cancel is made and not made.is_set()
    made.set()
    assert made.is_set() and not built.is_set()
