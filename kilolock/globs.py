"""State-name globs (``--states GLOB``), one meaning for every command: ``*`` matches within one
``/``-separated segment, ``**`` across segments, ``?`` one character other than ``/``; anything else
matches itself. ``team/*`` is ``team/dev`` but not ``team/dev/eu``; ``team/**`` is both.

Resource-address globs (``kl drift ignore add --address GLOB``) follow the same rules with ``.``
as the separator: ``null_resource.*`` is ``null_resource.a`` and ``null_resource.a[0]`` but not
``module.m.null_resource.a``; ``module.m.**`` is everything in module ``m`` and below. (A ``.``
inside an instance key, ``x["a.b"]``, counts as a separator too: keep it simple, use ``**``.) An
address glob is written as Terraform prints addresses (``check_address_glob``): a string key quoted.

Claim globs (grants on an OIDC token's ``sub``, ``oidc:ISSUER:SUB-GLOB``, and a trust's claim
rules) follow the same rules with ``:`` as the separator, ``/`` being an ordinary character:
``repo:acme/*:ref:refs/heads/main`` is the main branch of every repository of acme, and
``repo:acme/infra:**`` everything of acme/infra (a sub is ``repo:OWNER/NAME:ref:REF`` and the like).

The same pattern compiles to a Python regex and to a PostgreSQL regex (``~``), so a store query
may filter by it and agree with what is matched here."""
from __future__ import annotations

import re

from kilolock.errors import UsageError


def _parts(glob: str, sep: str = "/") -> list[str]:
    """The pattern as regex pieces that mean the same in Python's re and PostgreSQL's ARE; SEP is
    the segment separator (``/`` in state names, ``.`` in resource addresses)."""
    if not glob:
        raise UsageError({"/": "a state glob", ".": "an address glob"}.get(sep, "a claim glob") + " must not be empty")
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


_NAME_CHARS = "_-*?"
_BARE_KEY = re.compile(r'\[([^\]"]+)\]')


def check_address_glob(glob: str) -> str:
    """GLOB if it is written as Terraform writes addresses, wildcards aside: names joined by ``.``,
    an instance key as ``[0]`` or ``["key"]`` (``[*]`` too); otherwise a UsageError saying where.
    A rule whose glob no address can match would hide nothing, silently: ``x[b]`` is such a glob,
    as Terraform prints a string key quoted."""
    if not glob:
        raise UsageError("an address glob must not be empty")
    i, n = 0, len(glob)
    after_dot = True  # at the start, or just after a "."
    while i < n:
        c = glob[i]
        if c.isalnum() or c in _NAME_CHARS:
            after_dot = False
            i += 1
        elif c == "." and not after_dot:
            after_dot = True
            i += 1
        elif c == "[" and not after_dot:
            i = _key_end(glob, i)
        else:
            what = "a name" if after_dot else "a name, . or [KEY]"
            raise UsageError(f"address glob {glob!r}: expected {what} at position {i + 1}, found {c!r} "
                             '(an address is names joined by ".", with instance keys [0] or ["key"])')
    if after_dot:
        raise UsageError(f"address glob {glob!r} ends with \".\": a name must follow it")
    return glob


def _is_index(body: str) -> bool:
    return all(ch.isdigit() or ch in "*?" for ch in body)


def _key_end(glob: str, start: int) -> int:
    """Where the instance key opened at START ends (after its ``]``)."""
    close = glob.find("]", start)
    body = glob[start + 1:close] if close >= 0 else glob[start + 1:]
    if body.startswith('"'):
        # a quoted key may hold any character, "]" and escaped quotes included
        j = start + 2
        while j < len(glob) and glob[j] != '"':
            j += 2 if glob[j] == "\\" else 1
        if j + 1 < len(glob) and glob[j + 1] == "]":
            return j + 2
        raise UsageError(f"address glob {glob!r}: the instance key at position {start + 1} is not closed: "
                         'expected "] after the quoted key')
    if close >= 0 and body and _is_index(body):
        return close + 1
    if close >= 0 and body:
        quoted = _BARE_KEY.sub(lambda m: m.group(0) if _is_index(m.group(1)) else f'["{m.group(1)}"]', glob)
        raise UsageError(f"address glob {glob!r}: the instance key {body} at position {start + 1} is not a number, "
                         f"so it is written quoted, as Terraform prints it: '{quoted}' (single quotes for the shell)")
    raise UsageError(f"address glob {glob!r}: expected an instance key [0] or [\"key\"] at position {start + 1}")


def compile_address_glob(glob: str) -> re.Pattern[str]:
    return re.compile("".join(_parts(glob, ".")), re.DOTALL)


def compile_claim_glob(glob: str) -> re.Pattern[str]:
    """A glob on a token claim: ``*`` within one ``:``-separated segment, ``**`` across."""
    return re.compile("".join(_parts(glob, ":")), re.DOTALL)


def matches(glob: str, name: str) -> bool:
    return compile_glob(glob).fullmatch(name) is not None


def select(glob: str, names: list[str]) -> list[str]:
    pattern = compile_glob(glob)
    return [n for n in names if pattern.fullmatch(n)]
