"""Drift paths by shape (issue 12's convention, session 6's fidelity gaps): one row per shape a
provider schema can give a value, the exact paths kilolock.drift.changes reports with the schema,
and what it reports without one (no cached schema: keys guessed, but a dynamic value's stored
``{"value", "type"}`` wrapper never shows)."""
from __future__ import annotations

from typing import Any

import pytest

from kilolock import drift
from kilolock import schema as sch
from kilolock.sensitive import sensitive_paths


def wrap(value: Any, type_: Any) -> dict[str, Any]:
    """A dynamic value as Terraform stores it in state JSON."""
    return {"value": value, "type": type_}


PAIR = {"a": {"type": "string", "optional": True}, "n": {"type": "number", "optional": True}}
BLOCK = {"attributes": {"a": {"type": "string", "optional": True}, "n": {"type": "number", "optional": True}}}
SCHEMA = sch.block_from_json({
    "attributes": {
        "id": {"type": "string", "required": True},
        "tags": {"type": ["map", "string"], "optional": True},
        "obj": {"type": ["object", {"k": "string", "v": "number"}], "optional": True},
        "labels": {"type": ["set", "string"], "optional": True},
        "ports": {"type": ["set", "number"], "optional": True},
        "objects": {"type": ["set", ["object", {"k": "string", "v": "number"}]], "optional": True},
        "secrets": {"type": ["set", "string"], "optional": True, "sensitive": True},
        "dyn": {"type": "dynamic", "optional": True},
        "dyn_map": {"type": ["map", "dynamic"], "optional": True},
        "single": {"nested_type": {"nesting_mode": "single", "attributes": {
            **PAIR, "token": {"type": "string", "optional": True, "sensitive": True}}}, "optional": True},
        "list_nested": {"nested_type": {"nesting_mode": "list", "attributes": PAIR}, "optional": True},
        "set_nested": {"nested_type": {"nesting_mode": "set", "attributes": PAIR}, "optional": True},
        "map_nested": {"nested_type": {"nesting_mode": "map", "attributes": PAIR}, "optional": True},
        "deep": {"nested_type": {"nesting_mode": "single", "attributes": {
            "inner": {"nested_type": {"nesting_mode": "map", "attributes": PAIR}, "optional": True}}}, "optional": True},
    },
    "block_types": {
        "b_single": {"nesting_mode": "single", "block": BLOCK},
        "b_group": {"nesting_mode": "group", "block": BLOCK},
        "b_list": {"nesting_mode": "list", "block": BLOCK},
        "b_set": {"nesting_mode": "set", "block": BLOCK},
        "b_map": {"nesting_mode": "map", "block": BLOCK},
        # A LIST of blocks holding a dynamic attribute is a tuple to Terraform, stored wrapped.
        "b_dyn_list": {"nesting_mode": "list", "block": {"attributes": {"d": {"type": "dynamic", "optional": True}}}},
    },
})

OBJ_T = ["object", {"x": "number", "y": ["list", "string"]}]

