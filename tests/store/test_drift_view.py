"""current_resource_drift: the ADR's predicate (both clauses) plus the deleted kind."""
from __future__ import annotations

from kilolock import tfstate
from kilolock.store import writes


def write(conn, raw: bytes, source: str):
    return writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source=source, actor="t")


def drift(conn):
    return sorted(conn.execute(
        """SELECT address, drift_kind, previous_attributes->>'id', current_attributes->>'id', detected_serial
           FROM current_resource_drift WHERE state_name = 'prod'""").fetchall())


def test_refresh_change_is_drift_until_the_next_apply(conn, make_state):
    write(conn, make_state(1, {"a": {"id": "1"}, "b": {"id": "2"}}), "apply")
    assert drift(conn) == []
    write(conn, make_state(2, {"a": {"id": "1-changed"}, "b": {"id": "2"}}), "refresh")
    assert drift(conn) == [("null_resource.a", "changed", "1", "1-changed", 2)]
    # Another refresh that confirms the state keeps the drift visible.
    write(conn, make_state(3, {"a": {"id": "1-changed"}, "b": {"id": "2"}}), "refresh")
    assert drift(conn) == [("null_resource.a", "changed", "1", "1-changed", 2)]
    # Clause (2): any later apply clears it, even one that does not touch the address.
    write(conn, make_state(4, {"a": {"id": "1-changed"}, "b": {"id": "2"}, "c": {"id": "3"}}), "apply")
    assert drift(conn) == []


def test_new_address_from_apply_or_import_is_not_drift(conn, make_state):
    write(conn, make_state(1, {"a": {"id": "1"}}), "import")
    write(conn, make_state(2, {"a": {"id": "1"}, "b": {"id": "2"}}), "import")
    assert drift(conn) == []


def test_object_found_deleted_by_refresh_is_drift(conn, make_state):
    write(conn, make_state(1, {"a": {"id": "1"}, "b": {"id": "2"}}), "apply")
    write(conn, make_state(2, {"b": {"id": "2"}}), "refresh")
    assert drift(conn) == [("null_resource.a", "deleted", "1", None, 2)]
    write(conn, make_state(3, {"b": {"id": "2"}}), "apply")
    assert drift(conn) == []


def test_apply_removal_is_not_drift(conn, make_state):
    write(conn, make_state(1, {"a": {"id": "1"}, "b": {"id": "2"}}), "apply")
    write(conn, make_state(2, {"b": {"id": "2"}}), "apply")
    assert drift(conn) == []


def test_drift_links_the_refresh_run(conn, make_state):
    write(conn, make_state(1, {"a": {"id": "1"}}), "apply")
    v1 = conn.execute("SELECT id FROM state_versions WHERE serial = 1").fetchone()[0]
    res = write(conn, make_state(2, {"a": {"id": "x"}}), "refresh")
    run = conn.execute(
        """INSERT INTO refresh_runs (state_id, from_version_id, to_version_id, status) VALUES (%s, %s, %s, 'succeeded') RETURNING id""",
        (res.state_id, v1, res.version.id)).fetchone()[0]
    assert conn.execute("SELECT refresh_run_id FROM current_resource_drift").fetchone()[0] == run


def test_a_refresh_that_only_adds_sensitivity_marks_is_not_drift(conn):
    import json

    def state(serial, marks):
        return json.dumps({"version": 4, "serial": serial, "lineage": "l", "resources": [
            {"mode": "managed", "type": "random_password", "name": "p", "provider": 'provider["registry.terraform.io/hashicorp/random"]',
             "instances": [{"schema_version": 3, "attributes": {"result": "x"}, "sensitive_attributes": marks}]}]}).encode()

    write(conn, state(1, []), "apply")
    write(conn, state(2, [[{"type": "get_attr", "value": "result"}]]), "refresh")
    # Marks are metadata: the lifecycle stays open, its row follows the new marks.
    assert conn.execute("SELECT count(*), min(create_serial), max(sensitive_attributes::text) FROM resources").fetchone() == (
        1, 1, '[[{"type": "get_attr", "value": "result"}]]')
    assert drift(conn) == []
