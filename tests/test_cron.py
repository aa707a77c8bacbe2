"""kl's five-field cron parser (kilolock.cron): what `kl schedule set --cron` accepts and when it fires."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from kilolock.cron import CronError, parse

UTC = timezone.utc


def t(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


@pytest.mark.parametrize(("expr", "after", "expected"), [
    ("* * * * *", t(2026, 1, 1, 10, 0, 30), t(2026, 1, 1, 10, 1)),  # strictly after, whole minutes
    ("0 * * * *", t(2026, 1, 1, 10, 0), t(2026, 1, 1, 11, 0)),
    ("*/15 * * * *", t(2026, 1, 1, 10, 16), t(2026, 1, 1, 10, 30)),
    ("5/20 * * * *", t(2026, 1, 1, 10, 26), t(2026, 1, 1, 10, 45)),
    ("0 9-17/4 * * *", t(2026, 1, 1, 13, 0), t(2026, 1, 1, 17, 0)),
    ("30 2 * * *", t(2026, 1, 1, 3, 0), t(2026, 1, 2, 2, 30)),
    ("0 0 1 * *", t(2026, 1, 31, 12, 0), t(2026, 2, 1, 0, 0)),
    ("0 0 31 * *", t(2026, 2, 1, 0, 0), t(2026, 3, 31, 0, 0)),  # months without a 31st are skipped
    ("0 0 29 2 *", t(2026, 3, 1), t(2028, 2, 29)),  # leap day
    ("0 12 * * mon-fri", t(2026, 11, 28, 0, 0), t(2026, 11, 30, 12, 0)),  # Saturday -> Monday
    ("0 0 * * 7", t(2026, 11, 28), t(2026, 11, 29)),  # 7 is Sunday, as 0
    ("0 0 * JAN,jul *", t(2026, 2, 1), t(2026, 7, 1)),
    # Day of month and day of week both restricted: either matches (Vixie cron).
    ("0 0 13 * fri", t(2026, 11, 1), t(2026, 11, 6)),
    ("@hourly", t(2026, 1, 1, 10, 59), t(2026, 1, 1, 11, 0)),
    ("@daily", t(2026, 1, 1, 10, 0), t(2026, 1, 2)),
    ("@weekly", t(2026, 11, 30), t(2026, 12, 6)),
])
def test_next_after(expr: str, after: datetime, expected: datetime) -> None:
    assert parse(expr).next_after(after) == expected


def test_other_time_zones_are_read_as_the_same_instant() -> None:
    cet = timezone(timedelta(hours=1))
    assert parse("0 12 * * *").next_after(datetime(2026, 1, 1, 12, 30, tzinfo=cet)) == t(2026, 1, 1, 12, 0)


@pytest.mark.parametrize(("expr", "message"), [
    ("* * * *", "expected 5 fields"),
    ("60 * * * *", "minute 60 is out of range 0-59"),
    ("* 24 * * *", "hour 24 is out of range"),
    ("* * 0 * *", "day of month 0 is out of range 1-31"),
    ("* * * 13 *", "month 13 is out of range"),
    ("* * * * 8", "day of week 8 is out of range"),
    ("*/0 * * * *", "step '0'"),
    ("5-1 * * * *", "runs backwards"),
    ("x * * * *", "'x' is not a valid minute"),
    ("1,,2 * * * *", "empty item"),
    ("0 0 30 2 *", "never matches"),
])
def test_bad_expressions_say_what_is_wrong(expr: str, message: str) -> None:
    with pytest.raises(CronError, match=message.replace("(", r"\(").replace("*", r"\*")):
        parse(expr)