# (name, before, after, paths with the schema, paths without one); before/after are the changed
# attributes only (the rest of the object is equal on both sides).
ROWS: list[tuple[str, dict[str, Any], dict[str, Any], list[tuple[str, Any, Any]], list[str]]] = [
    ("map attribute: keys", {"tags": {"env": "dev"}}, {"tags": {"env": "prod"}},
     [('tags["env"]', "dev", "prod")], ['tags["env"]']),
    ("map attribute with an attribute-like key", {"tags": {"k": "1"}}, {"tags": {"k": "2"}}, [('tags["k"]', "1", "2")], ['tags["k"]']),
    ("object attribute: attributes", {"obj": {"k": "a", "v": 1}}, {"obj": {"k": "a", "v": 2}}, [("obj.v", 1, 2)], ['obj["v"]']),
    ("dynamic holding an object", {"dyn": wrap({"x": 1, "y": ["a"]}, OBJ_T)}, {"dyn": wrap({"x": 2, "y": ["a"]}, OBJ_T)},
     [("dyn.x", 1, 2)], ["dyn.x"]),
    ("dynamic holding a list", {"dyn": wrap(["a", "b"], ["list", "string"])}, {"dyn": wrap(["a", "c"], ["list", "string"])},
     [("dyn[1]", "b", "c")], ["dyn[1]"]),
    ("dynamic holding a map", {"dyn": wrap({"k": "a"}, ["map", "string"])}, {"dyn": wrap({"k": "b"}, ["map", "string"])},
     [('dyn["k"]', "a", "b")], ['dyn["k"]']),
    ("dynamic holding a string", {"dyn": wrap("a", "string")}, {"dyn": wrap("b", "string")}, [("dyn", "a", "b")], ["dyn"]),
    ("dynamic whose type changed is shown whole, unwrapped",
     {"dyn": wrap({"x": 1, "y": ["a", "b"]}, OBJ_T)}, {"dyn": wrap(["now", "a", "list"], ["list", "string"])},
     [("dyn", {"x": 1, "y": ["a", "b"]}, ["now", "a", "list"])], ["dyn"]),
    ("dynamic set from null", {"dyn": None}, {"dyn": wrap({"x": 1, "y": []}, OBJ_T)}, [("dyn", None, {"x": 1, "y": []})], ["dyn"]),
    ("dynamic holding a set", {"dyn": wrap(["a", "b"], ["set", "string"])}, {"dyn": wrap(["b", "c"], ["set", "string"])},
     [('dyn[="a"]', "a", None), ('dyn[="c"]', None, "c")], ['dyn[="a"]', 'dyn[="c"]']),  # the wrapper says: a set
    ("map of dynamic: each element wrapped", {"dyn_map": {"k": wrap(1, "number")}}, {"dyn_map": {"k": wrap(2, "number")}},
     [('dyn_map["k"]', 1, 2)], ['dyn_map["k"]']),
    ("single nested attribute", {"single": {"a": "s", "n": 3, "token": None}}, {"single": {"a": "s", "n": 4, "token": None}},
     [("single.n", 3, 4)], ['single["n"]']),
    ("list nested attribute", {"list_nested": [{"a": "x", "n": 1}]}, {"list_nested": [{"a": "x", "n": 2}]},
     [("list_nested[0].n", 1, 2)], ["list_nested[0].n"]),
    ("map nested attribute", {"map_nested": {"m": {"a": "x", "n": 7}}}, {"map_nested": {"m": {"a": "x", "n": 8}}},
     [('map_nested["m"].n', 7, 8)], ['map_nested["m"]["n"]']),
    ("map nested attribute: an element added", {"map_nested": {"m": {"a": "x", "n": 7}}},
     {"map_nested": {"m": {"a": "x", "n": 7}, "k": {"a": "k0", "n": None}}},
     [('map_nested["k"]', None, {"a": "k0", "n": None})], ['map_nested["k"]']),
    ("map nested inside single nested", {"deep": {"inner": {"k": {"a": "x", "n": 1}}}}, {"deep": {"inner": {"k": {"a": "y", "n": 1}}}},
     [('deep.inner["k"].a', "x", "y")], ['deep["inner"]["k"]["a"]']),
    ("set nested attribute: one added, none shifted", {"set_nested": [{"a": "s1", "n": 1}]},
     {"set_nested": [{"a": "s0", "n": None}, {"a": "s1", "n": 1}]},
     [('set_nested[={"a":"s0","n":null}]', None, {"a": "s0", "n": None})], ["set_nested"]),
    ("set of objects: one removed from the front", {"objects": [{"k": "one", "v": 1}, {"k": "two", "v": 2}, {"k": "z", "v": 9}]},
     {"objects": [{"k": "two", "v": 2}, {"k": "z", "v": 9}]},
     [('objects[={"k":"one","v":1}]', {"k": "one", "v": 1}, None)], ["objects"]),
    ("set of objects: an element changed is one removed and one added",
     {"objects": [{"k": "one", "v": 1}, {"k": "two", "v": 2}]}, {"objects": [{"k": "one", "v": 1}, {"k": "three", "v": 3}]},
     [('objects[={"k":"two","v":2}]', {"k": "two", "v": 2}, None), ('objects[={"k":"three","v":3}]', None, {"k": "three", "v": 3})],
     ["objects[1].k", "objects[1].v"]),
    ("set of strings", {"labels": ["a", "b", "c"]}, {"labels": ["b", "c", "d"]},
     [('labels[="a"]', "a", None), ('labels[="d"]', None, "d")], ["labels[0]", "labels[1]", "labels[2]"]),
    ("set of numbers: an element is not a position", {"ports": [80, 443]}, {"ports": [443]}, [("ports[=80]", 80, None)], ["ports"]),
    ("set reordered: no change", {"labels": ["a", "b"]}, {"labels": ["b", "a"]}, [], ["labels[0]", "labels[1]"]),
    ("set from null is shown whole", {"labels": None}, {"labels": ["a"]}, [("labels", None, ["a"])], ["labels"]),
    ("sensitive set: shown whole, masked", {"secrets": ["p1"]}, {"secrets": ["p1", "p2"]},
     [("secrets", "(sensitive)", "(sensitive)")], ["secrets"]),
    ("single nested block", {"b_single": {"a": "x", "n": 1}}, {"b_single": {"a": "x", "n": 2}}, [("b_single.n", 1, 2)],
     ['b_single["n"]']),
    ("group nested block", {"b_group": {"a": "x", "n": 1}}, {"b_group": {"a": "y", "n": 1}}, [("b_group.a", "x", "y")],
     ['b_group["a"]']),
    ("list nested block", {"b_list": [{"a": "r1", "n": 1}]}, {"b_list": [{"a": "r1", "n": 2}]}, [("b_list[0].n", 1, 2)],
     ["b_list[0].n"]),
    ("set nested block", {"b_set": [{"a": "bob", "n": 1}]}, {"b_set": [{"a": "bob", "n": 2}, {"a": "eve", "n": None}]},
     [('b_set[={"a":"bob","n":1}]', {"a": "bob", "n": 1}, None), ('b_set[={"a":"bob","n":2}]', None, {"a": "bob", "n": 2}),
      ('b_set[={"a":"eve","n":null}]', None, {"a": "eve", "n": None})], ["b_set"]),
    ("map nested block", {"b_map": {"x": {"a": "v", "n": 1}}}, {"b_map": {"x": {"a": "v", "n": 2}}}, [('b_map["x"].n', 1, 2)],
     ['b_map["x"]["n"]']),
    ("list of blocks holding a dynamic: a wrapped tuple",
     {"b_dyn_list": wrap([{"d": wrap(1, "number")}], ["tuple", [["object", {"d": "dynamic"}]]])},
     {"b_dyn_list": wrap([{"d": wrap(2, "number")}], ["tuple", [["object", {"d": "dynamic"}]]])},
     [("b_dyn_list[0].d", 1, 2)], ["b_dyn_list[0].d"]),
]


