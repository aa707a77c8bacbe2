"""Bad state input, fuzzed: whatever the bytes, parsing gives a State or one StateError line,
never another exception (which the CLI would turn into an internal error)."""
from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kilolock import tfstate

json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5), max_leaves=25)

KEYS = ["version", "serial", "lineage", "terraform_version", "outputs", "resources", "mode", "type", "name", "provider",
        "instances", "module", "index_key", "attributes", "attributes_flat", "schema_version", "deposed", "status",
        "sensitive_attributes", "encryption_version", "encrypted_data", "value"]


@st.composite
def state_like(draw):
    """Mostly-valid states with random damage: the shapes a parser is most likely to get wrong."""
    inst = {"schema_version": draw(st.sampled_from([0, 1, -1, "0", None])),
            "attributes": draw(st.sampled_from([{}, {"id": "x"}, [], None, "s"]))}
    if draw(st.booleans()):
        inst["index_key"] = draw(st.sampled_from([0, 7, "k", True, None, 1.5, [1], {"a": 1}]))
    res = {"mode": draw(st.sampled_from(["managed", "data", "weird", 1])), "type": draw(st.sampled_from(["t", "", 3])),
           "name": draw(st.sampled_from(["n", "", None])),
           "provider": draw(st.sampled_from(['provider["a/b/c"]', 'provider["a/b/c"].x', "bad", 'module.m.provider["h/n/t"]', 5])),
           "instances": draw(st.sampled_from([[inst], [inst, inst], [], {}, None]))}
    doc = {"version": draw(st.sampled_from([4, 3, "4", None])), "serial": draw(st.sampled_from([0, 1, -3, "1", 2.5])),
           "lineage": draw(st.sampled_from(["l", "", 9])), "resources": draw(st.sampled_from([[res], [res, res], {}, None]))}
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(KEYS))
        target = draw(st.sampled_from([doc, res, inst]))
        if draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = draw(json_values)
    return doc


def _check(data: bytes) -> None:
    try:
        tfstate.parse_state(data)
    except tfstate.StateError as exc:
        assert "\n" not in str(exc) and str(exc)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes(data):
    _check(data)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_random_json(value):
    _check(json.dumps(value).encode())


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state_like())
def test_damaged_states(doc):
    _check(json.dumps(doc).encode())


def _index_fields(state: tfstate.State) -> tuple[object, ...]:
    return (json.dumps(state.raw), [(i.address, i.deposed, i.module, i.mode, i.type, i.name, i.index_key, i.provider,
                                     i.resource_index, i.instance_index, i.obj) for i in state.instances])


def _check_streamed(text: str) -> None:
    """The import's streamed index (tfstate.index_state_text) is parse_state's index or None (the
    whole parse then gives the answer, error included); it never raises."""
    streamed = tfstate.index_state_text(text)
    try:
        whole = tfstate.parse_state(text, keep_objects=False)
    except tfstate.StateError:
        assert streamed is None
        return
    if streamed is not None:
        assert _index_fields(streamed) == _index_fields(whole)


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(state_like(), st.sampled_from([None, 0, 2]), st.booleans())
def test_damaged_states_index_as_parsed_whole(doc, indent, instances_first):
    if instances_first and isinstance(doc.get("resources"), list):  # a layout the stream hands back
        doc["resources"] = [{"instances": r.pop("instances"), **r} if isinstance(r, dict) and "instances" in r else r
                            for r in doc["resources"]]
    _check_streamed(json.dumps(doc, indent=indent))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_random_bytes_index_as_parsed_whole(data):
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return
    _check_streamed(text)
