"""Durations as kl's flags take them: Terraform's forms (30s, 5m, 1h, 1m30s, 500ms) plus days (1d)."""
from __future__ import annotations

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
