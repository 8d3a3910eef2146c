"""Five-field cron expressions in a time zone, with stdlib zoneinfo; no dependency.

Fields: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or JAN-DEC),
day of week (0-7 or SUN-SAT; 0 and 7 are Sunday). Each field takes ``*``, numbers, ranges
``a-b``, steps ``*/n`` or ``a-b/n``, and lists ``a,b,c``. Macros: @yearly (@annually),
@monthly, @weekly, @daily (@midnight), @hourly.

As in Vixie cron, when both day of month and day of week are restricted (neither starts
with ``*``), a day matches if either matches; otherwise both must match (``*/2`` counts as
unrestricted: ``0 0 */2 * MON`` fires on Mondays that fall on odd days).

Daylight saving time: wall-clock times that do not exist (the spring-forward gap) are
skipped; wall-clock times that happen twice (the fall-back hour) fire once, at the first
occurrence.
"""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs

from streamq import InvalidArgument

_MACROS = {
    "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTHS = {m: i for i, m in enumerate(
    ["JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC"], 1)}
_DAYS = {d: i for i, d in enumerate(["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"])}
_SEARCH_YEARS = 5  # an expression that matches nothing within this many years is an error


def _value(token: str, names: dict[str, int], lo: int, hi: int, field: str) -> int:
    upper = token.upper()
    if upper in names:
        return names[upper]
    if not token.isdigit():
        raise InvalidArgument(f"cron {field}: {token!r} is not a number")
    v = int(token)
    if not lo <= v <= hi:
        raise InvalidArgument(f"cron {field}: {v} is outside {lo}-{hi}")
    return v


def _field(text: str, lo: int, hi: int, field: str, names: dict[str, int] | None = None
           ) -> frozenset[int]:
    names = names or {}
    out: set[int] = set()
    for part in text.split(","):
        if not part:
            raise InvalidArgument(f"cron {field}: empty list item in {text!r}")
        rng, _, step_s = part.partition("/")
        step = 1
        if step_s:
            if not step_s.isdigit() or int(step_s) == 0:
                raise InvalidArgument(f"cron {field}: bad step {step_s!r}")
            step = int(step_s)
        if rng == "*":
            start, end = lo, hi
        elif "-" in rng:
            a, _, b = rng.partition("-")
            start, end = _value(a, names, lo, hi, field), _value(b, names, lo, hi, field)
            if start > end:
                raise InvalidArgument(f"cron {field}: range {rng!r} runs backwards")
        else:
            start = _value(rng, names, lo, hi, field)
            end = hi if step_s else start
        out.update(range(start, end + 1, step))
    return frozenset(out)


@attrs.frozen
class CronExpr:
    """A parsed cron expression; ``next_after(t)`` is the first fire time strictly after t."""

    text: str
    tz: str = "UTC"
    minutes: frozenset[int] = attrs.field(init=False)
    hours: frozenset[int] = attrs.field(init=False)
    days: frozenset[int] = attrs.field(init=False)
    months: frozenset[int] = attrs.field(init=False)
    weekdays: frozenset[int] = attrs.field(init=False)
    dom_any: bool = attrs.field(init=False)
    dow_any: bool = attrs.field(init=False)
    zone: ZoneInfo = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.text, str):
            raise InvalidArgument("a cron expression must be a string")
        text = _MACROS.get(self.text.strip().lower(), self.text.strip())
        parts = text.split()
        if len(parts) != 5:
            raise InvalidArgument(f"cron expression {self.text!r} needs 5 fields, has {len(parts)}")
        try:
            zone = ZoneInfo(self.tz)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise InvalidArgument(f"unknown time zone {self.tz!r}") from exc
        dow = _field(parts[4], 0, 7, "day of week", _DAYS)
        values = {
            "minutes": _field(parts[0], 0, 59, "minute"),
            "hours": _field(parts[1], 0, 23, "hour"),
            "days": _field(parts[2], 1, 31, "day of month"),
            "months": _field(parts[3], 1, 12, "month", _MONTHS),
            "weekdays": frozenset(d % 7 for d in dow),
            "dom_any": parts[2].startswith("*"),
            "dow_any": parts[4].startswith("*"),
            "zone": zone,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)
        self.next_after(dt.datetime(2000, 1, 1, tzinfo=dt.UTC))  # matches something

    def _day_matches(self, d: dt.date) -> bool:
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.dom_any or self.dow_any:  # Vixie: a field starting with '*' is unrestricted,
            return dom and dow            # and the two are ANDed
        return dom or dow

    def next_after(self, t: dt.datetime) -> dt.datetime:
        """The first fire time strictly after ``t`` (aware), as an aware UTC datetime."""
        if t.tzinfo is None:
            raise InvalidArgument("next_after needs an aware datetime")
        local = t.astimezone(self.zone)
        day = local.date()
        after = (local.hour, local.minute)
        for _ in range(366 * _SEARCH_YEARS):
            if day.month in self.months and self._day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        if (hour, minute) <= after:
                            continue
                        wall = dt.datetime(day.year, day.month, day.day, hour, minute,
                                           tzinfo=self.zone)
                        utc = wall.astimezone(dt.UTC)
                        if utc.astimezone(self.zone).replace(tzinfo=None) != wall.replace(
                                tzinfo=None):
                            continue  # in the spring-forward gap: this wall time does not exist
                        if utc <= t:
                            continue  # the second pass through a fall-back hour
                        return utc
            day += dt.timedelta(days=1)
            after = (-1, -1)
        raise InvalidArgument(f"cron expression {self.text!r} never fires")


def prev_at_or_before(expr: CronExpr, t: dt.datetime) -> dt.datetime | None:
    """The latest fire time at or before ``t`` within the search window, or None."""
    local = t.astimezone(expr.zone)
    day = local.date()
    upto = (local.hour, local.minute)
    for _ in range(366 * _SEARCH_YEARS):
        if day.month in expr.months and expr._day_matches(day):
            for hour in sorted(expr.hours, reverse=True):
                for minute in sorted(expr.minutes, reverse=True):
                    if (hour, minute) > upto:
                        continue
                    wall = dt.datetime(day.year, day.month, day.day, hour, minute,
                                       tzinfo=expr.zone)
                    utc = wall.astimezone(dt.UTC)
                    if utc.astimezone(expr.zone).replace(tzinfo=None) != wall.replace(
                            tzinfo=None):
                        continue  # in the spring-forward gap
                    if utc > t:
                        continue
                    return utc
        day -= dt.timedelta(days=1)
        upto = (24, 60)
    return None
