"""State-name globs (``--states GLOB``), one meaning for every command: ``*`` matches within one
``/``-separated segment, ``**`` across segments, ``?`` one character other than ``/``; anything else
matches itself. ``team/*`` is ``team/dev`` but not ``team/dev/eu``; ``team/**`` is both.

The same pattern compiles to a Python regex and to a PostgreSQL regex (``~``), so a store query
may filter by it and agree with what is matched here."""
from __future__ import annotations

import re

from kilolock.errors import UsageError


def _parts(glob: str) -> list[str]:
    """The pattern as regex pieces that mean the same in Python's re and PostgreSQL's ARE."""
    if not glob:
        raise UsageError("a state glob must not be empty")
    out: list[str] = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:[^/]*/)*")  # zero or more whole segments: team/**/prod is team/prod too
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c.isalnum() or c in "/_-@=":
            out.append(c)
            i += 1
        else:  # re.escape's backslashes are read the same by PostgreSQL's ARE
            out.append("\\" + c)
            i += 1
    return out


def is_glob(text: str) -> bool:
    return "*" in text or "?" in text


def compile_glob(glob: str) -> re.Pattern[str]:
    return re.compile("".join(_parts(glob)), re.DOTALL)


def sql_regex(glob: str) -> str:
    """A PostgreSQL regular expression, anchored, for ``name ~ %s``."""
    return "^" + "".join(_parts(glob)) + "$"


def matches(glob: str, name: str) -> bool:
    return compile_glob(glob).fullmatch(name) is not None


def select(glob: str, names: list[str]) -> list[str]:
    pattern = compile_glob(glob)
    return [n for n in names if pattern.fullmatch(n)]