def _whole(changed: dict[str, Any]) -> dict[str, Any]:
    return {"id": "x", **changed}


@pytest.mark.parametrize(("before", "after", "expected"), [pytest.param(b, a, e, id=n) for n, b, a, e, _ in ROWS])
def test_paths_with_the_schema(before: dict[str, Any], after: dict[str, Any], expected: list[tuple[str, Any, Any]]) -> None:
    marks = sensitive_paths(SCHEMA, _whole(before)) + sensitive_paths(SCHEMA, _whole(after))
    got = drift.changes(_whole(before), _whole(after), schema_sensitive=marks, block=SCHEMA)
    assert [(c.path, c.before, c.after) for c in got] == expected


@pytest.mark.parametrize(("before", "after", "expected"), [pytest.param(b, a, e, id=n) for n, b, a, _, e in ROWS])
def test_paths_without_a_schema_never_show_a_dynamic_wrapper(before: dict[str, Any], after: dict[str, Any],
                                                             expected: list[str]) -> None:
    got = drift.changes(_whole(before), _whole(after))
    assert [c.path for c in got] == expected
    for c in got:
        assert '["value"]' not in c.path and '["type"]' not in c.path, c
        assert not drift.is_dynamic_wrapper(c.before) and not drift.is_dynamic_wrapper(c.after), c


@pytest.mark.parametrize(("before", "after", "expected"), [pytest.param(b, a, e, id=n) for n, b, a, e, _ in ROWS])
def test_every_path_shown_parses_back_to_itself(before: dict[str, Any], after: dict[str, Any],
                                                expected: list[tuple[str, Any, Any]]) -> None:
    for path, _, _ in expected:
        assert sch.path_display(sch.drift_path_parse(path)) == path


