"""Byte-level helpers for the protocol messages; nothing here decodes msgpack or JSON values."""
from __future__ import annotations

from typing import Any

from google.protobuf.unknown_fields import UnknownFieldSet

_NIL = b"\xc0"  # msgpack nil: a null object
_LENGTH_DELIMITED = 2  # protobuf wire type of messages, strings and bytes


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


def undeclared_field_payloads(msg: Any, field_number: int) -> list[bytes]:
    """The payloads of every length-delimited occurrence of a field MSG's type does not declare.

    The generated message keeps such fields as unknown fields; other wire types at that number
    are skipped, as protobuf skips a field whose wire type does not fit its declaration.
    """
    fields = UnknownFieldSet(msg)
    if not len(fields):  # nearly every answer: every read asks
        return []
    found = (fields[i] for i in range(len(fields)))  # the set is indexable, not (typed as) iterable
    return [bytes(f.data) for f in found if f.field_number == field_number and f.wire_type == _LENGTH_DELIMITED]
