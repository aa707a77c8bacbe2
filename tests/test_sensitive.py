"""Schema-sensitive paths and their state JSON form (kilolock.sensitive)."""
from __future__ import annotations

import json

from kilolock.schema import Attribute, Block, GetAttr, Index, NestedBlock, NestedObject, NestingMode
from kilolock.sensitive import merged_marks, sensitive_attributes_json, sensitive_paths, values_at

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


SPEC_T = ["object", {"password": "string", "ports": ["list", "number"]}]
SPEC = {"spec": {"value": {"password": "pw-in-dynamic", "ports": [80, 443]}, "type": SPEC_T}}  # as state JSON stores it


def test_marks_inside_a_dynamic_value_survive_a_refresh_merge() -> None:
    # Terraform's marks are cty paths: they do not see the {"value", "type"} wrapper state JSON has.
    prior = [[{"type": "get_attr", "value": "spec"}, {"type": "get_attr", "value": "password"}]]
    assert merged_marks(prior, [], SPEC) == prior
    new = [(GetAttr("spec"), GetAttr("ports"), Index(1))]
    assert merged_marks([], new, SPEC) == sensitive_attributes_json(new)
    assert merged_marks([], [(GetAttr("spec"), GetAttr("gone"))], SPEC) == []  # a path the value lacks is dropped
    assert merged_marks([], [(GetAttr("spec"), GetAttr("ports"), Index(2))], SPEC) == []


def test_values_inside_a_dynamic_value_are_found_for_redaction() -> None:
    assert list(values_at(SPEC, [(GetAttr("spec"), GetAttr("password"))])) == ["pw-in-dynamic"]
    assert list(values_at(SPEC, [(GetAttr("spec"),)])) == [SPEC["spec"]]  # the attribute itself: as stored
    assert list(values_at(SPEC, [(GetAttr("nothing"),), (GetAttr("spec"), GetAttr("nothing"))])) == []
    assert merged_marks([[{"type": "get_attr", "value": "nothing"}]], [], {"a": 1}) == []  # no wrapper, no key
    # An object attribute that has keys named value and type is read as it is.
    plain = {"obj": {"value": "v", "type": "string"}}
    assert list(values_at(plain, [(GetAttr("obj"), GetAttr("value"))])) == ["v"]
