"""marshal: cty JSON -> msgpack, walking the parsed JSON with the type in hand (twin of
codec_rs/src/marshal.rs, which streams through the JSON text instead; names and error texts are
the same). Function names follow go-cty's msgpack package.

Errors are raised as ``PathError`` at the failing value; each container adds its step while the
error unwinds.
"""
from __future__ import annotations

from collections.abc import Callable

from kilolock.codec.errors import MAX_DEPTH, PathError, too_deep
from kilolock.codec.pure.jsontext import JsonObject, nfc, parse_json, quote
from kilolock.codec.pure.mp import write_array_header, write_bin, write_f64, write_int, write_map_header, write_str
from kilolock.codec.pure.numbers import WIRE_FLOAT, WIRE_INT, Dec, from_int, sort_key, wire_form
from kilolock.codec.pure.types import (
    BOOL,
    DYNAMIC,
    LIST,
    MAP,
    NUMBER,
    OBJECT,
    PRIMITIVE_KINDS,
    SET,
    STRING,
    TUPLE,
    CtyType,
    as_gocty_json,
    as_own_type,
    check_one_element_type,
    infer_type,
    type_from_json,
    wrapper_parts,
)

_UNPAIRED_SURROGATE = "invalid string: unpaired surrogate escape"


def encode(data: bytes, t: CtyType) -> bytes:
    """Encode a whole JSON document."""
    value = parse_json(data)
    out = bytearray()
    try:
        marshal(value, t, out, 0)
        if t.has_dynamic_collection:
            # Checked, now sent as go-cty sends the value it reads: a null dynamic element with
            # its collection's element type (as_gocty_json).
            out.clear()
            marshal(parse_json(as_gocty_json(value, t).encode()), t, out, 0)
    except UnicodeEncodeError:
        # an unpaired surrogate escape in an attribute name of an inferred (dynamic) object,
        # met when the name is written
        raise PathError(_UNPAIRED_SURROGATE) from None
    return bytes(out)


def json_kind(value: object) -> str:
    if value is None:
        return "null"
    if value is True or value is False:
        return "bool"
    if isinstance(value, (int, Dec)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, JsonObject):
        return "object"
    return "array"


def _expected(what: str, value: object) -> PathError:
    return PathError(f"expected {what}, got {json_kind(value)}")


