"""Output shapes shared by commands: aligned key/value lines, tables, and stable JSON."""
from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any


def timestamp(v: datetime) -> str:
    """Every timestamp kl prints: local time with its zone, so two machines' output compare."""
    return v.astimezone().strftime("%Y-%m-%d %H:%M:%S %z")


def text(v: Any) -> str:
    """A value as the tables show it (None as -, times in local time)."""
    return _text(v)


def _text(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, datetime):
        return timestamp(v)
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


def emit_json_list(items: Iterable[Any]) -> None:
    """ITEMS as emit_json(list(ITEMS)) prints them, byte for byte, written as they come: a listing
    of a million rows is never held at once."""
    out = sys.stdout
    first = True
    for item in items:
        out.write("[\n  " if first else ",\n  ")
        out.write(json.dumps(item, indent=2, default=_default).replace("\n", "\n  "))
        first = False
    out.write("[]\n" if first else "\n]\n")


def _md_code(text: str) -> str:
    """TEXT as a markdown code span inside a table cell: a | would end the cell, a ` the span."""
    text = text.replace("|", "\\|")
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def markdown_changes(changes: Sequence[dict[str, Any]]) -> str:
    """Attribute changes ({"path", "before", "after"}, masked already) as a markdown table."""
    from kilolock.drift import show

    lines = ["| attribute | before | after |", "|---|---|---|"]
    lines += [f"| {_md_code(c['path'])} | {_md_code(show(c['before']))} | {_md_code(show(c['after']))} |" for c in changes]
    return "\n".join(lines)
