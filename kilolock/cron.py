"""Five-field cron expressions (``kl schedule set --cron``), evaluated in UTC.

``minute hour day-of-month month day-of-week``; each field is ``*``, a number, a range ``a-b``, a
list ``a,b``, and any of those with a step ``/n`` (``*/15``, ``1-30/5``); months and weekdays also
by their English three-letter names; weekday 0 and 7 are Sunday. As Vixie cron: when both
day-of-month and day-of-week are restricted (neither is ``*``), a day matches when either does.
``@hourly``, ``@daily`` (``@midnight``), ``@weekly``, ``@monthly`` and ``@yearly`` (``@annually``)
are the usual shorthands. Own code rather than a library: the well-kept pure-Python one (cronsim)
needs Python >= 3.11, and kl.pyz runs on 3.10.
"""
from __future__ import annotations

from datetime import datetime, timedelta, timezone

from kilolock.errors import UsageError

_MONTHS = {m: i + 1 for i, m in enumerate(["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"])}
_DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
_SHORTHANDS = {"@hourly": "0 * * * *", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@weekly": "0 0 * * 0",
               "@monthly": "0 0 1 * *", "@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *"}
# (name, lowest, highest, names)
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}), ("month", 1, 12, _MONTHS),
           ("day of week", 0, 7, _DAYS))
# Far enough to find any valid expression's next time (29 February on a Monday: 28 years at most).
_HORIZON_DAYS = 366 * 29


class CronError(UsageError):
    pass


def _number(text: str, name: str, low: int, high: int, names: dict[str, int], expr: str) -> int:
    value = names.get(text.lower()) if names else None
    if value is None:
        if not text.isdigit():
            raise CronError(f"cron {expr!r}: {text!r} is not a valid {name}")
        value = int(text)
    if not low <= value <= high:
        raise CronError(f"cron {expr!r}: {name} {value} is out of range {low}-{high}")
    return value


def _field(text: str, name: str, low: int, high: int, names: dict[str, int], expr: str) -> set[int]:
    values: set[int] = set()
    for part in text.split(","):
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not step_text.isdigit() or int(step_text) < 1:
                raise CronError(f"cron {expr!r}: step {step_text!r} in the {name} field is not a positive number")
            step = int(step_text)
        if base == "*":
            first, last = low, high
        elif "-" in base:
            a, _, b = base.partition("-")
            first, last = _number(a, name, low, high, names, expr), _number(b, name, low, high, names, expr)
            if first > last:
                raise CronError(f"cron {expr!r}: range {base!r} in the {name} field runs backwards")
        elif base:
            first = _number(base, name, low, high, names, expr)
            last = high if slash else first  # 5/15 = 5, 20, 35, 50
        else:
            raise CronError(f"cron {expr!r}: empty item in the {name} field")
        values.update(range(first, last + 1, step))
    return values


class Cron:
    """A parsed expression: ``next_after(t)`` is the first matching minute strictly after T."""

    def __init__(self, expr: str) -> None:
        self.expr = expr
        text = _SHORTHANDS.get(expr.strip().lower(), expr)
        fields = text.split()
        if len(fields) != 5:
            raise CronError(f"cron {expr!r}: expected 5 fields (minute hour day-of-month month day-of-week), "
                            f"got {len(fields)}")
        parsed = [_field(f, *spec, expr) for f, spec in zip(fields, _FIELDS, strict=True)]
        self.minutes, self.hours, self.days, self.months, weekdays = parsed
        self.weekdays = {d % 7 for d in weekdays}
        self.any_day = fields[2] == "*"
        self.any_weekday = fields[4] == "*"
        if self.next_after(datetime(2000, 1, 1, tzinfo=timezone.utc)) is None:
            raise CronError(f"cron {expr!r}: never matches (no such day)")

    def _day_matches(self, t: datetime) -> bool:
        dom = t.day in self.days
        dow = (t.isoweekday() % 7) in self.weekdays
        if self.any_day or self.any_weekday:
            return dom and dow
        return dom or dow

    def next_after(self, t: datetime) -> datetime | None:
        """The first matching minute after T (an aware datetime), in UTC; None if none within ~29 years."""
        t = t.astimezone(timezone.utc).replace(second=0, microsecond=0) + timedelta(minutes=1)
        day = t.replace(hour=0, minute=0)
        end = day + timedelta(days=_HORIZON_DAYS)
        while day < end:
            if day.month in self.months and self._day_matches(day):
                for hour in sorted(self.hours):
                    for minute in sorted(self.minutes):
                        candidate = day.replace(hour=hour, minute=minute)
                        if candidate >= t:
                            return candidate
            day += timedelta(days=1)
        return None


def parse(expr: str) -> Cron:
    return Cron(expr)