def test_a_set_element_holding_a_secret_never_shows_in_a_path() -> None:
    # set_nested holds no secret in this schema; marks (Terraform's own) hoisted onto the set do.
    before, after = _whole({"set_nested": [{"a": "pw-1", "n": 1}]}), _whole({"set_nested": [{"a": "pw-2", "n": 1}]})
    marks = [[{"type": "get_attr", "value": "set_nested"}]]
    got = drift.changes(before, after, marks, marks, block=SCHEMA)
    assert [(c.path, c.before, c.after) for c in got] == [("set_nested", "(sensitive)", "(sensitive)")]


def test_of_several_cached_schemas_the_one_that_fits_the_object_is_used() -> None:
    old = sch.block_from_json({"attributes": {"id": {"type": "string"}, "title": {"type": "string"}}})
    assert drift.choose_block([old, SCHEMA], _whole({"tags": {}})) is SCHEMA
    assert drift.choose_block([old, SCHEMA], {"id": "x", "title": "t"}) is old
    assert drift.choose_block([], {"id": "x"}) is None


@pytest.mark.parametrize(("text", "message"), [
    ('m[="a"].b', "nothing may follow a set element"), ("[=1]", "needs the set's path"),
    ("m[=nope]", "expected a JSON value"), ("m[=1", "expected ]"),
])
def test_a_bad_set_element_path_names_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        sch.drift_path_parse(text)


def test_a_set_element_is_not_a_path_into_a_value() -> None:
    with pytest.raises(ValueError, match="cannot be used here"):
        sch.path_parse('labels[="a"]')


def test_notifications_shape_paths_with_the_cached_schema_as_kl_drift_does() -> None:
    from kilolock.notify import payload

    provider = 'provider["registry.terraform.io/kilolock/testfw"]'
    row = {"mode": "managed", "type": "x_thing", "provider": provider, "sensitive_attributes": []}
    rows = {"1": {**row, "attributes": _whole({"single": {"a": "s", "n": 3, "token": None}, "labels": ["a"]})},
            "2": {**row, "attributes": _whole({"single": {"a": "s", "n": 4, "token": None}, "labels": ["a", "b"]})}}
    detail = {"addresses": [{"address": "x_thing.t", "deposed": "", "kind": "changed", "baseline": "1", "current": "2"}]}
    schemas = {("registry.terraform.io/kilolock/testfw", "managed", "x_thing"): [{"version": 0, "block": sch.block_to_json(SCHEMA)}]}
    [shaped] = payload.addresses(detail, rows, schemas)
    assert [c["path"] for c in shaped["changes"]] == ['labels[="b"]', "single.n"]
    [guessed] = payload.addresses(detail, rows)  # no schema cached: keys guessed, lists by position
    assert [c["path"] for c in guessed["changes"]] == ["labels", 'single["n"]']


# (path as a person writes it, jsonb steps into the stored attributes) under SCHEMA
STORED_STEPS = [
    ("id", ["id"]),
    ('tags["env"]', ["tags", "env"]),
    ("obj.v", ["obj", "v"]),
    ("dyn", ["dyn", "value"]),
    ("dyn.metadata.name", ["dyn", "value", "metadata", "name"]),
    ("dyn[0]", ["dyn", "value", "0"]),
    ('dyn_map["k"]', ["dyn_map", "k", "value"]),
    ('dyn_map["k"].x', ["dyn_map", "k", "value", "x"]),
    ("single.a", ["single", "a"]),
    ("list_nested[1].n", ["list_nested", "1", "n"]),
    ('map_nested["m"].a', ["map_nested", "m", "a"]),
    ('deep.inner["i"].n', ["deep", "inner", "i", "n"]),
    ("b_single.a", ["b_single", "a"]),
    ("b_list[0].n", ["b_list", "0", "n"]),
    ('b_map["m"].a', ["b_map", "m", "a"]),
    # A list of blocks holding a dynamic attribute is stored wrapped, and so is the attribute in it.
    ("b_dyn_list[0].d", ["b_dyn_list", "value", "0", "d", "value"]),
    ("b_dyn_list[0].d.x", ["b_dyn_list", "value", "0", "d", "value", "x"]),
    ("unknown.x", ["unknown", "x"]),
    ("id.x", ["id", "x"]),
]


