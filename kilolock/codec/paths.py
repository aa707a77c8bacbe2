"""Sensitive attribute paths: decoded from protobuf bytes, and derived from a schema.

``decode_attribute_paths`` reads repeated ``AttributePath`` messages out of a message's raw
unknown-field bytes (field 6 of ReadResource.Response, as the ADR describes). The protobuf wire
format is parsed here directly, so a provider sending garbage gives a ``CodecError``, never a crash.

``sensitive_paths`` mirrors Terraform's ``configschema`` ``Block.SensitivePaths`` (>= 1.8), which
is what Terraform actually records after a refresh: every ``sensitive`` attribute, through nested
blocks and nested attributes, with an index step per element of a LIST (int) or MAP (string key).

Sets: Terraform indexes a set element by the element's own value, but cty cannot keep marks on
set elements; it hoists them onto the set as a whole, so what reaches ``sensitive_attributes`` is
the path of the set itself. We record exactly that: a set (of blocks or nested objects) whose
elements contain sensitive attributes is marked as a whole, once, when it has any element.
That is the conservative reading too: no sensitive value inside a set can escape unmarked.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from kilolock.codec.errors import CodecError
from kilolock.schema import (
    AttributePath,
    Block,
    GetAttr,
    Index,
    NestedObject,
    NestingMode,
    path_display,
    path_to_state_json,
)

_INT64 = 1 << 64
_READ_RESPONSE_SENSITIVE_FIELD = 6


# --- protobuf ------------------------------------------------------------------------------------


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    result = 0
    for shift in range(0, 70, 7):
        if pos >= len(data):
            raise CodecError(f"protobuf: truncated varint at byte {pos}")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            if result >= _INT64:
                raise CodecError(f"protobuf: varint overflows 64 bits at byte {pos - 1}")
            return result, pos
    raise CodecError(f"protobuf: varint longer than 10 bytes at byte {pos}")


def _fields(data: bytes) -> list[tuple[int, int, Any]]:
    """``(field number, wire type, value)`` for every field; length-delimited values as bytes."""
    fields = []
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire_type = key >> 3, key & 7
        if number == 0:
            raise CodecError(f"protobuf: field number 0 at byte {pos}")
        if wire_type == 0:
            value, pos = _varint(data, pos)
        elif wire_type == 1 or wire_type == 5:
            size = 8 if wire_type == 1 else 4
            if pos + size > len(data):
                raise CodecError(f"protobuf: truncated fixed{size * 8} field {number}")
            value, pos = data[pos:pos + size], pos + size
        elif wire_type == 2:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise CodecError(f"protobuf: field {number} claims {size} bytes, {len(data) - pos} left")
            value, pos = data[pos:pos + size], pos + size
        else:
            raise CodecError(f"protobuf: unsupported wire type {wire_type} for field {number}")
        fields.append((number, wire_type, value))
    return fields


def _text(value: bytes, what: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise CodecError(f"protobuf: {what} is not valid UTF-8") from None


def _step(data: bytes) -> GetAttr | Index:
    step: GetAttr | Index | None = None
    for number, wire_type, value in _fields(data):
        expected = 0 if number == 3 else 2
        if number in (1, 2, 3) and wire_type != expected:
            raise CodecError(f"protobuf: AttributePath.Step field {number} has wire type {wire_type}")
        if number == 1:
            step = GetAttr(_text(value, "attribute_name"))
        elif number == 2:
            step = Index(_text(value, "element_key_string"))
        elif number == 3:
            step = Index(value - _INT64 if value >= _INT64 >> 1 else value)  # int64 two's complement
        # other fields: unknown to us, skipped as protobuf does; a oneof keeps the last one set
    if step is None:
        raise CodecError("protobuf: AttributePath.Step without a selector")
    return step


def decode_attribute_path(data: bytes) -> AttributePath:
    steps = []
    for number, wire_type, value in _fields(data):
        if number == 1:
            if wire_type != 2:
                raise CodecError(f"protobuf: AttributePath.steps has wire type {wire_type}")
            steps.append(_step(value))
    return tuple(steps)


def decode_attribute_paths(unknown_fields: bytes, field_number: int = _READ_RESPONSE_SENSITIVE_FIELD) -> list[AttributePath]:
    """Every ``AttributePath`` at ``field_number`` in raw protobuf bytes (other fields skipped)."""
    paths = []
    for number, wire_type, value in _fields(bytes(unknown_fields)):
        if number == field_number:
            if wire_type != 2:
                raise CodecError(f"protobuf: field {field_number} has wire type {wire_type}, expected a message")
            paths.append(decode_attribute_path(value))
    return paths


# --- schema-sensitive paths ------------------------------------------------------------------------


def _unwrap_dynamic(value: Any) -> Any:
    """Blocks typed dynamic (LIST/MAP with dynamic contents) hold a ``{"type","value"}`` wrapper."""
    if isinstance(value, dict) and set(value) == {"type", "value"}:
        return value["value"]
    return value


def _elements(value: Any) -> list[tuple[int | str, Any]]:
    if isinstance(value, list):
        return list(enumerate(value))
    if isinstance(value, dict):
        return sorted(value.items())
    return []


def block_contains_sensitive(block: Block) -> bool:
    return any(a.sensitive or (a.nested_type is not None and _object_contains_sensitive(a.nested_type))
               for a in block.attributes) or any(block_contains_sensitive(nb.block) for nb in block.block_types)


def _object_contains_sensitive(obj: NestedObject) -> bool:
    return any(a.sensitive or (a.nested_type is not None and _object_contains_sensitive(a.nested_type))
               for a in obj.attributes)


def _block_paths(block: Block, value: Any, base: AttributePath, out: list[AttributePath]) -> None:
    if not isinstance(value, dict):
        return  # a null block has no sensitive parts
    for attr in block.attributes:
        path = base + (GetAttr(attr.name),)
        if attr.sensitive:
            out.append(path)
        elif attr.nested_type is not None and _object_contains_sensitive(attr.nested_type):
            _nested_paths(attr.nested_type, value.get(attr.name), path, out)
    for nested in block.block_types:
        if not block_contains_sensitive(nested.block):
            continue
        path = base + (GetAttr(nested.type_name),)
        child = _unwrap_dynamic(value.get(nested.type_name))
        if nested.nesting in (NestingMode.SINGLE, NestingMode.GROUP):
            _block_paths(nested.block, child, path, out)
        elif nested.nesting == NestingMode.SET:
            _set_paths(lambda elem, p, acc: _block_paths(nested.block, elem, p, acc), child, path, out)
        else:
            for key, elem in _elements(child):
                _block_paths(nested.block, elem, path + (Index(key),), out)


def _nested_paths(obj: NestedObject, value: Any, base: AttributePath, out: list[AttributePath]) -> None:
    if value is None:
        return
    if obj.nesting == NestingMode.SINGLE:
        _object_paths(obj, value, base, out)
    elif obj.nesting == NestingMode.SET:
        _set_paths(lambda elem, p, acc: _object_paths(obj, elem, p, acc), value, base, out)
    else:
        for key, elem in _elements(value):
            _object_paths(obj, elem, base + (Index(key),), out)


def _object_paths(obj: NestedObject, value: Any, base: AttributePath, out: list[AttributePath]) -> None:
    if not isinstance(value, dict):
        return
    for attr in obj.attributes:
        path = base + (GetAttr(attr.name),)
        if attr.sensitive:
            out.append(path)
        elif attr.nested_type is not None and _object_contains_sensitive(attr.nested_type):
            _nested_paths(attr.nested_type, value.get(attr.name), path, out)


def _set_paths(element_paths: Callable[[Any, AttributePath, list[AttributePath]], None], value: Any,
               base: AttributePath, out: list[AttributePath]) -> None:
    """Mark the whole set once if any element would carry a sensitive mark (cty hoists them)."""
    if not isinstance(value, list):
        return
    for elem in value:
        found: list[AttributePath] = []
        element_paths(elem, base, found)
        if found:
            out.append(base)
            return


def sensitive_paths(block: Block, value: Any) -> list[AttributePath]:
    """Schema-sensitive paths of a decoded value (JSON bytes or parsed), unique and sorted the way
    Terraform sorts ``sensitive_attributes`` (by their display form)."""
    if isinstance(value, (bytes, bytearray, str)):
        value = json.loads(value)
    out: list[AttributePath] = []
    _block_paths(block, value, (), out)
    unique = {path_display(p): p for p in out}
    return [unique[k] for k in sorted(unique)]


def sensitive_attributes_json(paths: list[AttributePath]) -> list[list[dict[str, Any]]]:
    """Paths in Terraform's state ``sensitive_attributes`` shape, deduplicated and sorted."""
    unique = {path_display(p): p for p in paths}
    return [path_to_state_json(unique[k]) for k in sorted(unique)]
