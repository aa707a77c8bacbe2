"""Provider schemas and attribute paths as Kilolock's own types.

Both plugin protocol versions are converted into these (kilolock.provider), the codec compiles
them into wire types (kilolock.codec), and the store keeps them as JSON in the shape Terraform
prints with ``terraform providers schema -json`` so the two can be compared directly.
"""
from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass, field
from typing import Any


class NestingMode(enum.IntEnum):
    """Numbers as on the wire (tfplugin5/6 ``NestingMode``)."""

    INVALID = 0
    SINGLE = 1
    LIST = 2
    SET = 3
    MAP = 4
    GROUP = 5


@dataclass(frozen=True)
class Attribute:
    """One attribute of a block's schema."""

    name: str
    # cty JSON type spec, compact (e.g. b'["map","string"]'); None when nested_type is set.
    type: bytes | None = None
    nested_type: NestedObject | None = None
    description: str = ""
    required: bool = False
    optional: bool = False
    computed: bool = False
    sensitive: bool = False
    deprecated: bool = False
    write_only: bool = False


@dataclass(frozen=True)
class NestedObject:
    """A protocol-6 nested attribute type (``Schema.Object``); GROUP does not occur here."""

    attributes: tuple[Attribute, ...]
    nesting: NestingMode


@dataclass(frozen=True)
class Block:
    """A block's schema: its attributes and nested blocks."""

    attributes: tuple[Attribute, ...] = ()
    block_types: tuple[NestedBlock, ...] = ()
    version: int = 0
    description: str = ""
    deprecated: bool = False


@dataclass(frozen=True)
class NestedBlock:
    """A block nested in another, with how it nests."""

    type_name: str
    block: Block
    nesting: NestingMode
    min_items: int = 0
    max_items: int = 0


@dataclass(frozen=True)
class Schema:
    """A resource's, data source's or provider's schema, with its version."""

    version: int
    block: Block


@dataclass(frozen=True)
class ProviderSchema:
    """Everything GetProviderSchema returns (and identity schemas, when asked)."""

    protocol_version: int
    provider: Schema
    resource_schemas: dict[str, Schema] = field(default_factory=dict)
    data_source_schemas: dict[str, Schema] = field(default_factory=dict)
    provider_meta: Schema | None = None
    # Resource identity schemas by resource type (GetResourceIdentitySchemas; each Schema's version
    # is the identity schema version). None: not asked, as in a schema cached before kl knew identity.
    identity_schemas: dict[str, Schema] | None = None
    # List resource configuration schemas by type (protocol 5.10/6.10; {} before). None: not
    # known, as in a schema cached before kl asked for them.
    list_resource_schemas: dict[str, Schema] | None = None


# --- attribute paths -------------------------------------------------------------------------


@dataclass(frozen=True)
class GetAttr:
    """An attribute path step: the attribute by name."""

    name: str


@dataclass(frozen=True)
class Index:
    """An element step; ``key`` is a str (map key) or an int (list index)."""

    key: str | int


PathStep = GetAttr | Index
AttributePath = tuple[PathStep, ...]


@dataclass(frozen=True)
class Element:
    """A set element, named by its value (decoded JSON), as cty names one; only drift paths and
    ignore rules have it (``member[={"name":"eve"}]``), and nothing follows it: a set element has
    no parts of its own to change, it is added or removed whole."""

    value: Any

    def __hash__(self) -> int:  # a JSON value may be a dict or list: hash its canonical text
        return hash(element_json(self.value))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Element) and element_json(self.value) == element_json(other.value)


DriftStep = GetAttr | Index | Element
DriftPath = tuple[DriftStep, ...]


def element_json(value: Any) -> str:
    """A set element's one printed form: compact JSON, keys sorted, UTF-8 kept."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def path_to_state_json(path: AttributePath) -> list[dict[str, Any]]:
    """One path in Terraform's ``sensitive_attributes`` shape."""
    steps: list[dict[str, Any]] = []
    for step in path:
        if isinstance(step, GetAttr):
            steps.append({"type": "get_attr", "value": step.name})
        else:
            kind = "string" if isinstance(step.key, str) else "number"
            steps.append({"type": "index", "value": {"value": step.key, "type": kind}})
    return steps


def path_from_state_json(steps: list[dict[str, Any]]) -> AttributePath:
    out: list[PathStep] = []
    for step in steps:
        if step["type"] == "get_attr":
            out.append(GetAttr(step["value"]))
        elif step["type"] == "index":
            out.append(Index(step["value"]["value"]))
        else:
            raise ValueError(f"unknown path step type {step['type']!r}")
    return tuple(out)


