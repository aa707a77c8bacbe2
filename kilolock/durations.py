"""Durations as kl's flags take them: Terraform's forms (30s, 5m, 1h, 1m30s, 500ms) plus days (1d)."""
from __future__ import annotations

import math
import os
import re

from kilolock.errors import UsageError

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|d|h|m|s)")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str, *, allow_zero: bool = False) -> float:
    """Seconds from TEXT; ``allow_zero`` for waits where 0 means "do not wait" (``-lock-timeout=0s``)."""
    s = text.strip()
    pos, total = 0, 0.0
    for m in _PART.finditer(s):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _SECONDS[m.group(2)]
        pos = m.end()
    if not s or pos != len(s):
        raise UsageError(f"invalid duration {text!r}: use forms like 30s, 5m, 1h, 1d or 1m30s")
    if total <= 0 and not allow_zero:
        raise UsageError(f"invalid duration {text!r}: must be greater than zero")
    return total


def from_env(variable: str, default: float, *, allow_zero: bool = True) -> float:
    """Seconds from the environment VARIABLE (unset or empty: DEFAULT): a duration as the flags take
    it, or a bare number of seconds; a UsageError naming VARIABLE otherwise, so a mistyped setting
    is one line before any work starts rather than a default silently used."""
    text = os.environ.get(variable, "").strip()
    if not text:
        return default
    try:
        seconds = float(text)
    except ValueError:
        try:
            return parse_duration(text, allow_zero=allow_zero)
        except UsageError as exc:
            raise UsageError(f"{variable}: {exc}") from None
    if not math.isfinite(seconds) or seconds < 0 or (seconds == 0 and not allow_zero):
        least = "zero or more" if allow_zero else "greater than zero"
        raise UsageError(f"{variable}: invalid duration {text!r}: must be {least}")
    return seconds


def format_duration(seconds: float) -> str:
    """A short human form for messages: 45s, 2m05s, 1h30m, 2d03h."""
    whole = int(seconds)
    if whole < 60:
        return f"{seconds:.0f}s" if seconds >= 1 or seconds == 0 else f"{seconds:.1f}s"
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"
