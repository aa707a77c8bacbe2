"""Duplicates are managed instances claiming one object: the repeated ids are found over every
instance's id (the index answers alone), then only managed claims count, so a data source reading
an object a resource manages is no duplicate, nor are two data sources reading one."""
from __future__ import annotations

import json

import psycopg

from kilolock import tfstate
from kilolock.store import inventory as store
from kilolock.store import writes

NULL = 'provider["registry.terraform.io/hashicorp/null"]'


def _store(conn: psycopg.Connection, state: str, instances: list[tuple[str, str, str]]) -> None:
    """(mode, name, id) each, as null_resource / null_data_source instances."""
    resources = [{"mode": mode, "type": "null_resource" if mode == "managed" else "null_data_source", "name": name,
                  "provider": NULL, "instances": [{"schema_version": 0, "attributes": {"id": oid}}]}
                 for mode, name, oid in instances]
    raw = json.dumps({"version": 4, "terraform_version": "1.8.5", "serial": 1, "lineage": f"l-{state}",
                      "outputs": {}, "resources": resources}).encode()
    writes.store_document(conn, state, tfstate.parse_state(raw), raw, source="import", actor="test")


def test_only_managed_claims_make_a_duplicate(conn: psycopg.Connection) -> None:
    _store(conn, "a", [("managed", "x", "shared"), ("managed", "y", "one-managed"), ("data", "d", "two-reads")])
    _store(conn, "b", [("managed", "x", "shared"), ("data", "y", "one-managed"), ("data", "d", "two-reads")])
    _store(conn, "c", [("data", "x", "shared")])

    groups = store.duplicates(conn)
    assert [(g["confidence"], g["key"], [(c["state"], c["address"]) for c in g["claims"]]) for g in groups] == [
        ("likely", "shared", [("a", "null_resource.x"), ("b", "null_resource.x")])]
    assert [(g["key"], len(g["claims"])) for g in store.duplicates_page(conn, None, 10)] == [("shared", 2)]
    only_c = [str(r[0]) for r in conn.execute("SELECT id FROM states WHERE name = 'c'")]
    assert store.duplicates(conn, only_c) == []
