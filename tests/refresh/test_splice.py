"""Splicing reads back into the document: an unchanged object is shared, not copied, and the new
state's index follows the objects to their new positions without parsing the document again."""
from __future__ import annotations

import json

from kilolock import tfstate
from kilolock.refresh.splice import InstanceUpdate, build_refreshed_state

NULL = 'provider["registry.terraform.io/hashicorp/null"]'


def _state() -> tfstate.State:
    def inst(n):
        return {"index_key": n, "schema_version": 0, "attributes": {"id": str(n)}, "sensitive_attributes": []}
    doc = {"version": 4, "serial": 3, "lineage": "l", "resources": [
        {"mode": "managed", "type": "null_resource", "name": "a", "provider": NULL, "instances": [inst(0), inst(1), inst(2)]},
        {"mode": "managed", "type": "null_resource", "name": "gone", "provider": NULL, "instances": [inst(0)]},
        {"mode": "managed", "type": "null_resource", "name": "b", "provider": NULL, "instances": [inst(0)]},
    ]}
    return tfstate.parse_state(json.dumps(doc))


def _same() -> InstanceUpdate:
    return InstanceUpdate(removed=False, changed=False)


def test_unchanged_objects_are_shared_and_untouched():
    state = _state()
    updates = {(i.resource_index, i.instance_index): _same() for i in state.instances}
    new, touched, _ = build_refreshed_state(state, updates, serial=4)
    assert touched == set() and new.serial == 4
    assert all(a.obj is b.obj for a, b in zip(state.instances, new.instances, strict=True))
    assert all(a is b for a, b in zip(state.instances, new.instances, strict=True))  # same place, same index entry


def test_removals_move_the_index_with_the_objects():
    state = _state()
    updates = {(i.resource_index, i.instance_index): _same() for i in state.instances}
    updates[(0, 1)] = updates[(1, 0)] = InstanceUpdate(removed=True, changed=True)
    updates[(2, 0)] = InstanceUpdate(removed=False, changed=True, attributes=b'{"id":"new"}')
    new, touched, _ = build_refreshed_state(state, updates, serial=4)
    assert touched == {(0, 1), (1, 0), (2, 0)}
    again = tfstate.parse_state(json.dumps(new.raw))  # what a full parse of the new document indexes
    assert [(i.address, i.resource_index, i.instance_index) for i in new.instances] == \
        [(i.address, i.resource_index, i.instance_index) for i in again.instances]
    assert [i.obj for i in new.instances] == [i.obj for i in again.instances]
    assert new.raw["resources"][1]["instances"][0]["attributes"] == {"id": "new"}
    assert state.raw["resources"][2]["instances"][0]["attributes"] == {"id": "0"}  # the prior document is never modified


def test_in_place_updates_the_objects_it_changes_and_agrees_with_a_copy():
    state, fresh = _state(), _state()
    def updates_of(st):
        ups = {(i.resource_index, i.instance_index): InstanceUpdate(removed=False, changed=False, private=b"p")
               for i in st.instances}
        ups[(1, 0)] = InstanceUpdate(removed=True, changed=True)
        ups[(0, 2)] = InstanceUpdate(removed=False, changed=True, attributes=b'{"id":"x"}', private=b"p")
        return ups
    copied, touched_copy, _ = build_refreshed_state(fresh, updates_of(fresh), serial=4)
    objs = [i.obj for i in state.instances]
    moved, touched, _ = build_refreshed_state(state, updates_of(state), serial=4, in_place=True)
    assert moved.raw == copied.raw and touched == touched_copy == {(1, 0), (0, 2)}
    assert moved.instances[0].obj is objs[0] and objs[0]["private"] == "cA=="  # updated where it was
    assert [(i.address, i.resource_index, i.instance_index) for i in moved.instances] == \
        [(i.address, i.resource_index, i.instance_index) for i in copied.instances]


def test_an_identity_goes_in_with_the_identity_version_it_is_under():
    state = _state()
    updates = {(i.resource_index, i.instance_index): _same() for i in state.instances}
    updates[(0, 0)] = InstanceUpdate(removed=False, changed=False, identity=b'{"id":"0"}', identity_schema_version=2)
    new, touched, _ = build_refreshed_state(state, updates, serial=4)
    obj = new.raw["resources"][0]["instances"][0]
    assert (obj["identity"], obj["identity_schema_version"]) == ({"id": "0"}, 2)
    assert touched == {(0, 0)}  # identity is part of the lifecycle's content
    assert "identity_schema_version" not in new.raw["resources"][0]["instances"][1]  # none without an identity