def marshal(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    if value is None:
        out.append(0xC0)
        return
    _MARSHAL[t.kind](value, t, out, depth)


def marshal_string(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    if type(value) is not str:
        raise _expected("string", value)
    try:
        data = nfc(value).encode("utf-8")
    except UnicodeEncodeError:
        raise PathError(_UNPAIRED_SURROGATE) from None
    write_str(out, data)


def _number_dec(value: object) -> Dec:
    if type(value) is int:
        return from_int(value)
    if type(value) is Dec:
        return value
    raise _expected("number", value)


def _write_number(d: Dec, out: bytearray) -> None:
    form, wire = wire_form(d)
    if form == WIRE_INT:
        write_int(out, wire)  # type: ignore[arg-type]
    elif form == WIRE_FLOAT:
        write_f64(out, wire)  # type: ignore[arg-type]
    else:
        write_str(out, wire.encode())  # type: ignore[union-attr]


def marshal_number(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    if type(value) is int:  # short JSON integer literal: always within int64
        write_int(out, value)
        return
    _write_number(_number_dec(value), out)


def marshal_bool(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    if value is True:
        out.append(0xC3)
    elif value is False:
        out.append(0xC2)
    else:
        raise _expected("bool", value)


def _elements(value: object, what: str, depth: int) -> list[object]:
    if type(value) is not list:
        raise _expected(what, value)
    if depth >= MAX_DEPTH:
        raise too_deep()
    return value


def marshal_list(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    items = _elements(value, "list", depth)
    write_array_header(out, len(items))
    elem: CtyType = t.elem  # type: ignore[assignment]
    for i, item in enumerate(items):
        try:
            marshal(item, elem, out, depth + 1)
        except PathError as exc:
            exc.index(i)
            raise
    if elem.has_dynamic:
        check_one_element_type(list(enumerate(items)), t)


def marshal_set(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    items = _elements(value, "set", depth)
    elem: CtyType = t.elem  # type: ignore[assignment]
    if elem.kind in PRIMITIVE_KINDS:
        marshal_primitive_set(items, elem, out)
        return
    # cty orders sets of non-primitive values by hash; the order given is the order providers
    # send back, so it is kept. Equal elements collapse, as they would in a cty set.
    encoded: dict[bytes, None] = {}
    for i, item in enumerate(items):
        buf = bytearray()
        try:
            marshal(item, elem, buf, depth + 1)
        except PathError as exc:
            exc.index(i)
            raise
        encoded.setdefault(bytes(buf), None)
    if elem.has_dynamic:
        check_one_element_type(list(enumerate(items)), t)
    write_array_header(out, len(encoded))
    for data in encoded:
        out += data


def marshal_primitive_set(items: list[object], elem: CtyType, out: bytearray) -> None:
    """cty's order for sets of primitives: strings by UTF-8 bytes, numbers numerically,
    false before true, nulls last; duplicates collapse."""
    keyed: dict[object, bytes] = {}
    has_null = False
    for i, item in enumerate(items):
        try:
            if item is None:
                has_null = True
            elif elem.kind == STRING:
                buf = bytearray()
                marshal_string(item, elem, buf, 0)
                keyed.setdefault(nfc(item).encode(), bytes(buf))  # type: ignore[arg-type]
            elif elem.kind == NUMBER:
                dec = _number_dec(item)
                buf = bytearray()
                marshal_number(dec, elem, buf, 0)
                keyed.setdefault(sort_key(dec), bytes(buf))
            else:
                buf = bytearray()
                marshal_bool(item, elem, buf, 0)
                keyed.setdefault(item, bytes(buf))
        except PathError as exc:
            exc.index(i)
            raise
    write_array_header(out, len(keyed) + has_null)
    for key in sorted(keyed):  # type: ignore[type-var]
        out += keyed[key]
    if has_null:
        out.append(0xC0)


def marshal_tuple(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    items = _elements(value, "tuple", depth)
    if len(items) != len(t.elems):
        raise PathError(f"expected tuple of {len(t.elems)} elements, got {len(items)}")
    write_array_header(out, len(items))
    for i, (item, elem) in enumerate(zip(items, t.elems, strict=True)):
        try:
            marshal(item, elem, out, depth + 1)
        except PathError as exc:
            exc.index(i)
            raise


def _members(value: object, what: str, depth: int) -> JsonObject:
    if type(value) is not JsonObject:
        raise _expected(what, value)
    if depth >= MAX_DEPTH:
        raise too_deep()
    return value


def marshal_map(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    members = _members(value, "map", depth)
    elem: CtyType = t.elem  # type: ignore[assignment]
    encoded: dict[bytes, bytes] = {}
    for raw_key, item in members:
        key = nfc(raw_key)  # cty.MapVal normalizes keys: two spellings of one key are a duplicate
        try:
            key_bytes = key.encode("utf-8")
        except UnicodeEncodeError:
            raise PathError(_UNPAIRED_SURROGATE) from None
        if key_bytes in encoded:
            raise PathError(f"duplicate key {quote(key)}")
        buf = bytearray()
        try:
            marshal(item, elem, buf, depth + 1)
        except PathError as exc:
            exc.index(key)
            raise
        encoded[key_bytes] = bytes(buf)
    if elem.has_dynamic:
        check_one_element_type(sorted(((nfc(k), v) for k, v in members), key=lambda kv: kv[0]), t)
    write_map_header(out, len(encoded))
    for key_bytes in sorted(encoded):
        write_str(out, key_bytes)
        out += encoded[key_bytes]


def _mp_keys(t: CtyType) -> dict[str, bytes]:
    """Each attribute name as a msgpack str, ready to copy (made on first use, because a name
    with an unpaired surrogate is an error only once a value is encoded)."""
    keys = t.mp_keys
    if len(keys) != len(t.names):
        for name in t.names:
            buf = bytearray()
            write_str(buf, name.encode())
            keys[name] = bytes(buf)
    return keys


def marshal_object(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    members = _members(value, "object", depth)
    attrs = t.attrs
    encoded: dict[str, bytes] = {}
    for key, item in members:
        attr_type = attrs.get(key)
        if attr_type is None:
            raise PathError(f"unknown attribute {quote(key)}")
        if key in encoded:
            raise PathError(f"duplicate key {quote(key)}")
        buf = bytearray()
        try:
            marshal(item, attr_type, buf, depth + 1)
        except PathError as exc:
            exc.attr(key)
            raise
        encoded[key] = bytes(buf)
    # Every attribute goes on the wire, absent ones as nil, in sorted order.
    names = t.names
    keys = _mp_keys(t)
    write_map_header(out, len(names))
    for name in names:
        out += keys[name]
        out += encoded.get(name, b"\xc0")


def marshal_dynamic(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    wrapper = wrapper_parts(value)
    if wrapper is not None:
        concrete = type_from_json(wrapper[0], 0)
        inner = wrapper[1]
    else:
        concrete = infer_type(value, depth)  # the ADR's case: a plain value, type from its JSON
        inner = value
    if concrete.kind == DYNAMIC:
        raise PathError('a dynamic value needs a concrete type, not "dynamic"')
    if concrete.has_dynamic and wrapper is not None:
        # Checked, then sent with the type its value has (as_gocty_json), as go-cty sends it.
        marshal(inner, concrete, bytearray(), depth)
        concrete, text = as_own_type(inner, concrete)
        inner = parse_json(text.encode())
    write_array_header(out, 2)
    write_bin(out, concrete.json.encode())
    marshal(inner, concrete, out, depth)


_MARSHAL: dict[int, Callable[[object, CtyType, bytearray, int], None]] = {
    STRING: marshal_string,
    NUMBER: marshal_number,
    BOOL: marshal_bool,
    DYNAMIC: marshal_dynamic,
    LIST: marshal_list,
    SET: marshal_set,
    MAP: marshal_map,
    OBJECT: marshal_object,
    TUPLE: marshal_tuple,
}