@pytest.mark.parametrize(("path", "steps"), STORED_STEPS, ids=[r[0] for r in STORED_STEPS])
def test_a_schema_path_finds_its_value_through_dynamic_wrappers(path: str, steps: list[str]) -> None:
    assert drift.stored_steps(SCHEMA, sch.path_parse(path)) == steps


def test_stored_steps_reach_the_values_the_drift_rows_store() -> None:
    """The stored documents of the rows above: the steps land on the value the path names."""
    doc = {"dyn": wrap({"metadata": {"name": "web"}}, ["object", {"metadata": ["object", {"name": "string"}]}]),
           "dyn_map": {"k": wrap({"x": 1}, ["object", {"x": "number"}])},
           "b_dyn_list": wrap([{"d": wrap({"x": 2}, ["object", {"x": "number"}])}], ["tuple", [["object", {"d": "dynamic"}]]])}
    for path, want in [("dyn.metadata.name", "web"), ('dyn_map["k"].x', 1), ("b_dyn_list[0].d.x", 2)]:
        value: Any = doc
        for step in drift.stored_steps(SCHEMA, sch.path_parse(path)):
            value = value[int(step)] if isinstance(value, list) else value[step]
        assert value == want, path


def _drift_row(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """A drift record row (store.drift.list_drift) whose objects carry no marks: Terraform < 1.8 and
    OpenTofu < 1.8 write none for a schema-sensitive attribute, and state-only commands keep that."""
    from datetime import datetime, timedelta, timezone

    at = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return {"address": "x_thing.t", "deposed": "", "drift_kind": "changed", "type": "x_thing", "mode": "managed",
            "provider": 'provider["registry.terraform.io/kilolock/testfw"]', "status": "open",
            "previous_attributes": before, "current_attributes": after,
            "previous_sensitive_attributes": [], "current_sensitive_attributes": [],
            "detected_serial": 2, "detected_at": at, "first_detected_serial": 2, "first_detected_at": at,
            "last_confirmed_serial": 2, "open_for": timedelta(0), "resolved_serial": None, "resolved_at": None,
            "resolved_how": None, "refresh_run_id": None, "changed_attributes": ["secrets", "single"]}


SCHEMAS = {("registry.terraform.io/kilolock/testfw", "managed", "x_thing"): [{"version": 0, "block": sch.block_to_json(SCHEMA)}]}
UNMARKED_BEFORE = _whole({"single": {"a": "s", "n": 3, "token": "tok-before-1"}, "secrets": ["set-secret-1"]})
UNMARKED_AFTER = _whole({"single": {"a": "s", "n": 3, "token": "tok-after-2"}, "secrets": ["set-secret-2"]})


def test_kl_drift_masks_what_the_cached_schema_calls_sensitive_where_no_mark_says_so() -> None:
    entry = drift.entry(_drift_row(UNMARKED_BEFORE, UNMARKED_AFTER), SCHEMAS)
    assert entry["changes"] == [{"path": "secrets", "before": "(sensitive)", "after": "(sensitive)"},
                                {"path": "single.token", "before": "(sensitive)", "after": "(sensitive)"}]


def test_notifications_mask_what_the_cached_schema_calls_sensitive_where_no_mark_says_so() -> None:
    from kilolock.notify import payload

    row = {"mode": "managed", "type": "x_thing", "provider": 'provider["registry.terraform.io/kilolock/testfw"]',
           "sensitive_attributes": []}
    rows = {"1": {**row, "attributes": UNMARKED_BEFORE}, "2": {**row, "attributes": UNMARKED_AFTER}}
    detail = {"addresses": [{"address": "x_thing.t", "deposed": "", "kind": "changed", "baseline": "1", "current": "2"}]}
    [found] = payload.addresses(detail, rows, SCHEMAS)
    assert found["changes"] == [{"path": "secrets", "before": "(sensitive)", "after": "(sensitive)"},
                                {"path": "single.token", "before": "(sensitive)", "after": "(sensitive)"}]
