"""The pure-Python backend: cty JSON <-> cty msgpack, driven by a compiled type.

Function names follow go-cty's msgpack package (``marshal``, ``marshal_list``, ``unmarshal_set``,
``unmarshal_dynamic`` ...) and match the Rust crate's, so the two read side by side. Errors are
raised as ``PathError`` at the failing value; each container adds its step while the error
unwinds, and the API boundary turns it into one ``CodecError`` naming the full path.
"""
from __future__ import annotations

import struct
from typing import Callable

from kilolock.codec.errors import MAX_DEPTH, CodecError, PathError
from kilolock.codec.jsontext import JsonObject, parse_json, quote
from kilolock.codec.numbers import (
    WIRE_FLOAT,
    WIRE_INT,
    Dec,
    canonical_text,
    float_text,
    from_int,
    parse_number,
    sort_key,
    wire_form,
)
from kilolock.codec.types import (
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
    infer_type,
    parse_type,
    type_from_json,
)

_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1
_pack_float = struct.Struct(">d").pack
_TOO_DEEP = f"nested deeper than {MAX_DEPTH} levels"


class PureType:
    """A compiled type with the codec's two operations."""

    __slots__ = ("_type",)

    def __init__(self, cty_type: CtyType) -> None:
        self._type = cty_type

    @property
    def type_json(self) -> bytes:
        """The canonical JSON type specification."""
        return self._type.json.encode()

    def encode(self, json_bytes: bytes) -> bytes:
        """cty JSON -> msgpack exactly as go-cty writes it."""
        try:
            value = parse_json(json_bytes)
            out = bytearray()
            marshal(value, self._type, out, 0)
            return bytes(out)
        except PathError as exc:
            raise exc.to_codec_error() from None
        except UnicodeEncodeError:
            # an unpaired surrogate escape inside a key of an inferred (dynamic) object
            raise CodecError("(root): invalid string: unpaired surrogate escape") from None

    def decode(self, msgpack_bytes: bytes) -> bytes:
        """msgpack -> canonical cty JSON (sorted keys, compact, exact numbers)."""
        try:
            if not isinstance(msgpack_bytes, (bytes, bytearray)):
                raise PathError(f"expected bytes, got {type(msgpack_bytes).__name__}")
            reader = Reader(bytes(msgpack_bytes))
            out: list[str] = []
            unmarshal(reader, self._type, out, 0)
            if reader.pos != len(reader.data):
                raise PathError(f"trailing bytes after the msgpack value at offset {reader.pos}")
            return "".join(out).encode()
        except PathError as exc:
            raise exc.to_codec_error() from None


def compile_type(type_json: bytes) -> PureType:
    try:
        return PureType(parse_type(type_json))
    except PathError as exc:
        raise exc.to_codec_error() from None


# --- msgpack writing ----------------------------------------------------------------------------


def _write_len(out: bytearray, n: int, fix: int, fix_max: int, m8: int | None, m16: int, m32: int) -> None:
    if n <= fix_max:
        out.append(fix | n)
    elif m8 is not None and n < 0x100:
        out.append(m8)
        out.append(n)
    elif n < 0x10000:
        out.append(m16)
        out += n.to_bytes(2, "big")
    else:
        out.append(m32)
        out += n.to_bytes(4, "big")


def write_str(out: bytearray, data: bytes) -> None:
    _write_len(out, len(data), 0xA0, 31, 0xD9, 0xDA, 0xDB)
    out += data


def write_bin(out: bytearray, data: bytes) -> None:
    n = len(data)
    if n < 0x100:
        out.append(0xC4)
        out.append(n)
    elif n < 0x10000:
        out.append(0xC5)
        out += n.to_bytes(2, "big")
    else:
        out.append(0xC6)
        out += n.to_bytes(4, "big")
    out += data


def write_array_header(out: bytearray, n: int) -> None:
    _write_len(out, n, 0x90, 15, None, 0xDC, 0xDD)


def write_map_header(out: bytearray, n: int) -> None:
    _write_len(out, n, 0x80, 15, None, 0xDE, 0xDF)


