"""Cron expressions for planned floors: fields, day rules, windows and errors."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pdscale._cron import Cron, CronError


def _at(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_fields_ranges_steps_and_lists() -> None:
    cron = Cron.parse("*/15 9-17 * * 1-5")
    assert cron.matches(_at(2026, 12, 7, 9, 45))  # a Monday
    assert not cron.matches(_at(2026, 12, 7, 9, 50))
    assert not cron.matches(_at(2026, 12, 6, 10, 0))  # a Sunday
    assert Cron.parse("0 0 * * 7").matches(_at(2026, 12, 6, 0, 0))  # 7 is Sunday too
    assert Cron.parse("30 8,20 1 1 *").matches(_at(2027, 1, 1, 20, 30))


def test_either_day_field_matches_when_both_are_restricted() -> None:
    cron = Cron.parse("0 12 1 * 1")  # the 1st of the month, or a Monday
    assert cron.matches(_at(2026, 12, 1, 12, 0))  # a Tuesday, the 1st
    assert cron.matches(_at(2026, 12, 7, 12, 0))  # a Monday, the 7th
    assert not cron.matches(_at(2026, 12, 8, 12, 0))


def test_a_window_is_active_from_its_start_for_its_duration_and_ahead() -> None:
    cron = Cron.parse("0 9 * * *")
    nine = _at(2026, 12, 7, 9, 0).timestamp()
    assert cron.active(nine, 3600, 0)
    assert cron.active(nine + 3599, 3600, 0)
    assert not cron.active(nine + 3600, 3600, 0)
    assert not cron.active(nine - 120, 3600, 0)
    assert cron.active(nine - 120, 3600, 120)  # asked one lead early
    assert cron.active(_at(2026, 12, 7, 8, 30).timestamp(), 3600, 0, "Europe/Paris")
    assert not cron.active(_at(2026, 12, 7, 9, 30).timestamp(), 3600, 0, "Europe/Paris")


@pytest.mark.parametrize(("text", "says"), [
    ("0 9 * *", "expected five fields"),
    ("60 9 * * *", "minute field '60'"),
    ("0 9-7 * * *", "ranges run low to high"),
    ("0 9 * * mon", r"day of week field 'mon': expected \*, a number"),
    ("*/0 * * * *", "steps are at least 1"),
])
def test_a_bad_expression_says_which_field_and_why(text: str, says: str) -> None:
    with pytest.raises(CronError, match=says):
        Cron.parse(text)
