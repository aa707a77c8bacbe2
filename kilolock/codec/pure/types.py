"""cty types: parsed from Terraform's JSON type syntax, printed back in canonical form (compact,
sorted keys), and inferred from plain JSON at dynamic positions (twin of codec_rs/src/types.rs,
same error texts)."""
from __future__ import annotations

from typing import cast

from kilolock.codec.errors import MAX_DEPTH, PathError, too_deep
from kilolock.codec.pure.jsontext import JsonObject, parse_json, quote
from kilolock.codec.pure.numbers import Dec

STRING, NUMBER, BOOL, DYNAMIC, LIST, SET, MAP, OBJECT, TUPLE = range(9)
PRIMITIVE_KINDS = (STRING, NUMBER, BOOL)
_PRIMITIVE_NAMES = {"string": STRING, "number": NUMBER, "bool": BOOL, "dynamic": DYNAMIC}
_COLLECTION_NAMES = {"list": LIST, "set": SET, "map": MAP}
_KIND_NAMES = {v: k for k, v in {**_PRIMITIVE_NAMES, **_COLLECTION_NAMES, "object": OBJECT, "tuple": TUPLE}.items()}


class CtyType:
    """One node of a compiled type; ``json`` is its canonical type-spec text."""

    __slots__ = ("attrs", "elem", "elems", "has_dynamic", "json", "kind", "mp_keys", "names", "optional")

    def __init__(self, kind: int, *, elem: CtyType | None = None, attrs: dict[str, CtyType] | None = None,
                 optional: tuple[str, ...] = (), elems: tuple[CtyType, ...] = ()) -> None:
        self.kind = kind
        self.elem = elem
        self.attrs = attrs or {}
        # Attribute names in wire order: sorted by their UTF-8 bytes (== code point order).
        self.names = tuple(sorted(self.attrs))
        self.mp_keys: dict[str, bytes] = {}  # each name as a msgpack str, filled by marshal on first use
        self.optional = optional
        self.elems = elems
        self.json = _to_json(self)
        # Whether a value's own type may differ from this one (see actual_type).
        self.has_dynamic: bool = kind == DYNAMIC or any(
            part.has_dynamic for part in (*([elem] if elem else []), *self.attrs.values(), *elems))


def _to_json(t: CtyType) -> str:
    kind = t.kind
    if kind in (STRING, NUMBER, BOOL, DYNAMIC):
        return f'"{_KIND_NAMES[kind]}"'
    if kind in (LIST, SET, MAP):
        assert t.elem is not None
        return f'["{_KIND_NAMES[kind]}",{t.elem.json}]'
    if kind == TUPLE:
        return '["tuple",[' + ",".join(e.json for e in t.elems) + "]]"
    body = ",".join(quote(n) + ":" + t.attrs[n].json for n in t.names)
    if t.optional:
        return '["object",{' + body + "},[" + ",".join(quote(n) for n in t.optional) + "]]"
    return '["object",{' + body + "}]"


SIMPLE = {kind: CtyType(kind) for kind in (STRING, NUMBER, BOOL, DYNAMIC)}


def parse_type(data: bytes) -> CtyType:
    """Compile Terraform's JSON type syntax; errors are ``PathError`` (``invalid type ...``)."""
    return type_from_json(parse_json(data), 0)


def type_from_json(spec: object, depth: int) -> CtyType:
    if isinstance(spec, str):
        kind = _PRIMITIVE_NAMES.get(spec)
        if kind is None:
            raise PathError(f"invalid type: unknown type name {quote(spec)}")
        return SIMPLE[kind]
    if type(spec) is not list or not spec or not isinstance(spec[0], str):
        raise PathError("invalid type: expected a type name or [kind, ...] array")
    if depth >= MAX_DEPTH:
        raise PathError(f"invalid type: nested deeper than {MAX_DEPTH} levels")
    name = spec[0]
    kind = _COLLECTION_NAMES.get(name)
    if kind is not None:
        if len(spec) != 2:
            raise PathError(f"invalid type: {name} takes exactly one element type")
        return CtyType(kind, elem=type_from_json(spec[1], depth + 1))
    if name == "tuple":
        if len(spec) != 2 or type(spec[1]) is not list:
            raise PathError("invalid type: tuple takes an array of element types")
        return CtyType(TUPLE, elems=tuple(type_from_json(e, depth + 1) for e in spec[1]))
    if name == "object":
        if len(spec) not in (2, 3) or not isinstance(spec[1], JsonObject):
            raise PathError("invalid type: object takes an object of attribute types")
        attrs: dict[str, CtyType] = {}
        for key, value in spec[1]:
            if key in attrs:
                raise PathError(f"invalid type: duplicate attribute {quote(key)}")
            attrs[key] = type_from_json(value, depth + 1)
        optional: set[str] = set()
        if len(spec) == 3:
            if type(spec[2]) is not list:
                raise PathError("invalid type: optional attributes must be an array of names")
            for opt in spec[2]:
                if not isinstance(opt, str) or opt not in attrs:
                    raise PathError("invalid type: optional attribute is not an attribute of the object")
                optional.add(opt)
        return CtyType(OBJECT, attrs=attrs, optional=tuple(sorted(optional)))
    raise PathError(f"invalid type: unknown type kind {quote(name)}")