def write_int(out: bytearray, v: int) -> None:
    """The most compact form, as vmihailenco/msgpack's EncodeInt (unsigned markers for v >= 0)."""
    if v >= 0:
        if v < 0x80:
            out.append(v)
        elif v < 0x100:
            out += b"\xcc" + v.to_bytes(1, "big")
        elif v < 0x10000:
            out += b"\xcd" + v.to_bytes(2, "big")
        elif v < 0x100000000:
            out += b"\xce" + v.to_bytes(4, "big")
        else:
            out += b"\xcf" + v.to_bytes(8, "big")
    elif v >= -32:
        out.append(v & 0xFF)
    elif v >= -0x80:
        out += b"\xd0" + v.to_bytes(1, "big", signed=True)
    elif v >= -0x8000:
        out += b"\xd1" + v.to_bytes(2, "big", signed=True)
    elif v >= -0x80000000:
        out += b"\xd2" + v.to_bytes(4, "big", signed=True)
    else:
        out += b"\xd3" + v.to_bytes(8, "big", signed=True)


def _name_keys(t: CtyType) -> dict[str, bytes]:
    keys = t.name_keys
    if len(keys) != len(t.names):
        for name in t.names:
            buf = bytearray()
            write_str(buf, name.encode())
            keys[name] = bytes(buf)
    return keys


# --- marshal: JSON value -> msgpack -------------------------------------------------------------


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
        data = value.encode("utf-8")
    except UnicodeEncodeError:
        raise PathError("invalid string: unpaired surrogate escape") from None
    write_str(out, data)


def _as_dec(value: object) -> Dec:
    if type(value) is int:
        return from_int(value)
    if type(value) is Dec:
        return value
    raise _expected("number", value)


