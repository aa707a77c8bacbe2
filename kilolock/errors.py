"""Errors that reach the user as one line and an exit code, never as a traceback."""
from __future__ import annotations

import os


class KlError(Exception):
    """A failure the user can act on: printed as ``kl: <message>`` with exit code 1."""

    exit_code = 1


class UsageError(KlError):
    """The command line itself is wrong (exit code 2, as argparse does)."""

    exit_code = 2


def one_line(text: str) -> str:
    """TEXT with its line breaks escaped: messages quote user input (arguments, attribute names)
    that may hold one, and an error is one line."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def env_choice(variable: str, choices: tuple[str, ...]) -> str:
    """VARIABLE's value, lower-cased (unset or empty: the first choice); a KlError naming the
    variable and its choices when the value is none of them."""
    value = os.environ.get(variable, "").strip().lower() or choices[0]
    if value not in choices:
        raise KlError(f"{variable}={value!r} is not one of {', '.join(choices)}")
    return value