def path_display(path: DriftPath) -> str:
    """The one printed form of a path, as Terraform writes one in plans and ``ignore_changes``:
    ``tags["k"]``, ``rule[0].cidr`` (no leading dot; the empty path is the whole object). A key is
    a JSON string that keeps UTF-8 as is (``tags["café"]``, as Terraform prints it and as kl prints
    values) and escapes only quote, backslash and control characters. The codec's error messages
    use it too; its Rust backend (codec_rs/src/errors.rs) writes the same text. A set element
    (drift only) is ``[=JSON]``: the element's value, compact with keys sorted (``element_json``);
    a list index or map key could not tell it apart (``ports[80]`` would be a position)."""
    parts: list[str] = []
    for step in path:
        if isinstance(step, GetAttr):
            parts.append(("." if parts else "") + step.name)
        elif isinstance(step, Element):
            parts.append("[=" + element_json(step.value) + "]")
        elif isinstance(step.key, str):
            parts.append("[" + json.dumps(step.key, ensure_ascii=False) + "]")
        else:
            parts.append(f"[{step.key}]")
    return "".join(parts)


_PATH_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_PATH_INDEX = re.compile(r'\[(?:(-?\d+)|("(?:[^"\\]|\\.)*"))\]')
_JSON = json.JSONDecoder()


def drift_path_parse(text: str) -> DriftPath:
    """A path written as ``path_display`` writes it (Terraform's form: ``tags["env"]``,
    ``rule[0].cidr``; a set element ``member[={"name":"eve"}]`` last), for whatever kl reads one
    from. Raises ValueError naming the position."""
    steps: list[DriftStep] = []
    pos = 0
    while pos < len(text):
        if steps and isinstance(steps[-1], Element):
            raise ValueError(f"attribute path {text!r}: nothing may follow a set element [=...] (position {pos + 1}): "
                             "a set element is added or removed whole")
        if text.startswith("[=", pos):
            try:
                value, end = _JSON.raw_decode(text, pos + 2)
            except ValueError:
                raise ValueError(f"attribute path {text!r}: expected a JSON value after [= at position {pos + 3}") from None
            if not text.startswith("]", end):
                raise ValueError(f"attribute path {text!r}: expected ] at position {end + 1}")
            if not steps:
                raise ValueError(f"attribute path {text!r}: a set element [=...] needs the set's path before it")
            steps.append(Element(value))
            pos = end + 1
            continue
        if text[pos] == "[":
            m = _PATH_INDEX.match(text, pos)
            if not m:
                raise ValueError(f"attribute path {text!r}: expected [NUMBER], [\"KEY\"] or [=JSON] at position {pos + 1}")
            steps.append(Index(int(m.group(1)) if m.group(1) is not None else json.loads(m.group(2))))
        else:
            if steps:
                if text[pos] != ".":
                    raise ValueError(f"attribute path {text!r}: expected . or [ at position {pos + 1}")
                pos += 1
            m = _PATH_NAME.match(text, pos)
            if not m:
                raise ValueError(f"attribute path {text!r}: expected an attribute name at position {pos + 1}")
            steps.append(GetAttr(m.group(0)))
        pos = m.end()
    if not steps:
        raise ValueError("attribute path is empty")
    return tuple(steps)


def path_parse(text: str) -> AttributePath:
    """``drift_path_parse`` without set elements: a path into a value (a search, a mark)."""
    path = drift_path_parse(text)
    if any(isinstance(step, Element) for step in path):
        raise ValueError(f"attribute path {text!r}: a set element [=...] cannot be used here")
    return tuple(step for step in path if not isinstance(step, Element))


# --- JSON form (``terraform providers schema -json``) ------------------------------------------

_NESTING_NAMES: dict[NestingMode, str] = {m: m.name.lower() for m in NestingMode if m is not NestingMode.INVALID}
_NESTING_BY_NAME = {v: k for k, v in _NESTING_NAMES.items()}


def _attribute_to_json(attr: Attribute) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if attr.type is not None:
        out["type"] = json.loads(attr.type)
    if attr.nested_type is not None:
        out["nested_type"] = {
            "attributes": {a.name: _attribute_to_json(a) for a in attr.nested_type.attributes},
            "nesting_mode": _NESTING_NAMES[attr.nested_type.nesting],
        }
    if attr.description:
        out["description"] = attr.description
        out["description_kind"] = "plain"
    for flag in ("required", "optional", "computed", "sensitive", "deprecated", "write_only"):
        if getattr(attr, flag):
            out[flag] = True
    return out


