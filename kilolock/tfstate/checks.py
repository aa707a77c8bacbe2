"""The error every check of a state raises, and the checks that name the JSON path they failed at."""
from __future__ import annotations

from typing import Any

from kilolock.errors import KlError

# Serials are stored as PostgreSQL bigint; Terraform's own are uint64, but none reaches 2**63.
MAX_SERIAL = 2**63 - 1


class StateError(KlError):
    """The state file is not a Terraform state Kilolock can store; the message says where."""


def _kind(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def _expect(cond: bool, path: str, msg: str) -> None:
    if not cond:
        raise StateError(f"{path}: {msg}")


def _expect_type(v: Any, types: type | tuple[type, ...], path: str, what: str) -> None:
    ok = isinstance(v, types) and not (isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)))
    if not ok:
        raise StateError(f"{path}: expected {what}, got {_kind(v)}")
