"""Byte-level helpers for the protocol messages; nothing here decodes msgpack or JSON values."""
from __future__ import annotations

from typing import Any

_NIL = b"\xc0"  # msgpack nil: a null object


class DynamicNull(Exception):
    """Internal signal: the DynamicValue holds a null (absent, empty, or msgpack nil)."""


def dynamic_value_bytes(dv: Any) -> bytes:
    """The msgpack bytes of a DynamicValue; raises DynamicNull for null, ValueError for JSON-only."""
    if dv.msgpack:
        if dv.msgpack == _NIL:
            raise DynamicNull()
        return bytes(dv.msgpack)
    if dv.json:
        # Terraform accepts JSON here too, but the wire layer must not parse values; no known
        # provider answers in JSON, so this is reported rather than silently converted.
        raise ValueError("the provider answered with a JSON DynamicValue, which kl does not accept (msgpack only)")
    raise DynamicNull()


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def unknown_field_records(raw: bytes, field_number: int) -> bytes:
    """Concatenated wire records (tag, length, payload) of one top-level length-delimited field.

    Walks only the top level of the message (a handful of fields), skipping payloads by length.
    Malformed input yields b"": the message itself already parsed, so this is best effort.
    """
    out = bytearray()
    pos, end = 0, len(raw)
    try:
        while pos < end:
            start = pos
            key, pos = _varint(raw, pos)
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                _, pos = _varint(raw, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 2:
                length, pos = _varint(raw, pos)
                pos += length
            elif wire_type == 5:
                pos += 4
            else:  # groups (3/4) are not used by these protocols
                return b""
            if pos > end:
                return b""
            if number == field_number and wire_type == 2:
                out += raw[start:pos]
    except ValueError:
        return b""
    return bytes(out)
