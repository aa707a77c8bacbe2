"""State names: the rules the command line and ``kl serve`` check before anything touches the database.

Two rules. ``check_stored_name`` is what the states table accepts (its CHECK constraint); a
command that only names a state uses it, so whatever is stored can still be named.
``check_state_name`` is stricter: it is what kl creates, and ``kl state import`` and ``kl serve``
accept the same names, so every state kl creates can be reached over HTTP.
"""
from __future__ import annotations

import re

from kilolock.errors import KlError

MAX_NAME = 255

# Segments separated by "/" (team/prod works); a segment starts with a letter or digit, so "." and
# ".." can never be one, and there is nothing to traverse.
_SEGMENT = r"[A-Za-z0-9][A-Za-z0-9._@+=-]*"
_NAME = re.compile(rf"{_SEGMENT}(?:/{_SEGMENT})*")


class BadName(KlError):
    pass


def check_stored_name(name: str) -> str:
    """A name the states table can hold, said before the database is asked."""
    if not name:
        raise BadName("a state name must not be empty")
    if len(name) > MAX_NAME:
        raise BadName(f"a state name has at most {MAX_NAME} characters, this one {len(name)}")
    # PostgreSQL's [[:cntrl:]] also matches the C1 controls.
    if any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in name):
        raise BadName(f"state name {name!r} contains a control character")
    return name


def check_state_name(name: str) -> str:
    """A decoded state name as both ``kl serve`` and ``kl state import`` accept it."""
    if not name:
        raise BadName("state name is empty")
    if len(name) > MAX_NAME:
        raise BadName(f"state name is {len(name)} characters long; at most {MAX_NAME} are allowed")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise BadName("state name contains a control character")
    if not _NAME.fullmatch(name):
        raise BadName(
            f"state name {name!r} is not allowed: use letters, digits and . _ @ + = - in '/'-separated "
            "segments that each start with a letter or digit"
        )
    return name


def parse_state_name(encoded: str) -> str:
    """The state name from the part of the URL path after ``/states/`` (still percent-encoded)."""
    from urllib.parse import unquote  # only kl serve needs it; every kl COMMAND --help loads this module

    try:
        name = unquote(encoded, encoding="utf-8", errors="strict")
    except UnicodeDecodeError:
        raise BadName("state name is not valid UTF-8 after percent-decoding") from None
    if not name:
        raise BadName("state name is empty: use /states/<name>")
    return check_state_name(name)
