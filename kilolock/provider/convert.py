"""The one converter from tfplugin5/6 messages to Kilolock's own types.

Both generated modules use the same field names for everything converted here; the few v6-only
fields (nested attribute types) are looked up by presence, so one function serves both versions.
Values stay bytes: attribute types are the provider's own compact cty JSON type spec.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from google.protobuf.message import DecodeError

from kilolock.provider.diagnostics import Diagnostic, Severity
from kilolock.schema import (
    Attribute,
    AttributePath,
    Block,
    GetAttr,
    Index,
    NestedBlock,
    NestedObject,
    NestingMode,
    PathStep,
    ProviderSchema,
    Schema,
)


def attribute_path(msg: Any) -> AttributePath:
    steps: list[PathStep] = []
    for step in msg.steps:
        kind = step.WhichOneof("selector")
        if kind == "attribute_name":
            steps.append(GetAttr(step.attribute_name))
        elif kind == "element_key_string":
            steps.append(Index(step.element_key_string))
        elif kind == "element_key_int":
            steps.append(Index(step.element_key_int))
        else:  # Terraform stops at a step it cannot represent; so do we
            break
    return tuple(steps)


def undeclared_attribute_paths(payloads: Iterable[bytes], message_type: Any) -> tuple[AttributePath, ...]:
    """AttributePaths sent in a field the protocol does not declare (ReadResource.Response field 6,
    the ADR's dynamic sensitive paths), parsed with the generated ``message_type``.

    Stricter than ``attribute_path``: a diagnostic's path may end early at a step Terraform cannot
    represent, but a sensitive path cut short would mark more, or a step-less one the whole object,
    so such a step is malformed. Raises ValueError with what is wrong.
    """
    paths = []
    for payload in payloads:
        try:
            msg = message_type.FromString(payload)
        except DecodeError as exc:
            raise ValueError(str(exc)) from None
        if any(step.WhichOneof("selector") is None for step in msg.steps):
            raise ValueError("AttributePath.Step without a selector")
        paths.append(attribute_path(msg))
    return tuple(paths)


def diagnostics(msgs: Iterable[Any]) -> tuple[Diagnostic, ...]:
    out = []
    for d in msgs:
        try:
            severity = Severity(d.severity)
        except ValueError:
            severity = Severity.INVALID
        path = attribute_path(d.attribute) if d.HasField("attribute") else ()
        out.append(Diagnostic(severity, d.summary, d.detail, path))
    return tuple(out)


def _attribute(msg: Any) -> Attribute:
    nested = None
    if hasattr(msg, "nested_type") and msg.HasField("nested_type"):
        nested = NestedObject(
            attributes=tuple(sorted((_attribute(a) for a in msg.nested_type.attributes), key=lambda a: a.name)),
            nesting=NestingMode(msg.nested_type.nesting),
        )
    return Attribute(
        name=msg.name,
        type=bytes(msg.type) if msg.type else None,
        nested_type=nested,
        description=msg.description,
        required=msg.required,
        optional=msg.optional,
        computed=msg.computed,
        sensitive=msg.sensitive,
        deprecated=msg.deprecated,
        write_only=msg.write_only,
    )


def _block(msg: Any, version: int) -> Block:
    return Block(
        attributes=tuple(sorted((_attribute(a) for a in msg.attributes), key=lambda a: a.name)),
        block_types=tuple(
            sorted(
                (
                    NestedBlock(
                        type_name=nb.type_name,
                        block=_block(nb.block, 0),
                        nesting=NestingMode(nb.nesting),
                        min_items=nb.min_items,
                        max_items=nb.max_items,
                    )
                    for nb in msg.block_types
                ),
                key=lambda nb: nb.type_name,
            )
        ),
        # Only the top-level block carries the schema version (as kilolock.schema's JSON form does).
        version=version,
        description=msg.description,
        deprecated=msg.deprecated,
    )


def schema(msg: Any) -> Schema:
    return Schema(version=msg.version, block=_block(msg.block, msg.version))


def _provider_meta(resp: Any) -> Schema | None:
    # Some servers send an empty provider_meta schema; like Terraform's JSON, treat it as absent.
    if not resp.HasField("provider_meta"):
        return None
    meta = schema(resp.provider_meta)
    return meta if (meta.block.attributes or meta.block.block_types) else None


def provider_schema(resp: Any, protocol_version: int) -> ProviderSchema:
    return ProviderSchema(
        protocol_version=protocol_version,
        provider=schema(resp.provider),
        resource_schemas={name: schema(s) for name, s in resp.resource_schemas.items()},
        data_source_schemas={name: schema(s) for name, s in resp.data_source_schemas.items()},
        provider_meta=_provider_meta(resp),
        list_resource_schemas={name: schema(s) for name, s in resp.list_resource_schemas.items()},
    )


def identity_schemas(resp: Any) -> dict[str, Schema]:
    """Resource identity schemas as plain schemas: one block of attributes, so the codec compiles
    them like any other object type. required/optional_for_import map to required/optional."""
    out: dict[str, Schema] = {}
    for name, ident in resp.identity_schemas.items():
        attrs = tuple(
            sorted(
                (
                    Attribute(
                        name=a.name,
                        type=bytes(a.type),
                        description=a.description,
                        required=a.required_for_import,
                        optional=a.optional_for_import,
                    )
                    for a in ident.identity_attributes
                ),
                key=lambda a: a.name,
            )
        )
        out[name] = Schema(version=ident.version, block=Block(attributes=attrs, version=ident.version))
    return out