def infer_type(value: object, depth: int) -> CtyType:
    """The concrete type of a plain JSON value at a dynamic position (null stays dynamic)."""
    if value is None:
        return SIMPLE[DYNAMIC]
    if value is True or value is False:
        return SIMPLE[BOOL]
    if isinstance(value, (int, Dec)):
        return SIMPLE[NUMBER]
    if isinstance(value, str):
        return SIMPLE[STRING]
    if depth >= MAX_DEPTH:
        raise too_deep()
    if isinstance(value, JsonObject):
        attrs: dict[str, CtyType] = {}
        for key, item in value:
            if key in attrs:
                raise PathError(f"duplicate key {quote(key)}")
            attrs[key] = infer_type(item, depth + 1)
        return CtyType(OBJECT, attrs=attrs)
    return CtyType(TUPLE, elems=tuple(infer_type(item, depth + 1) for item in cast("list[object]", value)))


def wrapper_parts(value: object) -> tuple[object, object] | None:
    """``(type spec, value)`` when value is exactly a ``{"type": ..., "value": ...}`` wrapper."""
    if type(value) is JsonObject and len(value) == 2:
        (k1, v1), (k2, v2) = value
        if k1 == "type" and k2 == "value":
            return v1, v2
        if k1 == "value" and k2 == "type":
            return v2, v1
    return None


_DYNAMIC_JSON = '"dynamic"'


def actual_type(value: object, t: CtyType) -> str:
    """The type (canonical JSON) go-cty gives the value this JSON makes at declared type ``t``:
    a dynamic position takes its value's concrete type (a null there stays dynamic), a non-empty
    collection the type of its first element that is not a null dynamic, an object or tuple its
    members' types (cty.ListVal, ObjectVal, ... build a value's type from its parts)."""
    if not t.has_dynamic:
        return t.json
    if t.kind == DYNAMIC:
        if value is None:
            return _DYNAMIC_JSON
        wrapper = wrapper_parts(value)
        if wrapper is not None:
            return actual_type(wrapper[1], type_from_json(wrapper[0], 0))
        return actual_type(value, infer_type(value, 0))
    if value is None:
        return t.json
    if t.kind == OBJECT:
        members = dict(cast("JsonObject", value))
        return '["object",{' + ",".join(
            quote(n) + ":" + actual_type(members.get(n), t.attrs[n]) for n in t.names) + "}]"
    if t.kind == TUPLE:
        items = cast("list[object]", value)
        return '["tuple",[' + ",".join(actual_type(v, e) for v, e in zip(items, t.elems, strict=True)) + "]]"
    elems = [v for _, v in cast("JsonObject", value)] if t.kind == MAP else cast("list[object]", value)
    elem_json = t.elem.json if not elems else _DYNAMIC_JSON  # type: ignore[union-attr]
    for item in elems:
        elem_json = actual_type(item, t.elem)  # type: ignore[arg-type]
        if elem_json != _DYNAMIC_JSON:
            break
    return f'["{_KIND_NAMES[t.kind]}",{elem_json}]'


def check_one_element_type(items: list[tuple[int, object]] | list[tuple[str, object]], t: CtyType) -> None:
    """go-cty builds a list, set or map only from elements of one type (a null dynamic fits any):
    for an element type with ``dynamic`` in it, the elements (index or key, JSON value) must
    agree, or it is an error at the first element that differs (a go-cty provider would panic on
    the bytes, and Terraform refuses such a value)."""
    elem: CtyType = t.elem  # type: ignore[assignment]
    first: str | None = None
    for step, item in items:
        this = actual_type(item, elem)
        if this == _DYNAMIC_JSON:
            continue
        if first is None:
            first = this
        elif this != first:
            exc = PathError(f"element type {this} differs from {first} of the earlier elements: "
                            f"a {_KIND_NAMES[t.kind]}'s elements must all have one type")
            exc.index(step)
            raise exc