def _with_identity(identity_json: str) -> tfstate.State:
    doc = json.loads(json.dumps(_state().raw))
    doc["resources"][0]["instances"][0].update(identity_schema_version=1, identity=json.loads(identity_json))
    return tfstate.parse_state(json.dumps(doc))


def test_an_identity_returned_as_stored_leaves_the_object_as_it_was():
    # Providers on protocol 5.9/6.9 return the identity with every read: one that is written as
    # the stored one is keeps the object shared, so a refresh that changes nothing stays the same
    # resources (the no-document commit).
    state = _with_identity('{"id":"0","n":1.5}')
    read = InstanceUpdate(removed=False, changed=False, identity=b'{"id":"0","n":1.5}', identity_schema_version=1)
    spliced = build_refreshed_state(state, {**_all_same(state), (0, 0): read}, serial=4)
    assert spliced.same_resources and spliced.touched == set()
    assert spliced.state.instances[0].obj is state.instances[0].obj


def test_an_identity_that_differs_in_value_or_in_its_text_goes_in():
    # Equal in Python is not equal in JSON: 1 == 1.0 == True, and the document keeps what the
    # provider wrote.
    cases = {"value": (b'{"id":"9","n":1}', {"id": "9", "n": 1}),
             "number's text": (b'{"id":"0","n":1.0}', {"id": "0", "n": 1.0}),
             "true for 1": (b'{"id":"0","n":true}', {"id": "0", "n": True})}
    for what, (returned, written) in cases.items():
        state = _with_identity('{"id":"0","n":1}')
        read = InstanceUpdate(removed=False, changed=False, identity=returned, identity_schema_version=1)
        spliced = build_refreshed_state(state, {**_all_same(state), (0, 0): read}, serial=4)
        assert not spliced.same_resources and spliced.touched == {(0, 0)}, what  # the lifecycle row too
        ident = spliced.state.raw["resources"][0]["instances"][0]["identity"]
        assert tfstate.dumps_compact(ident) == tfstate.dumps_compact(written), what
    state = _with_identity('{"id":"0"}')  # the same identity under a new identity version
    read = InstanceUpdate(removed=False, changed=False, identity=b'{"id":"0"}', identity_schema_version=2)
    spliced = build_refreshed_state(state, {**_all_same(state), (0, 0): read}, serial=4)
    assert not spliced.same_resources
    assert spliced.state.raw["resources"][0]["instances"][0]["identity_schema_version"] == 2


def _all_same(state: tfstate.State) -> dict[tuple[int, int], InstanceUpdate]:
    return {(i.resource_index, i.instance_index): _same() for i in state.instances}


def test_same_resources_only_when_no_object_differs_in_any_field():
    # What lets an observation store no document and --commit write no version: private data is
    # no indexed field, but it is in the document.
    state = _state()
    assert build_refreshed_state(state, _all_same(state), serial=4).same_resources
    cases = {
        "private": InstanceUpdate(removed=False, changed=False, private=b"p"),
        "removed": InstanceUpdate(removed=True, changed=True),
        "attributes": InstanceUpdate(removed=False, changed=True, attributes=b'{"id":"x"}'),
        "schema version": InstanceUpdate(removed=False, changed=False, schema_version=1),
    }
    for what, update in cases.items():
        state = _state()
        spliced = build_refreshed_state(state, {**_all_same(state), (0, 1): update}, serial=4, in_place=True)
        assert not spliced.same_resources, what
        assert spliced.touched <= {(0, 1)}, what  # private data touches no lifecycle, yet differs


def test_a_dropped_empty_resource_is_not_the_same_resources():
    # A managed resource without instances is dropped, as Terraform does: no object differs, the
    # document does.
    doc = json.loads(json.dumps(_state().raw))
    doc["resources"].append({"mode": "managed", "type": "null_resource", "name": "empty", "provider": NULL, "instances": []})
    state = tfstate.parse_state(json.dumps(doc))
    spliced = build_refreshed_state(state, _all_same(state), serial=4)
    assert not spliced.same_resources and len(spliced.state.raw["resources"]) == 3
