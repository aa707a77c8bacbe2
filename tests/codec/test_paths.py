"""AttributePath decoding from raw protobuf bytes, and schema-sensitive paths."""
from __future__ import annotations

import json

import pytest

from kilolock.codec import CodecError, decode_attribute_paths, sensitive_attributes_json, sensitive_paths
from kilolock.schema import Attribute, Block, GetAttr, Index, NestedBlock, NestedObject, NestingMode


# --- protobuf, hand-assembled from the wire format (tag = field << 3 | wire type) -----------------

def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _step_attr(name: str) -> bytes:
    return _len_field(1, _len_field(1, name.encode()))


def _step_key(key: str) -> bytes:
    return _len_field(1, _len_field(2, key.encode()))


def _step_int(i: int) -> bytes:
    return _len_field(1, _varint(3 << 3 | 0) + _varint(i))


def test_decodes_repeated_paths_at_field_6_and_skips_other_fields() -> None:
    path1 = _step_attr("password")
    path2 = _step_attr("tags") + _step_key("secret")
    path3 = _step_attr("rule") + _step_int(3) + _step_attr("token")
    raw = (
        _varint(1 << 3 | 0) + _varint(150)          # an unrelated varint field 1
        + _len_field(6, path1)
        + _varint(7 << 3 | 5) + b"\x00\x00\x80\x3f"  # fixed32 field 7
        + _len_field(6, path2)
        + _varint(8 << 3 | 1) + b"\x00" * 8          # fixed64 field 8
        + _len_field(6, path3)
    )
    assert decode_attribute_paths(raw) == [
        (GetAttr("password"),),
        (GetAttr("tags"), Index("secret")),
        (GetAttr("rule"), Index(3), GetAttr("token")),
    ]


def test_negative_int64_index_and_empty_input() -> None:
    assert decode_attribute_paths(_len_field(6, _step_int(-2))) == [(Index(-2),)]
    assert decode_attribute_paths(b"") == []


@pytest.mark.parametrize(("raw", "message"), [
    (b"\x32\x05\x0a", "claims 5 bytes"),                       # truncated length-delimited
    (b"\x32", "truncated varint"),                            # field 6, no length
    (b"\x30\x01", "field 6 has wire type 0"),                 # field 6 as a varint
    (b"\x33", "unsupported wire type 3"),                     # group start
    (b"\x32\x02\x0a\x00", "Step without a selector"),         # empty step
    (_len_field(6, _len_field(1, _len_field(1, b"\xff"))), "not valid UTF-8"),
    (b"\x08" + b"\xff" * 11, "longer than 10 bytes"),
    (b"\x00", "field number 0"),
    (_len_field(6, _len_field(1, _varint(3 << 3 | 2) + b"\x00")), "wire type 2"),
])
def test_garbage_is_a_codec_error(raw: bytes, message: str) -> None:
    with pytest.raises(CodecError, match=message):
        decode_attribute_paths(raw)


# --- schema-sensitive paths -----------------------------------------------------------------------

SECRET = Attribute(name="secret", type=b'"string"', sensitive=True)
PLAIN = Attribute(name="plain", type=b'"string"')


def _block(mode: NestingMode, inner: Block | None = None) -> Block:
    return Block(attributes=(PLAIN, Attribute(name="password", type=b'"string"', sensitive=True)),
                 block_types=(NestedBlock(type_name="rule", block=inner or Block(attributes=(PLAIN, SECRET)), nesting=mode),))


def _display(block: Block, value: object) -> list[list[dict]]:
    return sensitive_attributes_json(sensitive_paths(block, json.dumps(value).encode()))


def test_top_level_sensitive_attribute_even_when_null() -> None:
    assert sensitive_paths(_block(NestingMode.SINGLE), {"plain": "x", "password": None, "rule": None}) == [
        (GetAttr("password"),)]


def test_single_and_group_blocks() -> None:
    for mode in (NestingMode.SINGLE, NestingMode.GROUP):
        assert sensitive_paths(_block(mode), {"password": "p", "rule": {"secret": "s", "plain": "x"}}) == [
            (GetAttr("password"),), (GetAttr("rule"), GetAttr("secret"))]


