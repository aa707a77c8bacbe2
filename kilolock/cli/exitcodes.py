"""kl's exit codes, decided in one place.

Without ``--detailed-exitcode``: 0 success, 1 an error, 2 a usage error, 130 a refresh interrupted
by SIGINT, 143 one terminated by SIGTERM.
With it, as ``terraform plan -detailed-exitcode``, for CI gates: 0 no open drift, 2 open drift,
1 any error (usage errors included)."""
from __future__ import annotations

import argparse

DETAILED_EXITCODE = "--detailed-exitcode"


def add_gate_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """``--detailed-exitcode`` and ``-q/--quiet`` for a command that can gate CI on drift."""
    parser.add_argument(DETAILED_EXITCODE, action="store_true",
                        help=f"exit 0 with no open drift, 2 with open drift ({what}), 1 on any error")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="print nothing on success but what --format json asks for (for exit-code gates)")


def exit_code(*, detailed: bool, open_drift: int = 0, error: bool = False, code: int = 1) -> int:
    """CODE is the command's own exit code for an error (2 for usage, 130 for SIGINT, 143 for SIGTERM)."""
    if error:
        return 1 if detailed else code
    if detailed:
        return 2 if open_drift else 0
    return 0