def block_to_json(block: Block) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if block.attributes:
        out["attributes"] = {a.name: _attribute_to_json(a) for a in block.attributes}
    if block.block_types:
        types: dict[str, Any] = {}
        for nb in block.block_types:
            item: dict[str, Any] = {"nesting_mode": _NESTING_NAMES[nb.nesting], "block": block_to_json(nb.block)}
            if nb.min_items:
                item["min_items"] = nb.min_items
            if nb.max_items:
                item["max_items"] = nb.max_items
            types[nb.type_name] = item
        out["block_types"] = types
    if block.description:
        out["description"] = block.description
        out["description_kind"] = "plain"
    if block.deprecated:
        out["deprecated"] = True
    return out


def schema_to_json(schema: Schema) -> dict[str, Any]:
    return {"version": schema.version, "block": block_to_json(schema.block)}


def _attribute_from_json(name: str, obj: dict[str, Any]) -> Attribute:
    nested = None
    if "nested_type" in obj:
        nt = obj["nested_type"]
        nested = NestedObject(
            attributes=tuple(_attribute_from_json(n, a) for n, a in sorted(nt.get("attributes", {}).items())),
            nesting=_NESTING_BY_NAME[nt["nesting_mode"]],
        )
    type_bytes = None
    if "type" in obj:
        type_bytes = json.dumps(obj["type"], separators=(",", ":"), sort_keys=True).encode()
    return Attribute(
        name=name,
        type=type_bytes,
        nested_type=nested,
        description=obj.get("description", ""),
        required=obj.get("required", False),
        optional=obj.get("optional", False),
        computed=obj.get("computed", False),
        sensitive=obj.get("sensitive", False),
        deprecated=obj.get("deprecated", False),
        write_only=obj.get("write_only", False),
    )


def block_from_json(obj: dict[str, Any], version: int = 0) -> Block:
    return Block(
        attributes=tuple(_attribute_from_json(n, a) for n, a in sorted(obj.get("attributes", {}).items())),
        block_types=tuple(
            NestedBlock(
                type_name=n,
                block=block_from_json(b.get("block", {})),
                nesting=_NESTING_BY_NAME[b["nesting_mode"]],
                min_items=b.get("min_items", 0),
                max_items=b.get("max_items", 0),
            )
            for n, b in sorted(obj.get("block_types", {}).items())
        ),
        version=version,
        description=obj.get("description", ""),
        deprecated=obj.get("deprecated", False),
    )


def schema_from_json(obj: dict[str, Any]) -> Schema:
    version = int(obj.get("version", 0))
    return Schema(version=version, block=block_from_json(obj.get("block", {}), version))


def provider_schema_to_json(ps: ProviderSchema) -> dict[str, Any]:
    out: dict[str, Any] = {
        "protocol_version": ps.protocol_version,
        "provider": schema_to_json(ps.provider),
        "resource_schemas": {k: schema_to_json(v) for k, v in sorted(ps.resource_schemas.items())},
        "data_source_schemas": {k: schema_to_json(v) for k, v in sorted(ps.data_source_schemas.items())},
    }
    if ps.provider_meta is not None:
        out["provider_meta"] = schema_to_json(ps.provider_meta)
    if ps.identity_schemas is not None:
        out["identity_schemas"] = {k: schema_to_json(v) for k, v in sorted(ps.identity_schemas.items())}
    if ps.list_resource_schemas is not None:
        out["list_resource_schemas"] = {k: schema_to_json(v) for k, v in sorted(ps.list_resource_schemas.items())}
    return out


def provider_schema_from_json(obj: dict[str, Any]) -> ProviderSchema:
    meta = obj.get("provider_meta")
    identity = obj.get("identity_schemas")
    listing = obj.get("list_resource_schemas")
    return ProviderSchema(
        protocol_version=int(obj["protocol_version"]),
        provider=schema_from_json(obj["provider"]),
        resource_schemas={k: schema_from_json(v) for k, v in obj.get("resource_schemas", {}).items()},
        data_source_schemas={k: schema_from_json(v) for k, v in obj.get("data_source_schemas", {}).items()},
        provider_meta=schema_from_json(meta) if meta is not None else None,
        identity_schemas={k: schema_from_json(v) for k, v in identity.items()} if identity is not None else None,
        list_resource_schemas={k: schema_from_json(v) for k, v in listing.items()} if listing is not None else None,
    )
