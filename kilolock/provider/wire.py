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


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: int, payload: bytes) -> bytes:
    """A length-delimited field (tag = field number << 3 | 2, which fits one byte below 16)."""
    n = len(payload)
    return bytes((tag, n)) + payload if n < 0x80 else bytes((tag,)) + _varint(n) + payload


def _dynamic(msgpack: bytes) -> bytes:
    """DynamicValue{msgpack}: proto3 leaves an empty bytes field out."""
    return _field(0x0A, msgpack) if msgpack else b""


def read_resource_request(type_field: bytes, current_state: bytes, private: bytes, caps_field: bytes,
                          provider_meta: bytes | None = None, current_identity: bytes | None = None) -> bytes:
    """ReadResource.Request (tfplugin5 and 6 number its fields alike) as the generated message
    serialises it, fields in number order, without building one: a message per read cost more than
    the rest of the request. TYPE_FIELD and CAPS_FIELD are fields 1 and 5 already encoded
    (``string_field``, ``message_field``): the same for every read of a type."""
    parts = [type_field, _field(0x12, _dynamic(current_state))]
    if private:
        parts.append(_field(0x1A, private))
    if provider_meta is not None:
        parts.append(_field(0x22, _dynamic(provider_meta)))
    parts.append(caps_field)
    if current_identity is not None:
        parts.append(_field(0x32, _field(0x0A, _dynamic(current_identity))))  # ResourceIdentityData{identity_data}
    return b"".join(parts)


def string_field(number: int, value: str) -> bytes:
    """A proto3 string field as serialised (absent when empty)."""
    return _field(number << 3 | _LENGTH_DELIMITED, value.encode()) if value else b""


def message_field(number: int, message: Any) -> bytes:
    """A set message field as serialised (present even when the message is empty)."""
    return _field(number << 3 | _LENGTH_DELIMITED, bytes(message.SerializeToString()))
