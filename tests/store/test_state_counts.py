"""A state's counts kept on its row (migration 0023: version_count, instance_count) agree with the
rows they count after every kind of write: an import, an apply that closes, keeps and opens
lifecycles, a refresh's observations (a confirmation and one that found drift), an import in one
statement of many states, a state's deletion; `kl state list`, the API and the web UI's overview
read them."""
from __future__ import annotations

import json
from typing import Any

from kilolock import tfstate
from kilolock.store import states, summary, versions, writes
from kit.states import NULL_PROVIDER


def doc(serial: int, objects: dict[str, dict[str, Any]]) -> bytes:
    return json.dumps({"version": 4, "terraform_version": "1.8.5", "serial": serial, "lineage": "l", "outputs": {}, "resources": [
        {"mode": "managed", "type": "null_resource", "name": name, "provider": NULL_PROVIDER,
         "instances": [{"schema_version": 0, "attributes": attrs, "sensitive_attributes": []}]}
        for name, attrs in objects.items()]}).encode()


def counted(conn) -> dict[str, tuple[int, int]]:
    """{state: (version_count, instance_count)} as kept on the rows."""
    return {r[0]: (r[1], r[2]) for r in conn.execute("SELECT name, version_count, instance_count FROM states")}


def recounted(conn) -> dict[str, tuple[int, int]]:
    """{state: (versions, open lifecycle rows)} counted from the rows themselves."""
    return {r[0]: (r[1], r[2]) for r in conn.execute("""
        SELECT s.name, (SELECT count(*) FROM state_versions v WHERE v.state_id = s.id),
               (SELECT count(*) FROM resources r WHERE r.state_id = s.id AND r.delete_serial IS NULL)
        FROM states s""")}


def test_counts_on_the_state_row_follow_every_write(conn) -> None:
    def write(name: str, raw: bytes, source: str) -> None:
        writes.store_document(conn, name, tfstate.parse_state(raw), raw, source=source, actor="t")
        assert counted(conn) == recounted(conn)

    write("prod", doc(1, {"a": {"id": "1"}, "b": {"id": "2"}, "c": {"id": "3"}}), "import")
    assert counted(conn)["prod"] == (1, 3)
    write("prod", doc(2, {"a": {"id": "1"}, "b": {"id": "2b"}, "d": {"id": "4"}, "e": {"id": "5"}}), "apply")  # c gone, b changed
    assert counted(conn)["prod"] == (2, 4)
    write("dev", doc(1, {"a": {"id": "1"}}), "import")

    sid = states.state_id(conn, "prod")
    base = versions.current_version(conn, sid)
    assert base is not None
    same = doc(2, {"a": {"id": "1"}, "b": {"id": "2b"}, "d": {"id": "4"}, "e": {"id": "5"}})
    writes.record_observation(conn, "prod", tfstate.parse_state(same), same, base=base, touched=set(), same_as_base=True,
                              actor="t")
    drifted = doc(2, {"a": {"id": "1"}, "b": {"id": "2c"}, "d": {"id": "4"}, "e": {"id": "5"}})
    writes.record_observation(conn, "prod", tfstate.parse_state(drifted), drifted, base=base,
                              touched={("null_resource.b", "")}, same_as_base=False, actor="t")
    # Observations are versions, but never change the lifecycle index (Terraform's alone).
    assert counted(conn) == recounted(conn) and counted(conn)["prod"] == (4, 4)
    assert [(r["name"], r["versions"], r["resources"]) for r in summary.list_states(conn)] == [("dev", 1, 1), ("prod", 4, 4)]

    with conn.transaction():
        states.delete_state(conn, states.state_id(conn, "dev"))
    assert counted(conn) == recounted(conn) == {"prod": (4, 4)}


def test_a_statement_over_many_states_counts_each(conn) -> None:
    for name in ("a", "b"):
        writes.store_document(conn, name, tfstate.parse_state(doc(1, {"x": {"id": "1"}, "y": {"id": "2"}})),
                              doc(1, {"x": {"id": "1"}, "y": {"id": "2"}}), source="import", actor="t")
    # One UPDATE closing rows of two states, then one DELETE over both: each state's count moves.
    conn.execute("UPDATE resources SET delete_serial = create_serial WHERE address = 'null_resource.x'")
    assert counted(conn) == recounted(conn) == {"a": (1, 1), "b": (1, 1)}
    conn.execute("UPDATE resources SET delete_serial = NULL WHERE address = 'null_resource.x'")
    assert counted(conn) == recounted(conn) == {"a": (1, 2), "b": (1, 2)}
    conn.execute("DELETE FROM resources WHERE address = 'null_resource.y'")
    assert counted(conn) == recounted(conn) == {"a": (1, 1), "b": (1, 1)}
