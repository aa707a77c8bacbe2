"""State-name globs (``--states GLOB``), one meaning for every command: ``*`` matches within one
``/``-separated segment, ``**`` across segments, ``?`` one character other than ``/``; anything else
matches itself. ``team/*`` is ``team/dev`` but not ``team/dev/eu``; ``team/**`` is both.

Resource-address globs (``kl drift ignore add --address GLOB``) follow the same rules with ``.``
as the separator: ``null_resource.*`` is ``null_resource.a`` and ``null_resource.a[0]`` but not
``module.m.null_resource.a``; ``module.m.**`` is everything in module ``m`` and below. (A ``.``
inside an instance key, ``x["a.b"]``, counts as a separator too: keep it simple, use ``**``.)

The same pattern compiles to a Python regex and to a PostgreSQL regex (``~``), so a store query
may filter by it and agree with what is matched here."""
from __future__ import annotations

import re

from kilolock.errors import UsageError


def _parts(glob: str, sep: str = "/") -> list[str]:
    """The pattern as regex pieces that mean the same in Python's re and PostgreSQL's ARE; SEP is
    the segment separator (``/`` in state names, ``.`` in resource addresses)."""
    if not glob:
        raise UsageError("a state glob must not be empty" if sep == "/" else "an address glob must not be empty")
    sep_re = re.escape(sep)
    within = "[^" + sep_re + "]"
    out: list[str] = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**" + sep, i):
            # zero or more whole segments: team/**/prod is team/prod too
            out.append("(?:" + within + "*" + sep_re + ")*")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append(within + "*")
            i += 1
        elif c == "?":
            out.append(within)
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


def address_regex(glob: str) -> str:
    """An address glob as an anchored PostgreSQL regular expression (``.`` separates segments)."""
    return "^" + "".join(_parts(glob, ".")) + "$"


def compile_address_glob(glob: str) -> re.Pattern[str]:
    return re.compile("".join(_parts(glob, ".")), re.DOTALL)


def matches(glob: str, name: str) -> bool:
    return compile_glob(glob).fullmatch(name) is not None


def select(glob: str, names: list[str]) -> list[str]:
    pattern = compile_glob(glob)
    return [n for n in names if pattern.fullmatch(n)]
