"""Strict JSON text in and canonical JSON text out (twin of codec_rs/src/jsontext.rs).

Objects parse into ``JsonObject`` (a list of key/value pairs in document order) so duplicate keys
are seen and reported instead of silently collapsing; numbers parse exactly (``numbers.Dec``,
or ``int`` for short integer literals).
"""
from __future__ import annotations

import json
import unicodedata
from json.encoder import encode_basestring  # C-accelerated: escapes '"', '\\' and C0 controls

from kilolock.codec.errors import PathError
from kilolock.codec.pure.numbers import parse_number


class JsonObject(list[tuple[str, object]]):
    """A JSON object as its ``(key, value)`` pairs, in document order."""

    __slots__ = ()


def _parse_int(text: str) -> object:
    # Short literals are plain ints (fast path); long ones keep every digit as a Dec.
    # ("-0" keeps its sign: go-cty writes it back as "-0")
    return int(text) if len(text) <= 18 and text != "-0" else parse_number(text)


def _reject_constant(name: str) -> object:
    raise ValueError(f"{name} is not a JSON number")


_decoder = json.JSONDecoder(
    object_pairs_hook=JsonObject,
    parse_float=parse_number,
    parse_int=_parse_int,
    parse_constant=_reject_constant,
)


def parse_json(data: bytes) -> object:
    """Parse JSON bytes (UTF-8 only); errors are ``PathError`` at the root."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PathError(f"invalid JSON: invalid UTF-8 at byte {exc.start}") from None
    try:
        return _decoder.decode(text)
    except RecursionError:
        raise PathError("invalid JSON: nesting too deep") from None
    except ValueError as exc:
        raise PathError(f"invalid JSON: {exc}") from None


def quote(text: str) -> str:
    """A JSON string literal; UTF-8 kept as is, only quote, backslash and C0 controls escaped."""
    return encode_basestring(text)


def nfc(text: str) -> str:
    """Unicode Normalization Form C, as ``cty.StringVal`` applies to every string and map key.
    Python's own tables (Unicode 13.0 on 3.10 up to 15.1 on 3.13) and the Rust crate's (18.0) give
    the same result for every string of characters Python's version knows (Unicode's
    normalization stability policy); see docs/paths-and-values.md, "Values: what Terraform would write"."""
    if text.isascii():
        return text
    return unicodedata.normalize("NFC", text)
