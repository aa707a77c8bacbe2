"""What kl indexes of a decrypted state (kilolock.encryption.masking): the objects' marks and the
cached schemas of their types say what is masked, through nested blocks and nested attributes of
every nesting; a type without a cached schema has every value masked."""
from __future__ import annotations

import copy
from collections.abc import Iterable

from kilolock.encryption.masking import mask_sensitive
from kilolock.schema import Attribute, Block, NestedBlock, NestedObject, NestingMode, Schema, schema_to_json

M = "(sensitive)"
SOURCE = "registry.terraform.io/kilolock/testfw"
PLAIN = Attribute(name="plain", type=b'"string"', optional=True)
SECRET = Attribute(name="secret", type=b'"string"', optional=True, sensitive=True)
INNER = Block(attributes=(PLAIN, SECRET))
OBJECT = (PLAIN, SECRET)

BLOCK = Block(
    attributes=(
        Attribute(name="id", type=b'"string"', computed=True),
        Attribute(name="password", type=b'"string"', optional=True, sensitive=True),
        Attribute(name="tags", type=b'["map","string"]', optional=True),
        Attribute(name="single", nested_type=NestedObject(OBJECT, NestingMode.SINGLE), optional=True),
        Attribute(name="list_nested", nested_type=NestedObject(OBJECT, NestingMode.LIST), optional=True),
        Attribute(name="map_nested", nested_type=NestedObject(OBJECT, NestingMode.MAP), optional=True),
        Attribute(name="set_nested", nested_type=NestedObject(OBJECT, NestingMode.SET), optional=True),
    ),
    block_types=(
        NestedBlock(type_name="one", block=INNER, nesting=NestingMode.SINGLE),
        NestedBlock(type_name="rule", block=INNER, nesting=NestingMode.LIST),
        NestedBlock(type_name="member", block=INNER, nesting=NestingMode.SET),
        NestedBlock(type_name="named", block=INNER, nesting=NestingMode.MAP),
    ),
)


def _pair(n: int) -> dict[str, str]:
    return {"plain": f"p{n}", "secret": f"s{n}"}


ATTRIBUTES = {
    "id": "thing-1", "password": "pw", "tags": {"env": "prod"},
    "single": _pair(1), "list_nested": [_pair(2), _pair(3)], "map_nested": {"k": _pair(4)}, "set_nested": [_pair(5)],
    "one": [_pair(6)][0], "rule": [_pair(7), _pair(8)], "member": [_pair(9)], "named": {"n": _pair(10)},
}


def _doc(attributes: dict, marks: list | None = None, type_: str = "testfw_thing") -> dict:
    return {"version": 4, "serial": 1, "lineage": "l", "outputs": {"o": {"value": "secret-output", "type": "string"}},
            "resources": [{"mode": "managed", "type": type_, "name": "a", "provider": f'provider["{SOURCE}"]',
                           "instances": [{"schema_version": 0, "attributes": copy.deepcopy(attributes),
                                          "sensitive_attributes": marks or []}]}]}


def _schemas(asked: list) -> object:
    def source(wanted: Iterable[tuple[str, str, str]]) -> dict:
        asked.extend(wanted)
        return {(SOURCE, "managed", "testfw_thing"): [schema_to_json(Schema(0, BLOCK))]}
    return source


def _attributes(doc: dict) -> dict:
    return doc["resources"][0]["instances"][0]["attributes"]


def test_a_cached_schema_masks_what_the_marks_do_not_list_at_every_nesting() -> None:
    asked: list = []
    doc = mask_sensitive(_doc(ATTRIBUTES), _schemas(asked))  # type: ignore[arg-type]
    assert asked == [(SOURCE, "managed", "testfw_thing")]
    assert _attributes(doc) == {
        "id": "thing-1", "password": M, "tags": {"env": "prod"},
        "single": {"plain": "p1", "secret": M},
        "list_nested": [{"plain": "p2", "secret": M}, {"plain": "p3", "secret": M}],
        "map_nested": {"k": {"plain": "p4", "secret": M}},
        "set_nested": M,  # cty keeps no mark on a set element: the set is sensitive as a whole
        "one": {"plain": "p6", "secret": M},
        "rule": [{"plain": "p7", "secret": M}, {"plain": "p8", "secret": M}],
        "member": M,
        "named": {"n": {"plain": "p10", "secret": M}},
    }
    assert doc["outputs"] == {}


def test_marks_still_mask_what_the_schema_does_not_call_sensitive() -> None:
    marks = [[{"type": "get_attr", "value": "tags"}]]  # a sensitive variable's value
    doc = mask_sensitive(_doc(ATTRIBUTES, marks), _schemas([]))  # type: ignore[arg-type]
    assert _attributes(doc)["tags"] == M and _attributes(doc)["id"] == "thing-1"


def test_a_type_without_a_cached_schema_has_every_value_masked() -> None:
    for schemas in (None, _schemas([])):
        doc = mask_sensitive(_doc({**ATTRIBUTES, "gone": None}, type_="testfw_other"), schemas)  # type: ignore[arg-type]
        assert _attributes(doc) == {**dict.fromkeys(ATTRIBUTES, M), "gone": None}


def test_a_flatmap_object_has_every_value_masked() -> None:
    doc = _doc({})
    del doc["resources"][0]["instances"][0]["attributes"]
    doc["resources"][0]["instances"][0]["attributes_flat"] = {"id": "x", "password": "pw", "%": "0"}
    flat = mask_sensitive(doc, _schemas([]))["resources"][0]["instances"][0]["attributes_flat"]  # type: ignore[arg-type]
    assert flat == {"id": M, "password": M, "%": M}
