"""The big-state paths: `kl state pull` streamed a piece at a time gives the very bytes the whole
document gave; the write path sends the version's bytes as they are; an import keeps an index,
not the parsed document."""
from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from kilolock import tfstate
from kilolock.store import versions, writes

STATES = Path(__file__).resolve().parents[1] / "fixtures" / "states"
NULL = 'provider["registry.terraform.io/hashicorp/null"]'


def _inst(key, **extra):
    return {"index_key": key, "schema_version": 0, "attributes": {"id": f"i{key}", "n": 1.50, "big": 12345678901234567890,
                                                                  "html": "<&>", "nested": {"b": [1, {"z": 1, "a": 2}]}},
            "sensitive_attributes": [[{"type": "get_attr", "value": "id"}]], "private": "bnVsbA==", **extra}


SHAPES = {
    "no resources key": {"version": 4, "serial": 1, "lineage": "l", "outputs": {}},
    "no resources": {"version": 4, "serial": 1, "lineage": "l", "outputs": {}, "resources": []},
    "odd keys everywhere": {
        "zz_top": 1, "version": 4, "serial": 1, "lineage": "l", "terraform_version": "1.8.5",
        "outputs": {"o": {"type": "string", "value": "v", "sensitive": True}},
        "check_results": [{"status": "pass", "object_kind": "resource", "config_addr": "x", "objects": None}],
        "resources": [
            {"zz": "extra", "mode": "managed", "type": "null_resource", "name": "empty", "provider": NULL, "instances": []},
            {"module": "module.m", "mode": "managed", "type": "null_resource", "name": "many", "provider": NULL, "each": "list",
             "instances": [_inst(n) for n in range(5)] + [_inst(5, deposed="00000001", status="tainted")]},
            {"mode": "data", "type": "null_data_source", "name": "d", "provider": NULL,
             "instances": [{"schema_version": 0, "attributes": {"x": None}}]},
            {"mode": "managed", "type": "null_resource", "name": "one", "provider": NULL, "instances": [_inst("k\u2028é")]},
        ],
    },
}


def _pulled(conn, name, serial=None) -> str:
    out = io.StringIO()
    versions.write_pulled(conn, name, serial, out.write)
    return out.getvalue()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_streamed_pull_is_byte_identical_to_the_whole_document_layout(conn, shape):
    raw = json.dumps(SHAPES[shape]).encode()
    writes.store_document(conn, "s", tfstate.parse_state(raw), raw, source="import", actor="t")
    assert _pulled(conn, "s") == tfstate.pretty_state(versions.raw_state_text(conn, "s"))
    # What a refresh loads, a piece at a time: the text's parse, its keys in the same order.
    loaded = versions.load_document(conn, "s", 1, tfstate.loads_exact)
    assert tfstate.dumps_compact(loaded) == tfstate.dumps_compact(tfstate.loads_exact(versions.raw_state_text(conn, "s")))


@pytest.mark.parametrize("fixture", ["varied.tfstate", "big2000-v1.tfstate"])
def test_streamed_pull_gives_back_terraforms_bytes(conn, fixture):
    raw = (STATES / fixture).read_bytes()
    writes.store_document(conn, "s", tfstate.parse_state(raw), raw, source="import", actor="t")
    assert _pulled(conn, "s") == raw.decode()


def test_encrypted_envelope_is_pulled_whole_as_before(conn):
    raw = json.dumps({"meta": {"k": "e30="}, "encrypted_data": "AAAA", "encryption_version": "v0"}).encode()
    writes.store_envelope(conn, "s", raw, None, source="apply", actor="t")
    assert _pulled(conn, "s") == tfstate.pretty_state(versions.raw_state_text(conn, "s"))
    assert versions.load_document(conn, "s", 1, json.loads) == json.loads(versions.raw_state_text(conn, "s"))


