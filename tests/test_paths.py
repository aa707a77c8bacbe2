"""Attribute paths are written and read in one form, Terraform's: tags["env"], rule[0].cidr."""
from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kilolock import drift
from kilolock import schema as sch


def test_display_has_no_leading_dot():
    assert sch.path_display((sch.GetAttr("tags"), sch.Index("env"))) == 'tags["env"]'
    assert sch.path_display((sch.GetAttr("rule"), sch.Index(0), sch.GetAttr("cidr"))) == "rule[0].cidr"
    assert [c.path for c in drift.changes({"tags": {"env": "a"}, "n": 1}, {"tags": {"env": "b"}, "n": 2})] == ['n', 'tags["env"]']


names = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
steps = st.one_of(names.map(sch.GetAttr), st.integers(0, 10**6).map(sch.Index), st.text(max_size=8).map(sch.Index))


@given(names, st.lists(steps, max_size=6))
def test_what_is_displayed_parses_back(first, rest):
    path = (sch.GetAttr(first), *rest)
    assert sch.path_parse(sch.path_display(path)) == path


@pytest.mark.parametrize(("text", "where"), [(".a", "position 1"), ("a..b", "position 3"), ("a[", "position 2"),
                                              ('a["x]', "position 2"), ("a b", "position 2"), ("", "empty")])
def test_a_bad_path_names_where(text, where):
    with pytest.raises(ValueError, match=where):
        sch.path_parse(text)


def test_display_keeps_utf8_in_keys_and_escapes_only_what_json_must():
    # As Terraform prints a key, and as kl prints values (drift's json.dumps(ensure_ascii=False)).
    assert sch.path_display((sch.GetAttr("tags"), sch.Index('café "x"\n'))) == 'tags["café \\"x\\"\\n"]'
    assert sch.path_display((sch.Index(0), sch.GetAttr("cidr"))) == "[0].cidr"
    assert sch.path_display(()) == ""


json_values = st.recursive(st.none() | st.booleans() | st.integers(-10**9, 10**9) | st.text(max_size=6),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
                           max_leaves=8)


@given(names, st.lists(steps, max_size=3), json_values)
def test_a_set_element_displayed_parses_back(first, rest, element):
    # A drift path may end on a set element, [=JSON] (an index or a key could not tell it apart).
    path = (sch.GetAttr(first), *rest, sch.Element(element))
    text = sch.path_display(path)
    assert text.endswith("[=" + sch.element_json(element) + "]")
    assert sch.drift_path_parse(text) == path
