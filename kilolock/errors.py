"""Errors that reach the user as one line and an exit code, never as a traceback."""
from __future__ import annotations


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
