"""kl's small local cache files about provider launches: ``$XDG_CACHE_HOME/kilolock/NAME`` (else
``~/.cache/kilolock/NAME``), a JSON object ``{"format": N, SECTION: {key: entry}}``.

A cache, never a source of truth: a missing, unreadable, corrupt or foreign file (another format)
reads as empty, and a write that fails is skipped (a read-only home only loses what the cache saves).
A writer replaces the file whole (a temp file renamed over it), so a reader never sees half a file;
two runs writing at once may lose one entry, which the next run learns again. Only the standard
library: these files are read before grpc or psycopg is imported.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def path(name: str) -> str:
    """Where cache file NAME lives."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = xdg if xdg and os.path.isabs(xdg) else os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "kilolock", name)


def read(name: str, fmt: int, section: str) -> dict[str, Any]:
    """The entries of SECTION (string keys, object values), or {} when the file cannot say."""
    try:
        with open(path(name), encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict) or doc.get("format") != fmt or not isinstance(doc.get(section), dict):
        return {}
    return {k: v for k, v in doc[section].items() if isinstance(k, str) and isinstance(v, dict)}


def write(name: str, fmt: int, section: str, entries: dict[str, Any]) -> None:
    """Replace the file with ENTRIES as SECTION (in their order); skipped when it cannot be written."""
    target = path(name)
    try:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=os.path.dirname(target))
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump({"format": fmt, section: entries}, fh)
            os.replace(tmp, target)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError:
        pass
