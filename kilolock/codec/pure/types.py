"""cty types: parsed from Terraform's JSON type syntax, printed back in canonical form (compact,
sorted keys), and inferred from plain JSON at dynamic positions (twin of codec_rs/src/types.rs,
same error texts)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from kilolock.codec.errors import MAX_DEPTH, PathError, too_deep
from kilolock.codec.pure.jsontext import JsonObject, nfc, parse_json, quote
from kilolock.codec.pure.numbers import Dec, canonical_text

STRING, NUMBER, BOOL, DYNAMIC, LIST, SET, MAP, OBJECT, TUPLE = range(9)
PRIMITIVE_KINDS = (STRING, NUMBER, BOOL)
_PRIMITIVE_NAMES = {"string": STRING, "number": NUMBER, "bool": BOOL, "dynamic": DYNAMIC}
_COLLECTION_NAMES = {"list": LIST, "set": SET, "map": MAP}
_KIND_NAMES = {v: k for k, v in {**_PRIMITIVE_NAMES, **_COLLECTION_NAMES, "object": OBJECT, "tuple": TUPLE}.items()}


class CtyType:
    """One node of a compiled type; ``json`` is its canonical type-spec text."""

    __slots__ = ("attrs", "elem", "elems", "has_dynamic", "has_dynamic_collection", "json", "kind", "mp_keys", "names",
                 "optional")

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
        # Whether a list, set or map in it has dynamic in its element type (a null dynamic element
        # of one takes the element type of the others).
        self.has_dynamic_collection: bool = (elem is not None and elem.has_dynamic) or any(
            part.has_dynamic_collection for part in (*self.attrs.values(), *elems))


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
        for raw_key, value in spec[1]:
            key = nfc(raw_key)  # as go-cty's cty.Object keys its attributes (what it writes and reads)
            if key in attrs:
                raise PathError(f"invalid type: duplicate attribute {quote(key)}")
            attrs[key] = type_from_json(value, depth + 1)
        optional: set[str] = set()
        if len(spec) == 3:
            if type(spec[2]) is not list:
                raise PathError("invalid type: optional attributes must be an array of names")
            for opt in spec[2]:
                if not isinstance(opt, str) or nfc(opt) not in attrs:
                    raise PathError("invalid type: optional attribute is not an attribute of the object")
                optional.add(nfc(opt))
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


def check_one_element_type(items: Sequence[tuple[int | str, object]], t: CtyType) -> None:
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


class Typed:
    """A value with the type go-cty gives it (see ``actual_type``), built by ``typed``: ``items``
    holds a list/set/tuple's elements, a map's ``(key, element)`` pairs or an object's
    ``(name, attribute)`` pairs; a value without dynamic in its type is a ``leaf`` (its JSON)."""

    __slots__ = ("items", "leaf", "type")

    def __init__(self, t: CtyType, leaf: object = None, items: list[Typed] | list[tuple[str, Typed]] | None = None) -> None:
        self.type = t
        self.leaf = leaf
        self.items = items


def typed(value: object, t: CtyType) -> Typed:
    """The value this JSON (at declared type ``t``, wrappers at dynamic positions or plain JSON
    there) makes in go-cty. A null dynamic element of a collection takes the collection's element
    type, as go-cty hands its elements out; the elements already agree (check_one_element_type)."""
    if t.kind == DYNAMIC:
        if value is None:
            return Typed(SIMPLE[DYNAMIC])
        wrapper = wrapper_parts(value)
        if wrapper is not None:
            return typed(wrapper[1], type_from_json(wrapper[0], 0))
        return typed(value, infer_type(value, 0))
    if value is None or not t.has_dynamic:
        return Typed(t, leaf=value)
    if t.kind == OBJECT:
        members = dict(cast("JsonObject", value))
        attrs = [(n, typed(members.get(n), t.attrs[n])) for n in t.names]
        return Typed(CtyType(OBJECT, attrs={n: a.type for n, a in attrs}), items=attrs)
    if t.kind == TUPLE:
        elems = [typed(v, e) for v, e in zip(cast("list[object]", value), t.elems, strict=True)]
        return Typed(CtyType(TUPLE, elems=tuple(e.type for e in elems)), items=elems)
    elem_t: CtyType = t.elem  # type: ignore[assignment]
    if t.kind == MAP:
        pairs = [(k, typed(v, elem_t)) for k, v in cast("JsonObject", value)]
        if not pairs:
            return Typed(t, leaf=value)
        elem = next((e.type for _, e in pairs if e.type.kind != DYNAMIC), SIMPLE[DYNAMIC])
        return Typed(CtyType(MAP, elem=elem), items=[(k, _retyped(e, elem)) for k, e in pairs])
    items = [typed(v, elem_t) for v in cast("list[object]", value)]
    if not items:
        return Typed(t, leaf=value)
    elem = next((e.type for e in items if e.type.kind != DYNAMIC), SIMPLE[DYNAMIC])
    return Typed(CtyType(t.kind, elem=elem), items=[_retyped(e, elem) for e in items])


def _retyped(element: Typed, elem: CtyType) -> Typed:
    return Typed(elem) if element.type.kind == DYNAMIC else element


def render(node: Typed, t: CtyType, out: list[str]) -> None:
    """JSON for ``node`` at declared type ``t``, as go-cty's JSON encoder writes it: at a dynamic
    position the value's own type and the value at that type (a typed null where a null took
    its collection's element type; a bare null only for a null of type dynamic)."""
    if t.kind == DYNAMIC:
        if node.type.kind == DYNAMIC:
            out.append("null")
            return
        out.append('{"type":' + node.type.json + ',"value":')
        render(node, node.type, out)
        out.append("}")
        return
    if node.items is None:
        out.append(_leaf_json(node.leaf))
        return
    if t.kind == OBJECT:
        out.append("{" + ",".join(quote(n) + ":" + _rendered(a, t.attrs[n])
                                  for n, a in cast("list[tuple[str, Typed]]", node.items)) + "}")
    elif t.kind == TUPLE:
        out.append("[" + ",".join(_rendered(e, et) for e, et in zip(cast("list[Typed]", node.items), t.elems, strict=True)) + "]")
    elif t.kind == MAP:
        pairs = sorted(((nfc(k), e) for k, e in cast("list[tuple[str, Typed]]", node.items)), key=lambda kv: kv[0])
        out.append("{" + ",".join(quote(k) + ":" + _rendered(e, t.elem) for k, e in pairs) + "}")  # type: ignore[arg-type]
    else:
        texts = [_rendered(e, t.elem) for e in cast("list[Typed]", node.items)]  # type: ignore[arg-type]
        if t.kind == SET:
            texts = sorted(set(texts))
        out.append("[" + ",".join(texts) + "]")


def _rendered(node: Typed, t: CtyType) -> str:
    out: list[str] = []
    render(node, t, out)
    return "".join(out)


def _leaf_json(value: object) -> str:
    """A parsed JSON value written back (the codec canonicalizes it on its way through)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Dec):
        return canonical_text(value)
    if isinstance(value, JsonObject):
        return "{" + ",".join(quote(k) + ":" + _leaf_json(v) for k, v in value) + "}"
    return "[" + ",".join(_leaf_json(v) for v in cast("list[object]", value)) + "]"


def as_gocty_json(value: object, t: CtyType, *, dynamic: bool = False) -> str:
    """A value of a type with dynamic in it, written as go-cty writes it (see ``render``): at
    declared type ``t``, or with ``dynamic`` as a dynamic value that came tagged ``t`` (the type
    its value has, and the value at that type)."""
    return _rendered(typed(value, t), SIMPLE[DYNAMIC] if dynamic else t)


def as_own_type(value: object, t: CtyType) -> tuple[CtyType, str]:
    """The type a value tagged ``t`` has in go-cty, and its JSON at that type."""
    node = typed(value, t)
    return node.type, _rendered(node, node.type)