def marshal_number(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    if type(value) is int:  # short JSON integer literal: always within int64
        write_int(out, value)
        return
    form, wire = wire_form(_as_dec(value))
    if form == WIRE_INT:
        write_int(out, wire)  # type: ignore[arg-type]
    elif form == WIRE_FLOAT:
        out.append(0xCB)
        out += _pack_float(wire)  # type: ignore[arg-type]
    else:
        write_str(out, wire.encode())  # type: ignore[union-attr]


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
        raise PathError(_TOO_DEEP)
    return value


def marshal_list(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    items = _elements(value, "list", depth)
    write_array_header(out, len(items))
    elem = t.elem
    for i, item in enumerate(items):
        try:
            marshal(item, elem, out, depth + 1)  # type: ignore[arg-type]
        except PathError as exc:
            exc.segments.append(f"[{i}]")
            raise


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
            exc.segments.append(f"[{i}]")
            raise
        encoded.setdefault(bytes(buf), None)
    write_array_header(out, len(encoded))
    for data in encoded:
        out += data


def marshal_primitive_set(items: list[object], elem: CtyType, out: bytearray) -> None:
    """cty's order for sets of primitives: strings by UTF-8 bytes, numbers numerically,
    false before true, nulls last; duplicates collapse."""
    keyed: dict[object, object] = {}
    has_null = False
    for i, item in enumerate(items):
        try:
            if item is None:
                has_null = True
            elif elem.kind == STRING:
                buf = bytearray()
                marshal_string(item, elem, buf, 0)
                keyed.setdefault(item.encode(), bytes(buf))  # type: ignore[union-attr]
            elif elem.kind == NUMBER:
                dec = _as_dec(item)
                buf = bytearray()
                marshal_number(dec, elem, buf, 0)
                keyed.setdefault(sort_key(dec), bytes(buf))
            else:
                buf = bytearray()
                marshal_bool(item, elem, buf, 0)
                keyed.setdefault(item, bytes(buf))
        except PathError as exc:
            exc.segments.append(f"[{i}]")
            raise
    write_array_header(out, len(keyed) + has_null)
    for key in sorted(keyed):  # type: ignore[type-var]
        out += keyed[key]  # type: ignore[operator]
    if has_null:
        out.append(0xC0)


def marshal_tuple(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    items = _elements(value, "tuple", depth)
    if len(items) != len(t.elems):
        raise PathError(f"expected tuple of {len(t.elems)} elements, got {len(items)}")
    write_array_header(out, len(items))
    for i, (item, elem) in enumerate(zip(items, t.elems)):
        try:
            marshal(item, elem, out, depth + 1)
        except PathError as exc:
            exc.segments.append(f"[{i}]")
            raise


def _members(value: object, what: str, depth: int) -> JsonObject:
    if type(value) is not JsonObject:
        raise _expected(what, value)
    if depth >= MAX_DEPTH:
        raise PathError(_TOO_DEEP)
    return value


def marshal_map(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    members = _members(value, "map", depth)
    elem: CtyType = t.elem  # type: ignore[assignment]
    encoded: dict[bytes, bytes] = {}
    for key, item in members:
        try:
            key_bytes = key.encode("utf-8")
        except UnicodeEncodeError:
            raise PathError("invalid string: unpaired surrogate escape") from None
        if key_bytes in encoded:
            raise PathError(f"duplicate key {quote(key)}")
        buf = bytearray()
        try:
            marshal(item, elem, buf, depth + 1)
        except PathError as exc:
            exc.segments.append(f"[{quote(key)}]")
            raise
        encoded[key_bytes] = bytes(buf)
    write_map_header(out, len(encoded))
    for key_bytes in sorted(encoded):
        write_str(out, key_bytes)
        out += encoded[key_bytes]


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
            exc.segments.append("." + key)
            raise
        encoded[key] = bytes(buf)
    # Every attribute goes on the wire, absent ones as nil, in sorted order.
    names = t.names
    keys = _name_keys(t)
    write_map_header(out, len(names))
    for name in names:
        out += keys[name]
        out += encoded.get(name, b"\xc0")


def _wrapper_parts(value: object) -> tuple[object, object] | None:
    """``(type spec, value)`` when value is exactly a ``{"type": ..., "value": ...}`` wrapper."""
    if type(value) is JsonObject and len(value) == 2:
        (k1, v1), (k2, v2) = value
        if k1 == "type" and k2 == "value":
            return v1, v2
        if k1 == "value" and k2 == "type":
            return v2, v1
    return None


def marshal_dynamic(value: object, t: CtyType, out: bytearray, depth: int) -> None:
    wrapper = _wrapper_parts(value)
    if wrapper is not None:
        concrete = type_from_json(wrapper[0], 0)
        inner = wrapper[1]
    else:
        concrete = infer_type(value, depth)  # the ADR's case: a plain value, type from its JSON
        inner = value
    if concrete.kind == DYNAMIC:
        raise PathError('a dynamic value needs a concrete type, not "dynamic"')
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

# --- msgpack reading ----------------------------------------------------------------------------

NIL, FALSE, TRUE, INT, FLOAT, STR, BIN, ARRAY, MAPF, EXT = range(10)

# Headers followed by a big-endian unsigned value of the given width: the value itself (uint8..64)
# or the length of what follows (str8..32, bin8..32, array16/32, map16/32).
_SIZED_HEADERS = {
    0xCC: (INT, 1), 0xCD: (INT, 2), 0xCE: (INT, 4), 0xCF: (INT, 8),
    0xD9: (STR, 1), 0xDA: (STR, 2), 0xDB: (STR, 4),
    0xC4: (BIN, 1), 0xC5: (BIN, 2), 0xC6: (BIN, 4),
    0xDC: (ARRAY, 2), 0xDD: (ARRAY, 4),
    0xDE: (MAPF, 2), 0xDF: (MAPF, 4),
}
_FAMILY_NAMES = ("nil", "bool", "bool", "int", "float", "str", "bin", "array", "map", "ext")
_UNKNOWN = "unknown value: a refreshed state must be wholly known"


class Reader:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        pos = self.pos
        end = pos + n
        if end > len(self.data):
            raise PathError(f"truncated msgpack at offset {pos}")
        self.pos = end
        return self.data[pos:end]

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def head(self) -> tuple[int, object]:
        """The next item's family and its value (scalars) or length (str/bin/array/map)."""
        data = self.data
        pos = self.pos
        if pos >= len(data):
            raise PathError(f"truncated msgpack at offset {pos}")
        b = data[pos]
        self.pos = pos + 1
        if b <= 0x7F:
            return INT, b
        if b >= 0xE0:
            return INT, b - 0x100
        if 0xA0 <= b <= 0xBF:
            return STR, b & 0x1F
        if 0x90 <= b <= 0x9F:
            return ARRAY, b & 0x0F
        if 0x80 <= b <= 0x8F:
            return MAPF, b & 0x0F
        if b == 0xC0:
            return NIL, None
        if b == 0xC2:
            return FALSE, False
        if b == 0xC3:
            return TRUE, True
        sized = _SIZED_HEADERS.get(b)
        if sized is not None:
            return sized[0], self.uint(sized[1])
        if b in (0xD0, 0xD1, 0xD2, 0xD3):
            return INT, int.from_bytes(self.take(1 << (b - 0xD0)), "big", signed=True)
        if b == 0xCA:
            return FLOAT, struct.unpack(">f", self.take(4))[0]
        if b == 0xCB:
            return FLOAT, struct.unpack(">d", self.take(8))[0]
        if 0xD4 <= b <= 0xD8 or 0xC7 <= b <= 0xC9:
            return EXT, None  # unknown value (ext 0, refined ext 12, or any other code)
        raise PathError(f"invalid msgpack byte 0x{b:02x} at offset {pos}")

    def text(self, n: int) -> str:
        try:
            return self.take(n).decode("utf-8")
        except UnicodeDecodeError:
            raise PathError("invalid UTF-8 in msgpack string") from None


def _got(what: str, family: int) -> PathError:
    if family == EXT:
        return PathError(_UNKNOWN)
    return PathError(f"expected {what}, got msgpack {_FAMILY_NAMES[family]}")


# --- unmarshal: msgpack -> canonical JSON ---------------------------------------------------------


def unmarshal(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    _UNMARSHAL[t.kind](r, t, out, depth)


def unmarshal_string(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    family, arg = r.head()
    if family == STR:
        out.append(quote(r.text(arg)))  # type: ignore[arg-type]
    elif family == NIL:
        out.append("null")
    else:
        raise _got("string", family)


def _read_number(family: int, arg: object, r: Reader) -> Dec | int:
    if family == INT:
        return arg  # type: ignore[return-value]
    if family == FLOAT:
        try:
            return parse_number(float_text(arg))  # type: ignore[arg-type]
        except ValueError as exc:
            raise PathError(str(exc)) from None
    if family == STR:
        try:
            return parse_number(r.text(arg))  # type: ignore[arg-type]
        except ValueError as exc:
            raise PathError(f"invalid number string: {exc}") from None
    raise _got("number", family)


def _number_text(n: Dec | int) -> str:
    return str(n) if type(n) is int else canonical_text(n)  # type: ignore[arg-type]


def unmarshal_number(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    family, arg = r.head()
    if family == NIL:
        out.append("null")
    else:
        out.append(_number_text(_read_number(family, arg, r)))


def unmarshal_bool(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    family, _ = r.head()
    if family == TRUE:
        out.append("true")
    elif family == FALSE:
        out.append("false")
    elif family == NIL:
        out.append("null")
    else:
        raise _got("bool", family)


def _array_len(r: Reader, what: str, depth: int) -> int | None:
    family, arg = r.head()
    if family == NIL:
        return None
    if family != ARRAY:
        raise _got(what, family)
    if depth >= MAX_DEPTH:
        raise PathError(_TOO_DEEP)
    return arg  # type: ignore[return-value]


def unmarshal_list(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    n = _array_len(r, "list", depth)
    if n is None:
        out.append("null")
        return
    elem: CtyType = t.elem  # type: ignore[assignment]
    out.append("[")
    for i in range(n):
        if i:
            out.append(",")
        try:
            unmarshal(r, elem, out, depth + 1)
        except PathError as exc:
            exc.segments.append(f"[{i}]")
            raise
    out.append("]")


def unmarshal_set(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    n = _array_len(r, "set", depth)
    if n is None:
        out.append("null")
        return
    elem: CtyType = t.elem  # type: ignore[assignment]
    texts: list[str] = []
    if elem.kind in PRIMITIVE_KINDS:
        # Sorted and deduplicated like cty's own set, whatever order the sender used.
        keyed: dict[object, str] = {}
        has_null = False
        for i in range(n):
            try:
                family, arg = r.head()
                if family == NIL:
                    has_null = True
                elif elem.kind == STRING:
                    if family != STR:
                        raise _got("string", family)
                    raw = r.take(arg)  # type: ignore[arg-type]
                    try:
                        keyed.setdefault(raw, quote(raw.decode("utf-8")))
                    except UnicodeDecodeError:
                        raise PathError("invalid UTF-8 in msgpack string") from None
                elif elem.kind == NUMBER:
                    number = _read_number(family, arg, r)
                    key = number if type(number) is int else sort_key(number)  # type: ignore[arg-type]
                    keyed.setdefault(key, _number_text(number))
                else:
                    if family not in (TRUE, FALSE):
                        raise _got("bool", family)
                    keyed.setdefault(arg, "true" if arg else "false")
            except PathError as exc:
                exc.segments.append(f"[{i}]")
                raise
        texts = [keyed[k] for k in sorted(keyed)]  # type: ignore[type-var]
        if has_null:
            texts.append("null")
    else:
        # A set is the same value in any order: its JSON lists the elements sorted by their
        # canonical text, so a provider's order never shows up as drift.
        seen: set[str] = set()
        for i in range(n):
            part: list[str] = []
            try:
                unmarshal(r, elem, part, depth + 1)
            except PathError as exc:
                exc.segments.append(f"[{i}]")
                raise
            seen.add("".join(part))
        texts = sorted(seen)
    out.append("[" + ",".join(texts) + "]")


def unmarshal_tuple(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    n = _array_len(r, "tuple", depth)
    if n is None:
        out.append("null")
        return
    if n != len(t.elems):
        raise PathError(f"expected tuple of {len(t.elems)} elements, got {n}")
    out.append("[")
    for i, elem in enumerate(t.elems):
        if i:
            out.append(",")
        try:
            unmarshal(r, elem, out, depth + 1)
        except PathError as exc:
            exc.segments.append(f"[{i}]")
            raise
    out.append("]")


def _map_len(r: Reader, what: str, depth: int) -> int | None:
    family, arg = r.head()
    if family == NIL:
        return None
    if family != MAPF:
        raise _got(what, family)
    if depth >= MAX_DEPTH:
        raise PathError(_TOO_DEEP)
    return arg  # type: ignore[return-value]


def _map_key(r: Reader) -> str:
    family, arg = r.head()
    if family != STR:
        raise _got("string map key", family)
    return r.text(arg)  # type: ignore[arg-type]


def unmarshal_map(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    n = _map_len(r, "map", depth)
    if n is None:
        out.append("null")
        return
    elem: CtyType = t.elem  # type: ignore[assignment]
    entries: dict[str, str] = {}
    for _ in range(n):
        key = _map_key(r)
        if key in entries:
            raise PathError(f"duplicate key {quote(key)}")
        part: list[str] = []
        try:
            unmarshal(r, elem, part, depth + 1)
        except PathError as exc:
            exc.segments.append(f"[{quote(key)}]")
            raise
        entries[key] = "".join(part)
    # Code point order of str equals the byte order of their UTF-8 encodings.
    out.append("{" + ",".join(quote(k) + ":" + entries[k] for k in sorted(entries)) + "}")


def unmarshal_object(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    n = _map_len(r, "object", depth)
    if n is None:
        out.append("null")
        return
    attrs = t.attrs
    entries: dict[str, str] = {}
    for _ in range(n):
        key = _map_key(r)
        attr_type = attrs.get(key)
        if attr_type is None:
            raise PathError(f"unknown attribute {quote(key)}")
        if key in entries:
            raise PathError(f"duplicate key {quote(key)}")
        part: list[str] = []
        try:
            unmarshal(r, attr_type, part, depth + 1)
        except PathError as exc:
            exc.segments.append("." + key)
            raise
        entries[key] = "".join(part)
    # Attributes missing on the wire decode as null, like absent ones in cty JSON.
    out.append("{" + ",".join(quote(k) + ":" + entries.get(k, "null") for k in t.names) + "}")


def unmarshal_dynamic(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    family, arg = r.head()
    if family == NIL:
        out.append("null")
        return
    if family != ARRAY or arg != 2:
        if family == EXT:
            raise PathError(_UNKNOWN)
        raise PathError("expected a [type, value] pair for a dynamic value")
    family, arg = r.head()
    if family not in (STR, BIN):
        raise _got("type JSON (bin)", family)
    concrete = parse_type(r.take(arg))  # type: ignore[arg-type]
    if concrete.kind == DYNAMIC:
        raise PathError('a dynamic value needs a concrete type, not "dynamic"')
    out.append('{"type":' + concrete.json + ',"value":')
    unmarshal(r, concrete, out, depth)
    out.append("}")


_UNMARSHAL: dict[int, Callable[[Reader, CtyType, list[str], int], None]] = {
    STRING: unmarshal_string,
    NUMBER: unmarshal_number,
    BOOL: unmarshal_bool,
    DYNAMIC: unmarshal_dynamic,
    LIST: unmarshal_list,
    SET: unmarshal_set,
    MAP: unmarshal_map,
    OBJECT: unmarshal_object,
    TUPLE: unmarshal_tuple,
}

__all__ = ["CodecError", "PureType", "compile_type"]
