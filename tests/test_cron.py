"""The cron parser: fields, macros, Vixie day semantics, time zones and DST, bad input."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedulers import CronExpr
from streamq import InvalidArgument

UTC = dt.UTC


def at(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
       ) -> dt.datetime:
    return dt.datetime(year, month, day, hour, minute, second, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expr", "after", "expected"),
    [
        ("* * * * *", at(2026, 1, 1, 0, 0, 30), at(2026, 1, 1, 0, 1)),
        ("*/15 * * * *", at(2026, 1, 1, 0, 15), at(2026, 1, 1, 0, 30)),
        ("0 6 * * *", at(2026, 1, 1, 6, 0), at(2026, 1, 2, 6, 0)),
        ("30 9 1 * *", at(2026, 1, 15), at(2026, 2, 1, 9, 30)),
        ("0 0 29 2 *", at(2026, 3, 1), at(2028, 2, 29)),  # leap day
        ("0 12 * * MON-FRI", at(2026, 11, 21, 13), at(2026, 11, 23, 12)),  # Sat -> Mon
        ("0 0 * * 7", at(2026, 11, 16), at(2026, 11, 22)),  # 7 is Sunday
        ("0 0 13 * 5", at(2026, 11, 1), at(2026, 11, 6)),  # Friday OR the 13th (Vixie)
        ("0 0 */2 * MON", at(2026, 11, 1), at(2026, 11, 9)),  # '*/2' is unrestricted: AND
        ("0 0 1 JAN,jul *", at(2026, 2, 1), at(2026, 7, 1)),
        ("5-10/5 * * * *", at(2026, 1, 1, 0, 6), at(2026, 1, 1, 0, 10)),
        ("@hourly", at(2026, 1, 1, 10, 0), at(2026, 1, 1, 11, 0)),
        ("@daily", at(2026, 1, 1, 10, 0), at(2026, 1, 2)),
        ("@weekly", at(2026, 11, 22), at(2026, 11, 29)),
        ("@monthly", at(2026, 11, 22), at(2026, 12, 1)),
        ("@yearly", at(2026, 11, 22), at(2027, 1, 1)),
    ],
)
def test_next_after(expr: str, after: dt.datetime, expected: dt.datetime) -> None:
    assert CronExpr(expr).next_after(after) == expected


def test_time_zone_and_daylight_saving() -> None:
    berlin = "Europe/Berlin"
    daily = CronExpr("0 6 * * *", tz=berlin)
    # 06:00 Berlin is 05:00 UTC in winter and 04:00 UTC in summer
    assert daily.next_after(at(2026, 1, 10)) == at(2026, 1, 10, 5)
    assert daily.next_after(at(2026, 7, 10)) == at(2026, 7, 10, 4)
    # 02:30 does not exist on 2026-03-29 in Berlin: skipped, next is the following day
    gap = CronExpr("30 2 * * *", tz=berlin)
    assert gap.next_after(at(2026, 3, 28, 12)) == at(2026, 3, 30, 0, 30)
    # 02:30 happens twice on 2026-10-25: fires once, at the first occurrence (00:30 UTC)
    twice = CronExpr("30 2 * * *", tz=berlin)
    first = twice.next_after(at(2026, 10, 24, 12))
    assert first == at(2026, 10, 25, 0, 30)
    assert twice.next_after(first) == at(2026, 10, 26, 1, 30)
    every_minute = CronExpr("* * * * *", tz=berlin)
    t = at(2026, 10, 25, 0, 58)  # 02:58 CEST, just before the clocks go back
    seen = []
    for _ in range(4):
        t = every_minute.next_after(t)
        seen.append(t)
    assert seen == [at(2026, 10, 25, 0, 59), at(2026, 10, 25, 2, 0), at(2026, 10, 25, 2, 1),
                    at(2026, 10, 25, 2, 2)]


@pytest.mark.parametrize(
    "expr",
    ["", "* * * *", "* * * * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *",
     "* * * * 8", "*/0 * * * *", "5-1 * * * *", "a * * * *", "1,,2 * * * *", "0 0 31 2 *",
     "* * * FOO *"],
)
def test_bad_expressions_are_typed_errors(expr: str) -> None:
    with pytest.raises(InvalidArgument):
        CronExpr(expr)


def test_bad_time_zone_and_naive_datetimes() -> None:
    with pytest.raises(InvalidArgument, match="time zone"):
        CronExpr("* * * * *", tz="Mars/Olympus")
    with pytest.raises(InvalidArgument, match="aware"):
        CronExpr("* * * * *").next_after(dt.datetime(2026, 1, 1))


def _brute(expr: CronExpr, after: dt.datetime) -> dt.datetime:
    t = after.replace(second=0, microsecond=0) + dt.timedelta(minutes=1)
    for _ in range(60 * 24 * 400):
        dom, dow = t.day in expr.days, (t.isoweekday() % 7) in expr.weekdays
        day = (dom and dow) if (expr.dom_any or expr.dow_any) else (dom or dow)
        if (t.minute in expr.minutes and t.hour in expr.hours and t.month in expr.months
                and day):
            return t
        t += dt.timedelta(minutes=1)
    raise AssertionError("no match within 400 days")


@settings(max_examples=60, deadline=None)
@given(minute=st.sampled_from(["*", "0", "*/13", "5,40", "10-20/5"]),
       hour=st.sampled_from(["*", "0", "*/5", "9-17", "23"]),
       dom=st.sampled_from(["*", "1", "15", "1-7", "*/10"]),
       month=st.sampled_from(["*", "2", "*/3", "6-8"]),
       dow=st.sampled_from(["*", "0", "1-5", "6,0"]),
       offset_min=st.integers(0, 60 * 24 * 200))
def test_matches_a_brute_force_scan(minute: str, hour: str, dom: str, month: str, dow: str,
                                    offset_min: int) -> None:
    expr = CronExpr(f"{minute} {hour} {dom} {month} {dow}")
    after = at(2026, 1, 1) + dt.timedelta(minutes=offset_min, seconds=17)
    assert expr.next_after(after) == _brute(expr, after)