def test_write_sends_the_bytes_as_they_are_and_refuses_what_jsonb_cannot_hold(conn, make_state):
    raw = make_state(1, {"a": {"id": "é<&>"}})
    writes.store_document(conn, "s", tfstate.parse_state(raw), raw, source="import", actor="t")
    assert json.loads(versions.raw_state_text(conn, "s")) == json.loads(raw)
    with pytest.raises(tfstate.StateError, match="not UTF-8 text"):
        writes.store_envelope(conn, "t", b'{"a": "\xff"}', None, source="apply", actor="t")
    # A raw NUL byte would cut a text parameter short: refused, as psycopg refuses one in a str.
    with pytest.raises(tfstate.StateError, match="cannot contain NUL"):
        writes.store_envelope(conn, "u", b'{"a": 1}\x00{"b": 2}', None, source="apply", actor="t")
    assert conn.execute("SELECT count(*) FROM state_versions").fetchone()[0] == 1


def test_an_import_index_holds_the_instances_but_not_the_document():
    raw = json.dumps(SHAPES["odd keys everywhere"]).encode()
    full, index = tfstate.parse_state(raw), tfstate.parse_state(raw, keep_objects=False)
    fields = [(i.address, i.deposed, i.module, i.mode, i.type, i.name, i.index_key, i.provider, i.resource_index,
               i.instance_index) for i in full.instances]
    assert fields == [(i.address, i.deposed, i.module, i.mode, i.type, i.name, i.index_key, i.provider, i.resource_index,
                       i.instance_index) for i in index.instances]
    assert all(i.obj == {} for i in index.instances) and "resources" not in index.raw
    assert (index.serial, index.lineage, index.terraform_version) == (full.serial, full.lineage, full.terraform_version)


def test_a_version_given_as_text_is_stored_as_its_utf8_bytes_would_be(conn, make_state):
    # A refresh commit hands its own serialisation over as a str, sent to the server a slice at a
    # time through COPY: the same version, hash included, as its UTF-8 bytes make.
    import hashlib

    from kilolock.store.versions import UTF8_CHUNK

    attrs = {"id": "é<&>", "esc": "back\\slash \"quoted\" tab\tnew\nline\r", "big": "x" * (UTF8_CHUNK + 7) + "ü"}
    text = json.dumps(json.loads(make_state(1, {"a": attrs})), ensure_ascii=False, separators=(",", ":"))
    as_text = writes.store_document(conn, "t", tfstate.parse_state(text), text, source="refresh", actor="t")
    as_bytes = writes.store_document(conn, "b", tfstate.parse_state(text), text.encode(), source="refresh", actor="t")
    assert as_text.version.content_hash == as_bytes.version.content_hash == hashlib.sha256(text.encode()).hexdigest()
    assert versions.raw_state_text(conn, "t") == versions.raw_state_text(conn, "b")
    assert _pulled(conn, "t") == _pulled(conn, "b")
    # What jsonb cannot hold, and what UTF-8 cannot carry, are refused as from bytes, nothing written.
    nul = text.replace("back", "\\u0000", 1)
    with pytest.raises(tfstate.StateError, match="PostgreSQL cannot store it as JSON"):
        writes.store_document(conn, "n", tfstate.parse_state(nul), nul, source="refresh", actor="t")
    lone = text.replace("back", "\ud800", 1)
    with pytest.raises(tfstate.StateError, match="not UTF-8 text"):
        writes.store_document(conn, "s", tfstate.parse_state(lone), lone, source="refresh", actor="t")
    assert conn.execute("SELECT count(*) FROM state_versions").fetchone()[0] == 2


@pytest.mark.parametrize("fixture", sorted(p.name for p in STATES.glob("*.tfstate")))
def test_an_import_indexes_terraforms_layout_an_instance_at_a_time(fixture):
    # Every state Terraform wrote (its "instances" last in each resource) is indexed streamed, to
    # the very index parse_state makes of the whole document; another layout is parsed whole.
    text = (STATES / fixture).read_text()
    streamed, whole = tfstate.index_state_text(text, fixture), tfstate.parse_state(text, fixture, keep_objects=False)
    assert streamed is not None
    fields = [[(i.address, i.deposed, i.module, i.mode, i.type, i.name, i.index_key, i.provider, i.resource_index,
                i.instance_index, i.obj) for i in s.instances] for s in (streamed, whole)]
    assert fields[0] == fields[1] and json.dumps(streamed.raw) == json.dumps(whole.raw)
    doc = json.loads(text)
    for res in doc.get("resources", []):
        res["zz_after_instances"] = 1
    assert tfstate.index_state_text(json.dumps(doc), fixture) is None
