"""Migration 0007 on a database as 0006 left it: drift records backfilled from what the 0006 view
showed, and every lifecycle's hash recomputed so that the first write after the upgrade reopens
nothing (not even an object with an `identity`, the one hashed field that is not a column)."""
from __future__ import annotations

import json

import psycopg

from kilolock import tfstate
from kilolock.store import versions, writes
from kilolock.store.migrate import apply_migrations
from kit import upgrade as upgradekit
from kit.pg import one_row

FIXTURE = upgradekit.FIXTURES / "schema-0006.sql"


def at_0006(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        apply_migrations(conn, upgradekit.released_migrations("0006"))
        upgradekit.load(conn, FIXTURE.read_text(encoding="utf-8"))


def _drift_0006(conn: psycopg.Connection) -> list[tuple]:
    return sorted(conn.execute("SELECT state_name, address, deposed, drift_kind, detected_serial FROM current_resource_drift").fetchall())


def test_backfill_is_what_the_0006_view_showed(empty_db_url):
    at_0006(empty_db_url)
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        before = _drift_0006(conn)
        assert [b[3] for b in before] == ["changed", "deleted"]
        apply_migrations(conn)
        assert _drift_0006(conn) == before
        assert sorted(conn.execute(
            "SELECT address, kind, first_detected_serial, resolved_serial FROM drift_records").fetchall()) == [
            (b[1], b[3], b[4], None) for b in before]


def test_backfill_drops_the_double_reported_deletion(empty_db_url):
    # 0006 reported a deletion twice when a marks-only refresh had reopened the lifecycle before it.
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        apply_migrations(conn, upgradekit.released_migrations("0006"))
        sid = one_row(conn, "INSERT INTO states (name) VALUES ('s') RETURNING id")[0]
        vids = {}
        for serial, source in ((1, "import"), (2, "refresh"), (3, "refresh")):
            vids[serial] = one_row(
                conn, """INSERT INTO state_versions (state_id, serial, lineage, source, raw_state, content_hash)
                   VALUES (%s, %s, 'l', %s, '{"version": 4, "resources": []}', %s) RETURNING id""",
                (sid, serial, source, f"h{serial}"))[0]
        for create, delete, opened, closed, marks in ((1, 2, 1, 2, "[]"), (2, 3, 2, 3, '[[{"type": "get_attr", "value": "x"}]]')):
            conn.execute(
                """INSERT INTO resources (state_id, address, mode, type, name, provider, attributes, sensitive_attributes,
                                          content_hash, create_serial, delete_serial, opened_by_version_id, closed_by_version_id)
                   VALUES (%s, 'null_resource.a', 'managed', 'null_resource', 'a', 'p', '{"x": 1}', %s, %s, %s, %s, %s, %s)""",
                (sid, marks, f"old{create}", create, delete, vids[opened], vids[closed]))
        assert [r[1] for r in conn.execute("SELECT address, detected_serial FROM current_resource_drift ORDER BY 2")] == [2, 3]
        apply_migrations(conn)
        assert conn.execute("SELECT address, drift_kind, detected_serial FROM current_resource_drift").fetchall() == [
            ("null_resource.a", "deleted", 3)]


def test_the_first_write_after_the_upgrade_reopens_nothing(empty_db_url):
    at_0006(empty_db_url)
    identity = {"id": "i-123", "region": "eu"}
    doc = {"version": 4, "terraform_version": "1.12.0", "serial": 1, "lineage": "ident", "outputs": {}, "resources": [
        {"module": "module.m", "mode": "managed", "type": "null_resource", "name": "n",
         "provider": 'module.m.provider["registry.terraform.io/hashicorp/null"]',
         "instances": [{"index_key": 0, "schema_version": 0, "attributes": {"id": "1"}, "identity": identity,
                        "sensitive_attributes": []},
                       {"index_key": 0, "deposed": "00aa", "status": "tainted", "schema_version": 0,
                        "attributes": {"id": "0"}, "sensitive_attributes": []}]}]}
    with psycopg.connect(empty_db_url, autocommit=True) as conn:
        # A state written as 0006 wrote it: the version and its rows, the hash as 0006 computed it.
        sid = one_row(conn, "INSERT INTO states (name) VALUES ('ident') RETURNING id")[0]
        vid = one_row(conn, """INSERT INTO state_versions (state_id, serial, lineage, source, raw_state, content_hash)
                              VALUES (%s, 1, 'ident', 'apply', %s, 'h') RETURNING id""", (sid, json.dumps(doc)))[0]
        for deposed, status, attrs in (("", None, {"id": "1"}), ("00aa", "tainted", {"id": "0"})):
            conn.execute(
                """INSERT INTO resources (state_id, address, deposed, mode, type, name, module, index_key, provider, status,
                                          attributes, content_hash, create_serial, opened_by_version_id)
                   VALUES (%s, 'module.m.null_resource.n[0]', %s, 'managed', 'null_resource', 'n', 'module.m', '0', 'p', %s,
                           %s, 'the 0006 hash', 1, %s)""", (sid, deposed, status, json.dumps(attrs), vid))
        apply_migrations(conn)
        for name in ("ident", "prod", "precise"):
            raw = versions.raw_state_text(conn, name).encode()
            parsed = tfstate.parse_state(raw)
            doc2 = json.loads(raw)
            doc2["serial"] = parsed.serial + 1
            raw2 = json.dumps(doc2).encode()
            res = writes.store_document(conn, name, tfstate.parse_state(raw2), raw2, source="refresh", actor="t")
            assert (name, res.opened, res.closed) == (name, 0, 0)
        # and an identity that changes is a new lifecycle: the hash did read it
        doc2 = json.loads(versions.raw_state_text(conn, "ident"))
        doc2["serial"] += 1
        doc2["resources"][0]["instances"][0]["identity"] = {"id": "i-456", "region": "eu"}
        raw3 = json.dumps(doc2).encode()
        res = writes.store_document(conn, "ident", tfstate.parse_state(raw3), raw3, source="apply", actor="t")
        assert (res.opened, res.closed) == (1, 1)
