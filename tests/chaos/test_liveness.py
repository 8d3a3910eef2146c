"""The chaos run's cron verdict on made-up inputs: a tick whose whole period fell inside a
server outage collapses into the next tick (catch_up='once'); a tick that had time and did
not fire is a violation."""

from __future__ import annotations

from .liveness import CRON_BOUND_S, STARTUP_S, Check, Inputs, Proc, analyse

EVERY_MS = 10_000


def _inputs(fired_ticks_s: list[int], outage: tuple[float, float] | None) -> Inputs:
    faults = [] if outage is None else [{"kind": "loading", "t": outage[0], "t1": outage[1]}]
    jobs = {f"cron:tick:{t}": {"tick_ms": t * 1000, "created_ms": t * 1000 + 200}
            for t in fired_ticks_s}
    scheduler = Proc("s1", "scheduler", pid=1, spawned=0.0, died=None)
    return Inputs(samples=[], faults=faults, procs=[scheduler], starts_by_pid={}, cron_jobs=jobs,
                  cron_entries=[("tick", lambda t_ms: (t_ms // EVERY_MS + 1) * EVERY_MS)],
                  fault_phase=(1000.0, 1100.0), observed_until=1100.0, visibility_s=2.0,
                  reclaim_every_s=1.0)


def _cron(fired: list[int], outage: tuple[float, float] | None) -> Check:
    return analyse(_inputs(fired, outage))["cron"]


def test_every_tick_fired_passes() -> None:
    start = int(1000 + STARTUP_S) // 10 * 10 + 10
    c = _cron(list(range(start, 1100, 10)), None)
    assert c.violations == 0 and c.checked > 0 and "collapsed" not in c.extra


def test_a_tick_whose_period_fell_in_an_outage_collapses_into_the_next() -> None:
    start = int(1000 + STARTUP_S) // 10 * 10 + 10
    ticks = list(range(start, 1100, 10))
    missed = ticks[2]
    # Redis answered LOADING from just before the tick until after the next one was due
    outage = (missed - 0.5, missed + 10.0 + 0.5)
    c = _cron([t for t in ticks if t != missed], outage)
    assert c.violations == 0
    assert [x["tick_ms"] for x in c.extra["collapsed"]] == [missed * 1000]


def test_a_tick_with_time_to_fire_that_never_fired_is_a_violation() -> None:
    start = int(1000 + STARTUP_S) // 10 * 10 + 10
    ticks = list(range(start, 1100, 10))
    missed = ticks[2]
    # a short outage leaves most of the period healthy: the tick had to fire
    c = _cron([t for t in ticks if t != missed], (missed - 0.5, missed + 10.0 - CRON_BOUND_S))
    assert c.violations == 1 and c.examples[0]["problem"] == "never fired"
