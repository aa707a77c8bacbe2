"""Output shapes shared by commands: aligned key/value lines, tables, and stable JSON."""
from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any


def _text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, datetime):
        return v.astimezone().strftime("%Y-%m-%d %H:%M:%S%z")
    return str(v)


def when(v: datetime) -> str:
    """A time with its zone offset, in the local zone, as every table shows times."""
    return _text(v)


def key_values(pairs: Sequence[tuple[str, Any]]) -> None:
    width = max((len(k) for k, _ in pairs), default=0)
    for key, value in pairs:
        print(f"{(key + ':').ljust(width + 1)} {_text(value)}")


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[_text(c) for c in row] for row in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    print("  ".join(h.upper().ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip())
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _default(v: Any) -> Any:
    if isinstance(v, datetime):
        return v.isoformat()
    return str(v)


def emit_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=False, default=_default)
    sys.stdout.write("\n")
