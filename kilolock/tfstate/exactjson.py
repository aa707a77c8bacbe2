"""JSON read and written exactly: numbers kept as their text, compact output, Go's string escaping."""
from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


class _Number(str):
    """A JSON number kept as its text, so `kl state pull` never rounds a value through a float."""


_GO_ESCAPES = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"})


# What json.dumps(s, ensure_ascii=False) gives for a str, without building an encoder per call
# (which was most of a big pull's time: it writes every key and string value this way).
_encode_string: Callable[[str], str] = json.encoder.encode_basestring


def _go_string(s: str) -> str:
    return _encode_string(s).translate(_GO_ESCAPES)


def _py_string(text: str) -> str:
    return _encode_string(text)


def _write_compact(v: Any, out: list[str], quote: Callable[[str], str] = _py_string) -> None:
    """Compact JSON of V onto OUT, numbers as written; QUOTE writes strings and keys (Python's
    escaping, or Go's json.Marshal's for a layout Go wrote)."""
    if isinstance(v, dict):
        out.append("{")
        for n, (k, item) in enumerate(v.items()):
            if n:
                out.append(",")
            out.append(quote(k))
            out.append(":")
            _write_compact(item, out, quote)
        out.append("}")
    elif isinstance(v, list):
        out.append("[")
        for n, item in enumerate(v):
            if n:
                out.append(",")
            _write_compact(item, out, quote)
        out.append("]")
    elif isinstance(v, _Number):
        out.append(str.__str__(v))
    elif isinstance(v, str):
        out.append(quote(v))
    else:
        out.append(json.dumps(v, ensure_ascii=False))


def dumps_compact(v: Any) -> str:
    """Compact JSON of a value from loads_exact, numbers exactly as they were written."""
    out: list[str] = []
    _write_compact(v, out)
    return "".join(out)


_EXACT_DECODER = json.JSONDecoder(parse_float=_Number)


def loads_exact(text: str | bytes) -> Any:
    """Parse JSON keeping every non-integer number as its text (integers are exact in Python)."""
    if isinstance(text, str) and not text.startswith("\ufeff"):
        return _EXACT_DECODER.decode(text)  # json.loads would build a decoder per call (the pull makes one per instance)
    return json.loads(text, parse_float=_Number)


class ExactJSON:
    """Exact JSON for one document's life: floats whose shortest repr is their text stay floats
    (the C encoder then writes them back unchanged); only the rest keep their text, and when
    none did, dumps uses the C encoder instead of the pure-Python writer (10x faster)."""

    def __init__(self) -> None:
        self.raw_numbers = False
        # One decoder for the document's life: json.loads with parse_float builds a new one per
        # call, which cost more than the parsing when a state is read a piece at a time.
        self._decoder = json.JSONDecoder(parse_float=self._float)

    def _float(self, text: str) -> Any:
        f = float(text)
        if repr(f) == text:
            return f
        self.raw_numbers = True
        return _Number(text)

    def loads(self, text: str | bytes) -> Any:
        if isinstance(text, str) and not text.startswith("\ufeff"):
            return self._decoder.decode(text)
        return json.loads(text, parse_float=self._float)  # its checks and encoding detection, as before

    def dumps_compact(self, v: Any) -> str:
        if self.raw_numbers:
            return dumps_compact(v)
        return json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
