"""kl state diff on hand-made states: added/removed/changed instances, Terraform's path form,
masked secrets, deposed objects, status, marks-only versions, and every refusal in one line."""
from __future__ import annotations

import copy
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from typing import Any

import psycopg
import pytest

from kilolock import tfstate
from kilolock.cli import main
from kilolock.store import writes

NULL = 'provider["registry.terraform.io/hashicorp/null"]'
PW = [[{"type": "get_attr", "value": "pw"}]]
RULE_SECRET = [[{"type": "get_attr", "value": "rule"}, {"type": "index", "value": {"value": 1, "type": "number"}},
                {"type": "get_attr", "value": "secret"}]]


def _kl(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def _doc(serial: int, objects: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """{resource name: [instance objects]}: null_resources, objects as Terraform writes them."""
    return {"version": 4, "terraform_version": "1.0.3", "serial": serial, "lineage": "l", "outputs": {},
            "resources": [{"mode": "managed", "type": "null_resource", "name": n, "provider": NULL, "instances": objs}
                          for n, objs in objects.items()]}


def _obj(attributes: dict[str, Any], marks: list[Any] | None = None, **extra: Any) -> dict[str, Any]:
    return {"schema_version": 0, "attributes": attributes, "sensitive_attributes": marks or [], **extra}


def _write(db_url: str, name: str, doc: dict[str, Any] | bytes) -> None:
    raw = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
    with psycopg.connect(db_url, autocommit=True) as c:
        if b"encrypted_data" in raw:
            writes.store_envelope(c, name, raw, None, source="apply", actor="test")
        else:
            writes.store_document(c, name, tfstate.parse_state(raw), raw, source="apply", actor="test")


def _json(*argv: str) -> dict[str, Any]:
    code, out, err = _kl("state", "diff", *argv, "--format", "json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    return doc


A1 = {"id": "a", "tags": {"env": "old", "team": "x"}, "pw": "hunter2",
      "rule": [{"cidr": "10.0.0.0/8", "secret": "s0"}, {"cidr": "10.1.0.0/16", "secret": "s1"}]}
A2 = {"id": "a", "tags": {"env": "new", "team": "x"}, "pw": "hunter3",
      "rule": [{"cidr": "10.0.0.0/8", "secret": "s0"}, {"cidr": "10.2.0.0/16", "secret": "s2"}]}


def _cache_null_schema(db_url: str, *sensitive: str) -> None:
    """A cached schema of the null provider (as a refresh leaves one): what tells kl which values are
    secret. Without one every value is masked."""
    from kilolock import schema as sch
    from kilolock.store import provider_schemas

    types = {"id": b'"string"', "token": b'"string"', "pw": b'"string"', "tags": b'["map","string"]',
             "rule": b'["list",["object",{"cidr":"string","secret":"string"}]]'}
    block = sch.Block(attributes=tuple(sch.Attribute(n, t, optional=True, sensitive=n in sensitive) for n, t in types.items()))
    with psycopg.connect(db_url, autocommit=True) as c:
        provider_schemas.put(c, "registry.terraform.io/hashicorp/null", "3.2.1",
                             sch.ProviderSchema(5, sch.Schema(0, sch.Block()), {"null_resource": sch.Schema(0, block)}))


@pytest.fixture
def history(db_url):
    """prod: v1 (a, b, c) → v2 (a changed, b gone, d new, c unchanged) → v3 (marks only on c) → v7
    (c replaced create-before-destroy style: its old object deposed, a new current one)."""
    v1 = _doc(1, {"a": [_obj(A1, PW + RULE_SECRET)], "b": [_obj({"id": "b"})], "c": [_obj({"id": "c"})]})
    v2 = _doc(2, {"a": [_obj(A2, PW + RULE_SECRET)], "c": [_obj({"id": "c"})], "d": [_obj({"id": "d"})]})
    v3 = copy.deepcopy(v2)
    v3["serial"] = 3
    v3["resources"][1]["instances"][0]["sensitive_attributes"] = [[{"type": "get_attr", "value": "id"}]]
    v7 = copy.deepcopy(v3)
    v7["serial"] = 7
    v7["resources"][1]["instances"] = [_obj({"id": "c2"}, status="tainted"), dict(_obj({"id": "c"}), deposed="0badcafe")]
    for doc in (v1, v2, v3, v7):
        _write(db_url, "prod", doc)
    _cache_null_schema(db_url)
    return db_url


def test_previous_to_current_by_default_and_paths_in_terraforms_form(history):
    doc = _json("prod", "1", "2")
    assert (doc["version"], doc["state"], doc["from"], doc["to"]) == (1, "prod", 1, 2)
    assert (doc["added"], doc["removed"], doc["changed"]) == (1, 1, 1)
    by = {i["address"]: i for i in doc["instances"]}
    assert [i["address"] for i in doc["instances"]] == ["null_resource.a", "null_resource.b", "null_resource.d"]
    assert (by["null_resource.b"]["action"], by["null_resource.d"]["action"]) == ("removed", "added")
    assert by["null_resource.b"]["changes"] == by["null_resource.d"]["changes"] == []
    a = by["null_resource.a"]
    assert (a["action"], a["mode"], a["type"], a["deposed"], a["status"]) == ("changed", "managed", "null_resource", None, None)
    assert a["changes"] == [
        {"path": "pw", "before": "(sensitive)", "after": "(sensitive)"},
        {"path": "rule[1].cidr", "before": "10.1.0.0/16", "after": "10.2.0.0/16"},
        {"path": "rule[1].secret", "before": "(sensitive)", "after": "(sensitive)"},  # marked inside a block: masked
        {"path": 'tags["env"]', "before": "old", "after": "new"},
    ]
    code, out, _ = _kl("state", "diff", "prod", "1", "2")
    assert code == 0
    assert out.splitlines()[0] == "prod: v1 → v2: 1 added, 1 removed, 1 changed"
    assert '~ null_resource.a\n    pw: (sensitive) → (sensitive)\n    rule[1].cidr: "10.1.0.0/16" → "10.2.0.0/16"\n' in out, out
    assert "- null_resource.b\n" in out and "+ null_resource.d\n" in out
    assert "hunter" not in out and "s1" not in out and "s2" not in out


def test_marks_only_version_is_no_change_and_defaults_compare_the_last_two(history):
    assert _json("prod", "2", "3")["instances"] == []  # a sensitivity mark is metadata, not a change
    assert _kl("state", "diff", "prod", "2", "3")[1] == "prod: v2 → v3: 0 added, 0 removed, 0 changed\n"
    doc = _json("prod")  # previous (3) → current (7); serials need not be consecutive
    assert (doc["from"], doc["to"]) == (3, 7)
    assert [(i["address"], i["deposed"], i["action"]) for i in doc["instances"]] == [
        ("null_resource.c", None, "changed"), ("null_resource.c", "0badcafe", "added")]
    c = doc["instances"][0]
    assert c["status"] == {"before": None, "after": "tainted"}
    assert c["changes"] == [{"path": "id", "before": "(sensitive)", "after": "(sensitive)"}]  # v3 marked id
    assert _json("prod", "3")["to"] == 7  # FROM only: to the current version
    out = _kl("state", "diff", "prod")[1]
    assert "~ null_resource.c\n    status: ready → tainted\n    id: (sensitive) → (sensitive)\n+ null_resource.c (deposed 0badcafe)\n" in out, out


def test_any_two_versions_either_way(history):
    doc = _json("prod", "7", "1")
    assert {(i["address"], i["deposed"]): i["action"] for i in doc["instances"]} == {
        ("null_resource.a", None): "changed", ("null_resource.b", None): "added", ("null_resource.c", None): "changed",
        ("null_resource.c", "0badcafe"): "removed", ("null_resource.d", None): "removed"}
    assert _kl("state", "diff", "prod", "2", "2")[1] == "prod: v2 against itself; nothing to compare\n"


def test_markdown(history):
    code, out, _ = _kl("state", "diff", "prod", "1", "2", "--format", "markdown")
    assert code == 0
    assert out.startswith("### Changes in `prod` from v1 to v2: 1 added, 1 removed, 1 changed\n"), out
    assert "**`null_resource.a`**: changed\n\n| attribute | before | after |" in out
    assert '| `tags["env"]` | `"old"` | `"new"` |' in out and "**`null_resource.b`**: removed" in out


def test_refusals_are_one_line(history, db_url):
    code, _, err = _kl("state", "diff", "prod", "4", "7")
    assert (code, err) == (1, "kl: state 'prod' has no version with serial 4 (see `kl state versions prod`)\n")
    code, _, err = _kl("state", "diff", "nope")
    assert code == 1 and err.startswith("kl: no state named 'nope'"), err
    _write(db_url, "solo", _doc(1, {"a": [_obj({"id": "a"})]}))
    assert _kl("state", "diff", "solo") == (0, "solo: one version only (v1); nothing to compare\n", "")
    assert _json("solo") == {"version": 1, "state": "solo", "from": None, "to": 1, "from_version": None, "to_version": "v1",
                             "added": 0, "removed": 0,
                             "changed": 0, "masked_providers": [], "instances": []}
    _write(db_url, "tofu", _doc(1, {"a": [_obj({"id": "a"})]}))
    _write(db_url, "tofu", json.dumps({"meta": {}, "encrypted_data": "QUJD", "encryption_version": "v0"}).encode())
    code, _, err = _kl("state", "diff", "tofu")
    assert code == 1 and err == ("kl: state 'tofu' version 2 is OpenTofu-encrypted and not indexed, so kl "
                                 "cannot diff it: `kl state set tofu --encryption-config FILE` indexes the "
                                 "versions written after it\n"), err


def test_masking_does_not_depend_on_guessing_attribute_from_map_key():
    from kilolock.drift import changes

    # An object attribute below the top level prints as a key (the walk cannot tell without the
    # schema), while Terraform's mark says get_attr: the secret stays masked all the same.
    marks = [[{"type": "get_attr", "value": "conn"}, {"type": "get_attr", "value": "password"}]]
    found = changes({"conn": {"password": "a", "host": "h1"}}, {"conn": {"password": "b", "host": "h2"}}, marks, marks)
    assert [(c.path, c.before, c.after) for c in found] == [
        ('conn["host"]', "h1", "h2"), ('conn["password"]', "(sensitive)", "(sensitive)")]


def test_schema_sensitive_values_are_masked_before_any_refresh_marked_them(db_url):
    """Terraform 1.0.3 writes no marks for schema-sensitive attributes; kl knows them from any
    cached schema of the provider (a refresh caches it), so a diff never shows them."""
    _cache_null_schema(db_url, "token")
    _write(db_url, "s", _doc(1, {"a": [_obj({"id": "a", "token": "t0p"})]}))
    _write(db_url, "s", _doc(2, {"a": [_obj({"id": "a2", "token": "s3cret"})]}))
    code, out, _ = _kl("state", "diff", "s")
    assert code == 0 and "token: (sensitive) → (sensitive)" in out and "s3cret" not in out and "t0p" not in out, out
    assert 'id: "a" → "a2"' in out


def test_with_no_schema_of_the_provider_every_value_is_masked_and_the_output_says_why(db_url):
    """Before any refresh kl has no schema to tell a secret Terraform did not mark from any other
    value: it masks them all, names the provider once and says how to get the schema."""
    _write(db_url, "s", _doc(1, {"a": [_obj({"id": "a", "token": "t0p"})], "b": [_obj({"id": "b"})]}))
    _write(db_url, "s", _doc(2, {"a": [_obj({"id": "a2", "token": "s3cret"})], "b": [_obj({"id": "b2", "token": None})]}))
    doc = _json("s")
    assert doc["masked_providers"] == ["registry.terraform.io/hashicorp/null"]
    assert [(i["address"], i["changes"]) for i in doc["instances"]] == [
        ("null_resource.a", [{"path": "id", "before": "(sensitive)", "after": "(sensitive)"},
                             {"path": "token", "before": "(sensitive)", "after": "(sensitive)"}]),
        ("null_resource.b", [{"path": "id", "before": "(sensitive)", "after": "(sensitive)"}])]
    note = ("values of registry.terraform.io/hashicorp/null resources are all shown as (sensitive): kl has no schema "
            "of that provider to tell secrets apart; `kl refresh s` (or --dry-run) caches it")
    code, out, _ = _kl("state", "diff", "s")
    assert code == 0 and out.splitlines()[:2] == ["s: v1 → v2: 0 added, 0 removed, 2 changed", f"note: {note}"], out
    assert out.count("note:") == 1 and "s3cret" not in out and "t0p" not in out
    code, out, _ = _kl("state", "diff", "s", "--format", "markdown")
    assert code == 0 and f"_Note: {note}._" in out and "s3cret" not in out, out
    _cache_null_schema(db_url, "token")  # what a refresh does: now only the secret is masked
    code, out, _ = _kl("state", "diff", "s")
    assert "note:" not in out and 'id: "a" → "a2"' in out and "token: (sensitive) → (sensitive)" in out, out


def test_a_lifecycle_reopened_for_marks_alone_is_no_change(db_url):
    """Before migration 0007 new marks reopened a lifecycle: such a pair of rows is no change."""
    _write(db_url, "old", _doc(1, {"a": [_obj({"id": "a"})], "b": [_obj({"id": "b"})]}))
    _write(db_url, "old", _doc(2, {"a": [_obj({"id": "a"})], "b": [_obj({"id": "b2"})]}))
    with psycopg.connect(db_url, autocommit=True) as c:  # what the old index wrote for a's marks at v2
        c.execute("""
            WITH v2 AS (SELECT v.id FROM state_versions v JOIN states s ON s.id = v.state_id WHERE s.name = 'old' AND v.serial = 2),
                 closed AS (UPDATE resources SET delete_serial = 2, closed_by_version_id = (SELECT id FROM v2)
                            WHERE address = 'null_resource.a' RETURNING *)
            INSERT INTO resources (state_id, address, deposed, mode, type, name, module, index_key, provider, schema_version,
                                   status, attributes, sensitive_attributes, content_hash, create_serial, opened_by_version_id)
            SELECT state_id, address, deposed, mode, type, name, module, index_key, provider, schema_version, status,
                   attributes, '[[{"type": "get_attr", "value": "id"}]]', content_hash || 'x', 2, (SELECT id FROM v2) FROM closed""")
    assert [(i["address"], i["action"]) for i in _json("old")["instances"]] == [("null_resource.b", "changed")]
