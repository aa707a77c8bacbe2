"""What every write of a version pays whatever its size (a small refresh's commit, an HTTP backend
POST): the statements around the temporary tables must not cost more than the data they hold."""
from __future__ import annotations

from kilolock import tfstate
from kilolock.store import states, versions, writes
from kit.pg import record_statements


def test_a_write_runs_without_jit_and_leaves_the_session_setting_alone(conn, make_state) -> None:
    # The planner cannot see into the temporary tables, estimates their statements far above
    # jit_above_cost, and compiling them took 35-70 ms of a 10-instance commit that runs in ~1 ms.
    # A trigger on the version row reports the setting the write ran under.
    conn.execute("CREATE TABLE jit_seen (setting text)")
    conn.execute("""CREATE FUNCTION note_jit() RETURNS trigger LANGUAGE plpgsql AS $$
                    BEGIN INSERT INTO jit_seen VALUES (current_setting('jit')); RETURN NEW; END $$""")
    conn.execute("CREATE TRIGGER note_jit AFTER INSERT ON state_versions FOR EACH ROW EXECUTE FUNCTION note_jit()")
    conn.execute("SET jit = on")
    for serial in (1, 2):
        raw = make_state(serial, {"a": {"id": str(serial)}, "b": {"id": "2"}})
        writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source="import", actor="test")
    assert [r[0] for r in conn.execute("SELECT setting FROM jit_seen")] == ["off", "off"]
    assert conn.execute("SHOW jit").fetchone() == ("on",)  # SET LOCAL: over with the write's transaction


def test_a_refresh_that_closes_no_lifecycle_skips_the_drift_statement(conn, make_state, monkeypatch) -> None:
    from kilolock.store import drift_records

    sent = record_statements(monkeypatch)

    def refresh(serial: int, attributes: dict[str, str]) -> writes.WriteResult:
        raw = make_state(serial, {"a": attributes, "b": {"id": "2"}})
        cur = versions.current_version(conn, states.state_id(conn, "prod"))
        assert cur is not None
        return writes.commit_delta(conn, "prod", tfstate.parse_state(raw), raw, expect_serial=cur.serial,
                                   expect_lineage=cur.lineage, touched={("null_resource.a", "")}, actor="test")

    raw = make_state(1, {"a": {"id": "1"}, "b": {"id": "2"}})
    writes.store_document(conn, "prod", tfstate.parse_state(raw), raw, source="import", actor="test")
    drift_statements = (drift_records._REFRESH, drift_records._RESOLVE_ALL)
    sent.clear()
    assert refresh(2, {"id": "1"}).closed == 0  # read back unchanged
    assert not [q for q in sent if q in drift_statements]
    assert refresh(3, {"id": "1b"}).closed == 1  # drifted: recorded as ever
    assert [q for q in sent if q in drift_statements] == [drift_records._REFRESH]
    assert conn.execute("SELECT kind FROM drift_records").fetchall() == [("changed",)]
