"""unmarshal: msgpack -> canonical cty JSON (sorted keys, compact, exact numbers, dynamic values
as ``{"type":..,"value":..}``); twin of codec_rs/src/unmarshal.rs, same names and error texts.

``unmarshal`` reads each item's head and handles nil for every type; the per-type functions get
the head's family and argument, as the Rust ones get a ``Head``.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from kilolock.codec.errors import MAX_DEPTH, PathError, too_deep
from kilolock.codec.pure.jsontext import parse_json, quote
from kilolock.codec.pure.mp import ARRAY, BIN, EXT, FALSE, FAMILY_NAMES, FLOAT, INT, MAP, NIL, STR, TRUE, Reader
from kilolock.codec.pure.numbers import Dec, canonical_text, float_text, parse_number, sort_key
from kilolock.codec.pure.types import (
    BOOL,
    DYNAMIC,
    LIST,
    NUMBER,
    OBJECT,
    PRIMITIVE_KINDS,
    SET,
    STRING,
    TUPLE,
    CtyType,
    as_gocty_json,
    check_one_element_type,
    parse_type,
)
from kilolock.codec.pure.types import MAP as MAP_KIND

_UNKNOWN = "unknown value: a refreshed state must be wholly known"


def decode(data: bytes, t: CtyType) -> bytes:
    """Decode a whole msgpack value."""
    r = Reader(data)
    out: list[str] = []
    unmarshal(r, t, out, 0)
    if r.pos != len(data):
        raise PathError(f"trailing bytes after the msgpack value at offset {r.pos}")
    text = "".join(out)
    if t.has_dynamic_collection:
        # A null dynamic element takes its collection's element type (as_gocty_json); values
        # tagged with a type that has dynamic in it were retyped where they are.
        text = as_gocty_json(parse_json(text.encode()), t)
    return text.encode()


def _got(what: str, family: int) -> PathError:
    if family == EXT:
        return PathError(_UNKNOWN)
    return PathError(f"expected {what}, got msgpack {FAMILY_NAMES[family]}")


def unmarshal(r: Reader, t: CtyType, out: list[str], depth: int) -> None:
    family, arg = r.head()
    if family == NIL:
        out.append("null")
        return
    _UNMARSHAL[t.kind](r, family, arg, t, out, depth)


def unmarshal_string(r: Reader, family: int, arg: object, t: CtyType, out: list[str], depth: int) -> None:
    if family != STR:
        raise _got("string", family)
    out.append(quote(r.text(arg)))  # type: ignore[arg-type]


def _read_number(r: Reader, family: int, arg: object) -> Dec | int:
    """Numbers arrive as any int, float32/64, or decimal text (go-cty's three wire forms)."""
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


def unmarshal_number(r: Reader, family: int, arg: object, t: CtyType, out: list[str], depth: int) -> None:
    out.append(_number_text(_read_number(r, family, arg)))


def unmarshal_bool(r: Reader, family: int, arg: object, t: CtyType, out: list[str], depth: int) -> None:
    if family == TRUE:
        out.append("true")
    elif family == FALSE:
        out.append("false")
    else:
        raise _got("bool", family)


def _array_len(family: int, arg: object, what: str, depth: int) -> int:
    if family != ARRAY:
        raise _got(what, family)
    if depth >= MAX_DEPTH:
        raise too_deep()
    return arg  # type: ignore[return-value]


def unmarshal_list(r: Reader, family: int, arg: object, t: CtyType, out: list[str], depth: int) -> None:
    n = _array_len(family, arg, "list", depth)
    elem: CtyType = t.elem  # type: ignore[assignment]
    if elem.has_dynamic:
        parts: list[str] = []
        for i in range(n):
            part: list[str] = []
            try:
                unmarshal(r, elem, part, depth + 1)
            except PathError as exc:
                exc.index(i)
                raise
            parts.append("".join(part))
        _check_parts(list(enumerate(parts)), t)
        out.append("[" + ",".join(parts) + "]")
        return
    out.append("[")
    for i in range(n):
        if i:
            out.append(",")
        try:
            unmarshal(r, elem, out, depth + 1)
        except PathError as exc:
            exc.index(i)
            raise
    out.append("]")


def _check_parts(parts: Sequence[tuple[int | str, str]], t: CtyType) -> None:
    """check_one_element_type on decoded elements (each its canonical JSON text)."""
    check_one_element_type([(step, parse_json(text.encode())) for step, text in parts], t)


def unmarshal_set(r: Reader, family: int, arg: object, t: CtyType, out: list[str], depth: int) -> None:
    n = _array_len(family, arg, "set", depth)
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
                    text = r.text(arg)  # type: ignore[arg-type]
                    keyed.setdefault(text, quote(text))
                elif elem.kind == NUMBER:
                    number = _read_number(r, family, arg)
                    key = number if type(number) is int else sort_key(number)  # type: ignore[arg-type]
                    keyed.setdefault(key, _number_text(number))
                else:
                    if family not in (TRUE, FALSE):
                        raise _got("bool", family)
                    keyed.setdefault(arg, "true" if arg else "false")
            except PathError as exc:
                exc.index(i)
                raise
        texts = [keyed[k] for k in sorted(keyed)]  # type: ignore[type-var]
        if has_null:
            texts.append("null")
    else:
        # A set is the same value in any order: its JSON lists the elements sorted by their
        # canonical text, so a provider's order never shows up as drift.
        seen: dict[str, int] = {}
        for i in range(n):
            part: list[str] = []
            try:
                unmarshal(r, elem, part, depth + 1)
            except PathError as exc:
                exc.index(i)
                raise
            seen.setdefault("".join(part), i)
        if elem.has_dynamic:
            _check_parts([(i, text) for text, i in seen.items()], t)
        texts = sorted(seen)
    out.append("[" + ",".join(texts) + "]")


def unmarshal_tuple(r: Reader, family: int, arg: object, t: CtyType, out: list[str], depth: int) -> None:
    n = _array_len(family, arg, "tuple", depth)
    if n != len(t.elems):
        raise PathError(f"expected tuple of {len(t.elems)} elements, got {n}")
    out.append("[")
    for i, elem in enumerate(t.elems):
        if i:
            out.append(",")
        try:
            unmarshal(r, elem, out, depth + 1)
        except PathError as exc:
            exc.index(i)
            raise
    out.append("]")


def _map_len(family: int, arg: object, what: str, depth: int) -> int:
    if family != MAP:
        raise _got(what, family)
    if depth >= MAX_DEPTH:
        raise too_deep()
    return arg  # type: ignore[return-value]


def _map_key(r: Reader) -> str:
    family, arg = r.head()
    if family != STR:
        raise _got("string map key", family)
    return r.text(arg)  # type: ignore[arg-type]


def unmarshal_map(r: Reader, family: int, arg: object, t: CtyType, out: list[str], depth: int) -> None:
    n = _map_len(family, arg, "map", depth)
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
            exc.index(key)
            raise
        entries[key] = "".join(part)
    if elem.has_dynamic:
        _check_parts(sorted(entries.items()), t)
    # Code point order of str equals the byte order of their UTF-8 encodings.
    out.append("{" + ",".join(quote(k) + ":" + entries[k] for k in sorted(entries)) + "}")


def unmarshal_object(r: Reader, family: int, arg: object, t: CtyType, out: list[str], depth: int) -> None:
    n = _map_len(family, arg, "object", depth)
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
            exc.attr(key)
            raise
        entries[key] = "".join(part)
    # Attributes missing on the wire decode as null, like absent ones in cty JSON.
    out.append("{" + ",".join(quote(k) + ":" + entries.get(k, "null") for k in t.names) + "}")


def unmarshal_dynamic(r: Reader, family: int, arg: object, t: CtyType, out: list[str], depth: int) -> None:
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
    if concrete.has_dynamic:
        # Written with the type its value has (as_gocty_json), not the one it came tagged with.
        part: list[str] = []
        unmarshal(r, concrete, part, depth)
        out.append(as_gocty_json(parse_json("".join(part).encode()), concrete, dynamic=True))
        return
    out.append('{"type":' + concrete.json + ',"value":')
    unmarshal(r, concrete, out, depth)
    out.append("}")


_UNMARSHAL: dict[int, Callable[[Reader, int, object, CtyType, list[str], int], None]] = {
    STRING: unmarshal_string,
    NUMBER: unmarshal_number,
    BOOL: unmarshal_bool,
    DYNAMIC: unmarshal_dynamic,
    LIST: unmarshal_list,
    SET: unmarshal_set,
    MAP_KIND: unmarshal_map,
    OBJECT: unmarshal_object,
    TUPLE: unmarshal_tuple,
}