def test_list_block_gets_int_index_steps() -> None:
    value = {"password": None, "rule": [{"secret": "a"}, {"secret": "b"}]}
    assert _display(_block(NestingMode.LIST), value) == [
        [{"type": "get_attr", "value": "password"}],
        [{"type": "get_attr", "value": "rule"}, {"type": "index", "value": {"value": 0, "type": "number"}},
         {"type": "get_attr", "value": "secret"}],
        [{"type": "get_attr", "value": "rule"}, {"type": "index", "value": {"value": 1, "type": "number"}},
         {"type": "get_attr", "value": "secret"}],
    ]


def test_map_block_gets_string_index_steps() -> None:
    value = {"rule": {"b": {"secret": "x"}, "a": {"secret": "y"}}}
    assert sensitive_paths(_block(NestingMode.MAP), value) == [
        (GetAttr("password"),),
        (GetAttr("rule"), Index("a"), GetAttr("secret")),
        (GetAttr("rule"), Index("b"), GetAttr("secret")),
    ]


def test_set_block_is_marked_as_a_whole_once() -> None:
    value = {"rule": [{"secret": "a"}, {"secret": "b"}]}
    assert sensitive_paths(_block(NestingMode.SET), value) == [(GetAttr("password"),), (GetAttr("rule"),)]
    assert sensitive_paths(_block(NestingMode.SET), {"rule": []}) == [(GetAttr("password"),)]


def test_dynamic_list_block_is_unwrapped() -> None:
    inner = Block(attributes=(SECRET, Attribute(name="any", type=b'"dynamic"')))
    value = {"rule": {"type": ["tuple", [["object", {"any": "number", "secret": "string"}]]],
                      "value": [{"any": 1, "secret": "s"}]}}
    assert sensitive_paths(_block(NestingMode.LIST, inner), value)[1] == (GetAttr("rule"), Index(0), GetAttr("secret"))


def test_blocks_without_sensitive_attributes_are_skipped() -> None:
    block = _block(NestingMode.LIST, Block(attributes=(PLAIN,)))
    assert sensitive_paths(block, {"rule": [{"plain": "x"}]}) == [(GetAttr("password"),)]


def test_nested_attributes_every_mode() -> None:
    def attr(mode: NestingMode) -> Attribute:
        return Attribute(name="creds", nested_type=NestedObject(attributes=(PLAIN, SECRET), nesting=mode))

    assert sensitive_paths(Block(attributes=(attr(NestingMode.SINGLE),)), {"creds": {"secret": "s"}}) == [
        (GetAttr("creds"), GetAttr("secret"))]
    assert sensitive_paths(Block(attributes=(attr(NestingMode.LIST),)), {"creds": [{}, {}]}) == [
        (GetAttr("creds"), Index(0), GetAttr("secret")), (GetAttr("creds"), Index(1), GetAttr("secret"))]
    assert sensitive_paths(Block(attributes=(attr(NestingMode.MAP),)), {"creds": {"k": {}}}) == [
        (GetAttr("creds"), Index("k"), GetAttr("secret"))]
    assert sensitive_paths(Block(attributes=(attr(NestingMode.SET),)), {"creds": [{}, {}]}) == [(GetAttr("creds"),)]
    assert sensitive_paths(Block(attributes=(attr(NestingMode.LIST),)), {"creds": None}) == []


def test_a_sensitive_nested_attribute_is_marked_whole() -> None:
    attr = Attribute(name="creds", sensitive=True,
                     nested_type=NestedObject(attributes=(SECRET,), nesting=NestingMode.LIST))
    assert sensitive_paths(Block(attributes=(attr,)), {"creds": [{"secret": "x"}]}) == [(GetAttr("creds"),)]


def test_union_with_prior_paths_is_sorted_and_unique() -> None:
    prior = [(GetAttr("tags"), Index("k")), (GetAttr("password"),)]
    new = sensitive_paths(_block(NestingMode.SINGLE), {"rule": None})
    assert sensitive_attributes_json(prior + new) == [
        [{"type": "get_attr", "value": "password"}],
        [{"type": "get_attr", "value": "tags"}, {"type": "index", "value": {"value": "k", "type": "string"}}],
    ]
