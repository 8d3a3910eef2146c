"""The workflows comparison's report (benchmarks/peers/flows.py): ratios are paired within a
repetition, failures are shown, not dropped. Pure functions: no Redis, no peer."""

from __future__ import annotations

from typing import Any

from benchmarks.peers.flows import paired, ratios, render


def _run(rep: int, what: str, per_s: float, **extra: Any) -> dict[str, Any]:
    return {"rep": rep, "what": what, "per_s": per_s, "enqueue_s": 0.5,
            "after_enqueue_s": 0.1, "worker_cpu_us_per_job": 50.0,
            "redis_cpu_us_per_job": 40.0, "load1": 1.0, **extra}


def _doc() -> dict[str, Any]:
    res = {
        "streamq": {"plain": [_run(1, "plain", 1000), _run(2, "plain", 2000)],
                    "fan": [_run(1, "fan", 600), _run(2, "fan", 1000)],
                    "fandeps": [_run(1, "fandeps", 800), _run(2, "fandeps", 1600)],
                    "chain": [_run(1, "chain", 100), _run(2, "chain", 300)],
                    "plain_pre": [_run(1, "plain", 1000)],
                    "fan_pre": [_run(1, "fan", 900)]},
        "celery": {"plain": [_run(1, "plain", 100), _run(2, "plain", 400)],
                   "fan": [{"rep": 1, "error": "RuntimeError: timed out after 600 s; 9000"
                                               " children/steps done", "load1": 2.0}],
                   "chain": [_run(1, "chain", 50), _run(2, "chain", 100)]},
    }
    doc: dict[str, Any] = {
        "machine": {"timestamp": "t", "cores": 2, "cpu": "x", "redis_server": "7",
                    "python": "3.11", "streamq": "0", "commit": "abc"},
        "command": "python -m benchmarks.peers --flows", "duration_s": 60.0,
        "load_avg_start": 1.0, "load_avg_end": 2.0, "reps": 2,
        "sizes": {"fan": 10_000, "chain": 1_000}, "results": res,
        "notes": {"celery": {"fan": "timed out; not repeated"}}}
    doc["ratios"] = ratios(doc)
    return doc


def test_ratios_are_paired_within_a_repetition() -> None:
    r = paired(_doc()["results"]["streamq"]["fan"], _doc()["results"]["streamq"]["plain"])
    assert r is not None
    assert (r["min"], r["max"], r["n"]) == (0.5, 0.6, 2)
    # streamq over celery, chain: rep 1 100/50 = 2, rep 2 300/100 = 3: median 2.5
    chain = _doc()["ratios"]["streamq_over_peer"]["celery"]["chain"]
    assert chain["median"] == 2.5


def test_a_failed_peer_is_reported_with_its_error() -> None:
    doc = _doc()
    assert doc["ratios"]["streamq_over_peer"]["celery"]["fan"] is None
    md = render(doc)
    assert "**failed**: RuntimeError: timed out after 600 s; 9000 children/steps done" in md
    assert "celery fan: timed out; not repeated" in md
    assert "streamq (`depends_on`)" in md
    assert "| celery | n/a |" not in md
    assert "| streamq | 1,000 | 900 | 0.90 |" in md  # the prefilled table
