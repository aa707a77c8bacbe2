"""Schema blocks -> implied types (Terraform's Block.ImpliedType), in every nesting mode, and the
compiled block encoding real-looking values on both backends."""
from __future__ import annotations

import json
import types
from typing import Any

import pytest

from kilolock.codec import CodecError, block_type_json
from kilolock.schema import Attribute, Block, NestedBlock, NestedObject, NestingMode

ID = Attribute(name="id", type=b'"string"', computed=True)
CIDR = Attribute(name="cidr", type=b'"string"', optional=True)
PORT = Attribute(name="port", type=b'"number"', optional=True)
ANY = Attribute(name="any", type=b'"dynamic"', optional=True)
RULE = Block(attributes=(CIDR, PORT))


def _spec(block: Block) -> Any:
    return json.loads(block_type_json(block))


def _nested(mode: NestingMode, inner: Block = RULE) -> Block:
    return Block(attributes=(ID,), block_types=(NestedBlock(type_name="rule", block=inner, nesting=mode),))


RULE_OBJECT = ["object", {"cidr": "string", "port": "number"}]


@pytest.mark.parametrize(("mode", "expected"), [
    (NestingMode.SINGLE, RULE_OBJECT),
    (NestingMode.GROUP, RULE_OBJECT),
    (NestingMode.LIST, ["list", RULE_OBJECT]),
    (NestingMode.SET, ["set", RULE_OBJECT]),
    (NestingMode.MAP, ["map", RULE_OBJECT]),
])
def test_nested_block_modes(mode: NestingMode, expected: object) -> None:
    assert _spec(_nested(mode)) == ["object", {"id": "string", "rule": expected}]


@pytest.mark.parametrize(("mode", "expected"), [
    # hcldec BlockTupleSpec / BlockObjectSpec: the collection's type is only known per value.
    (NestingMode.LIST, "dynamic"),
    (NestingMode.MAP, "dynamic"),
    (NestingMode.SET, ["set", ["object", {"any": "dynamic"}]]),
    (NestingMode.SINGLE, ["object", {"any": "dynamic"}]),
])
def test_dynamic_contents_make_list_and_map_blocks_dynamic(mode: NestingMode, expected: object) -> None:
    inner = Block(attributes=(ANY,))
    assert _spec(_nested(mode, inner)) == ["object", {"id": "string", "rule": expected}]


def test_dynamic_deep_inside_a_list_block_counts() -> None:
    deep = Block(block_types=(NestedBlock(type_name="x", block=Block(attributes=(ANY,)), nesting=NestingMode.SINGLE),))
    assert _spec(_nested(NestingMode.LIST, deep))[1]["rule"] == "dynamic"


@pytest.mark.parametrize(("mode", "expected"), [
    (NestingMode.SINGLE, RULE_OBJECT),
    (NestingMode.LIST, ["list", RULE_OBJECT]),
    (NestingMode.SET, ["set", RULE_OBJECT]),
    (NestingMode.MAP, ["map", RULE_OBJECT]),
])
def test_nested_attribute_modes(mode: NestingMode, expected: object) -> None:
    attr = Attribute(name="rules", nested_type=NestedObject(attributes=(CIDR, PORT), nesting=mode), optional=True)
    assert _spec(Block(attributes=(ID, attr))) == ["object", {"id": "string", "rules": expected}]


def test_nested_attributes_never_turn_dynamic() -> None:
    attr = Attribute(name="rules", nested_type=NestedObject(attributes=(ANY,), nesting=NestingMode.LIST))
    assert _spec(Block(attributes=(attr,))) == ["object", {"rules": ["list", ["object", {"any": "dynamic"}]]}]


def test_attribute_without_type_is_an_error() -> None:
    with pytest.raises(CodecError, match="neither a type nor a nested type"):
        block_type_json(Block(attributes=(Attribute(name="broken"),)))


def test_compiled_block_encodes_and_decodes(impl: types.ModuleType) -> None:
    block = Block(
        attributes=(ID, Attribute(name="tags", type=b'["map","string"]', optional=True)),
        block_types=(
            NestedBlock(type_name="ingress", block=RULE, nesting=NestingMode.SET),
            NestedBlock(type_name="meta", block=Block(attributes=(ANY,)), nesting=NestingMode.LIST),
            NestedBlock(type_name="timeouts", block=Block(attributes=(CIDR,)), nesting=NestingMode.SINGLE),
        ),
    )
    t = impl.compile_type(block_type_json(block))
    state = (b'{"id":"sg-1","ingress":[{"cidr":"10.0.0.0/8","port":443}],'
             b'"meta":{"type":["tuple",[["object",{"any":"number"}]]],"value":[{"any":1}]},'
             b'"tags":{"b":"2","a":"1"},"timeouts":null}')
    wire = t.encode(state)
    assert t.decode(wire) == (b'{"id":"sg-1","ingress":[{"cidr":"10.0.0.0/8","port":443}],'
                              b'"meta":{"type":["tuple",[["object",{"any":"number"}]]],"value":[{"any":1}]},'
                              b'"tags":{"a":"1","b":"2"},"timeouts":null}')
    with pytest.raises(CodecError, match=r"^ingress\[0\]\.port: expected number, got string$"):
        t.encode(b'{"ingress":[{"port":"x"}]}')
