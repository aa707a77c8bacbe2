"""Provider schema blocks -> cty type specifications (Terraform's ``Block.ImpliedType``).

The result is Terraform's JSON type syntax, which either backend then compiles; optional-attribute
markers are left out because wire and state types never carry them.
"""
from __future__ import annotations

import json

from kilolock.codec.errors import CodecError
from kilolock.schema import Attribute, Block, NestedObject, NestingMode

TypeSpec = object  # parsed JSON type syntax: a str or a nested list/dict


def block_type_spec(block: Block) -> TypeSpec:
    """The implied object type of a block: every attribute plus one per nested block type."""
    attrs: dict[str, TypeSpec] = {a.name: attribute_type_spec(a) for a in block.attributes}
    for nested in block.block_types:
        if nested.type_name in attrs:
            continue  # an attribute and a block of one name is an invalid schema; Terraform keeps the attribute
        inner = block_type_spec(nested.block)
        mode = nested.nesting
        if mode in (NestingMode.SINGLE, NestingMode.GROUP):
            attrs[nested.type_name] = inner
        elif mode == NestingMode.LIST:
            # A block list whose contents have dynamic types decodes as a tuple, so its type is
            # only known per value: dynamic (hcldec BlockTupleSpec). Same for maps (BlockObjectSpec).
            attrs[nested.type_name] = "dynamic" if has_dynamic(inner) else ["list", inner]
        elif mode == NestingMode.MAP:
            attrs[nested.type_name] = "dynamic" if has_dynamic(inner) else ["map", inner]
        elif mode == NestingMode.SET:
            attrs[nested.type_name] = ["set", inner]
        else:
            raise CodecError(f"block {nested.type_name!r}: unsupported nesting mode {mode!r}")
    return ["object", attrs]


def attribute_type_spec(attr: Attribute) -> TypeSpec:
    if attr.nested_type is not None:
        return nested_object_type_spec(attr.nested_type, attr.name)
    if attr.type is None:
        raise CodecError(f"attribute {attr.name!r}: neither a type nor a nested type")
    try:
        return json.loads(attr.type)
    except ValueError as exc:
        raise CodecError(f"attribute {attr.name!r}: invalid type JSON: {exc}") from None


def nested_object_type_spec(obj: NestedObject, name: str) -> TypeSpec:
    """A protocol-6 nested attribute: always a plain collection (no dynamic exception)."""
    inner = ["object", {a.name: attribute_type_spec(a) for a in obj.attributes}]
    mode = obj.nesting
    if mode == NestingMode.SINGLE:
        return inner
    if mode == NestingMode.LIST:
        return ["list", inner]
    if mode == NestingMode.SET:
        return ["set", inner]
    if mode == NestingMode.MAP:
        return ["map", inner]
    raise CodecError(f"attribute {name!r}: unsupported nested attribute nesting mode {mode!r}")


def has_dynamic(spec: TypeSpec) -> bool:
    if spec == "dynamic":
        return True
    if isinstance(spec, list) and len(spec) >= 2:
        kind, body = spec[0], spec[1]
        if kind == "object" and isinstance(body, dict):
            return any(has_dynamic(v) for v in body.values())
        if kind == "tuple" and isinstance(body, list):
            return any(has_dynamic(v) for v in body)
        return has_dynamic(body)
    return False


def block_type_json(block: Block) -> bytes:
    return json.dumps(block_type_spec(block), separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
