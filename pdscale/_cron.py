"""Cron expressions for planned floors: the five standard fields, numbers only.

``minute hour day-of-month month day-of-week``; each field is ``*``, a number, a range
``a-b``, any of those with a step ``/n``, or a comma-separated list of them. Day of week runs
0-7 (0 and 7 are Sunday). As in Vixie cron, when both day fields are restricted a day matching
either matches.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

__all__ = ["Cron", "CronError"]

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
           ("day of week", 0, 7))


class CronError(ValueError):
    """A cron expression that does not parse; the message says which field and why."""


def _field(text: str, name: str, low: int, high: int) -> frozenset[int]:
    values: set[int] = set()
    for part in text.split(","):
        body, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if body == "*":
                start, end = low, high
            elif "-" in body:
                a, b = body.split("-", 1)
                start, end = int(a), int(b)
            else:
                start = int(body)
                end = high if step_text else start
        except ValueError:
            raise CronError(f"{name} field {text!r}: expected *, a number, a range a-b, a "
                            "step /n or a list of them") from None
        if step < 1 or not low <= start <= end <= high:
            raise CronError(f"{name} field {text!r}: values must lie in {low}-{high}, ranges "
                            "run low to high and steps are at least 1")
        values.update(range(start, end + 1, step))
    return frozenset(values)


@dataclass(frozen=True)
class Cron:
    """A parsed expression; :meth:`matches` says whether a minute starts a window."""

    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    """0-6, Sunday 0."""
    days_restricted: bool
    weekdays_restricted: bool

    @classmethod
    @functools.lru_cache(maxsize=256)
    def parse(cls, text: str) -> Cron:
        """The expression parsed (cached: a floor's expression is read every tick)."""
        parts = text.split()
        if len(parts) != 5:
            raise CronError(f"{text!r}: expected five fields (minute hour day-of-month month "
                            f"day-of-week), got {len(parts)}")
        m, h, d, mo, w = (_field(p, *spec) for p, spec in zip(parts, _FIELDS, strict=True))
        return cls(m, h, d, mo, frozenset(x % 7 for x in w), parts[2] != "*", parts[4] != "*")

    def matches(self, at: datetime) -> bool:
        if at.minute not in self.minutes or at.hour not in self.hours or \
                at.month not in self.months:
            return False
        day = at.day in self.days
        weekday = (at.weekday() + 1) % 7 in self.weekdays
        if self.days_restricted and self.weekdays_restricted:
            return day or weekday
        return day and weekday

    def active(self, now_s: float, duration_s: float, ahead_s: float, tz: str = "UTC") -> bool:
        """Whether a window of ``duration_s`` that starts at a matching minute covers any
        moment of [``now_s``, ``now_s + ahead_s``]: a start within
        (now - duration, now + ahead]."""
        zone = ZoneInfo(tz)
        latest = datetime.fromtimestamp(now_s + ahead_s, zone).replace(second=0, microsecond=0)
        earliest = datetime.fromtimestamp(now_s - duration_s, zone)
        at = latest
        while at > earliest:
            if self.matches(at):
                return True
            at -= timedelta(minutes=1)
        return False
