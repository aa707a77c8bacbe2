"""The write path: one version plus its lifecycle rows per transaction, and the serial rules."""
from __future__ import annotations

import psycopg
import pytest

from kilolock import tfstate
from kilolock.store import errors, writes
from kit.pg import one_row


def write(conn, raw: bytes, name: str = "prod", source: str = "import", **kw):
    return writes.store_document(conn, name, tfstate.parse_state(raw), raw, source=source, actor="test", **kw)


def commit(conn, raw: bytes, *, expect_serial: int, expect_lineage: str, name: str = "prod"):
    return writes.commit_delta(conn, name, tfstate.parse_state(raw), raw, expect_serial=expect_serial,
                               expect_lineage=expect_lineage, touched=None, actor="test")


def open_rows(conn, name="prod"):
    return dict(conn.execute(
        """SELECT r.address, r.attributes FROM resources r JOIN states s ON s.id = r.state_id
           WHERE s.name = %s AND r.delete_serial IS NULL""", (name,)).fetchall())


def counts(conn):
    return conn.execute("SELECT (SELECT count(*) FROM state_versions), (SELECT count(*) FROM resources), (SELECT count(*) FROM states)").fetchone()


def test_first_version_opens_a_lifecycle_per_instance(conn, make_state):
    res = write(conn, make_state(1, {"a": {"id": "1"}, "b": {"id": "2"}}))
    assert res.created and (res.opened, res.closed, res.unchanged) == (2, 0, 0)
    assert open_rows(conn) == {"null_resource.a": {"id": "1"}, "null_resource.b": {"id": "2"}}
    row = conn.execute("SELECT create_serial, delete_serial, mode, type, name, module, provider FROM resources WHERE address = 'null_resource.a'").fetchone()
    assert row == (1, None, "managed", "null_resource", "a", "", 'provider["registry.terraform.io/hashicorp/null"]')


def test_next_version_closes_opens_and_dedups(conn, make_state):
    write(conn, make_state(1, {"same": {"id": "1"}, "changes": {"id": "2"}, "goes": {"id": "3"}}))
    res = write(conn, make_state(2, {"same": {"id": "1"}, "changes": {"id": "2b"}, "new": {"id": "4"}}))
    assert (res.opened, res.closed, res.unchanged) == (2, 2, 1)
    rows = conn.execute("SELECT address, create_serial, delete_serial FROM resources ORDER BY address, create_serial").fetchall()
    assert rows == [
        ("null_resource.changes", 1, 2),
        ("null_resource.changes", 2, None),
        ("null_resource.goes", 1, 2),
        ("null_resource.new", 2, None),
        ("null_resource.same", 1, None),
    ]
    v2 = conn.execute("SELECT id FROM state_versions WHERE serial = 2").fetchone()[0]
    closed_by = {r[0] for r in conn.execute("SELECT closed_by_version_id FROM resources WHERE delete_serial = 2")}
    assert closed_by == {v2}


def test_key_order_and_whitespace_do_not_open_a_new_lifecycle(conn, make_state):
    write(conn, make_state(1, {"a": {"id": "1", "triggers": {"x": "1", "y": "2"}}}))
    res = write(conn, make_state(2, {"a": {"triggers": {"y": "2", "x": "1"}, "id": "1"}}))
    assert (res.opened, res.closed, res.unchanged) == (0, 0, 1)


def test_at_most_one_open_row_per_address(conn, make_state):
    write(conn, make_state(1, {"a": {"id": "1"}}))
    conn.commit()
    sid = conn.execute("SELECT id FROM states").fetchone()[0]
    vid = conn.execute("SELECT id FROM state_versions").fetchone()[0]
    with pytest.raises(psycopg.errors.UniqueViolation):
        conn.execute(
            """INSERT INTO resources (state_id, address, mode, type, name, provider, content_hash, create_serial, opened_by_version_id)
               VALUES (%s, 'null_resource.a', 'managed', 'null_resource', 'a', 'p', 'h', 1, %s)""", (sid, vid))


def test_identical_bytes_are_an_idempotent_retry(conn, make_state):
    raw = make_state(5, {"a": {"id": "1"}})
    first = write(conn, raw)
    again = write(conn, raw)
    assert first.created and not again.created and again.version.id == first.version.id
    assert counts(conn) == (1, 1, 1)


@pytest.mark.parametrize("serial", [4, 5])
def test_serial_that_does_not_advance_is_refused(conn, make_state, serial):
    write(conn, make_state(5, {"a": {"id": "1"}}))
    with pytest.raises(errors.VersionConflict, match=f"is at serial 5; the new state has serial {serial}"):
        write(conn, make_state(serial, {"a": {"id": "other"}}))
    assert counts(conn) == (1, 1, 1)


def test_foreign_lineage_needs_force(conn, make_state):
    write(conn, make_state(1, {"a": {"id": "1"}}))
    with pytest.raises(errors.VersionConflict, match="lineage lineage-1, the new state has other"):
        write(conn, make_state(2, {"a": {"id": "1"}}, lineage="other"))
    res = write(conn, make_state(2, {"a": {"id": "1"}}, lineage="other"), force=True)
    assert res.created and res.version.lineage == "other"


def test_compare_and_swap_refuses_a_moved_state(conn, make_state):
    write(conn, make_state(1, {"a": {"id": "1"}}))
    write(conn, make_state(2, {"a": {"id": "2"}}))
    with pytest.raises(errors.VersionConflict, match="changed while this run was in progress"):
        commit(conn, make_state(3, {"a": {"id": "3"}}), expect_serial=1, expect_lineage="lineage-1")
    assert counts(conn)[0] == 2
    ok = commit(conn, make_state(3, {"a": {"id": "3"}}), expect_serial=2, expect_lineage="lineage-1")
    assert ok.created


def test_a_failed_write_leaves_no_rows_at_all(conn, make_state):
    # PostgreSQL's jsonb cannot hold \u0000; the failure comes after the state row was created.
    raw = make_state(1, {"a": {"id": "1"}, "b": {"id": "nul\\u0000here"}}).replace(b"\\\\u0000", b"\\u0000")
    with pytest.raises(tfstate.StateError, match="PostgreSQL cannot store it"):
        write(conn, raw)
    assert counts(conn) == (0, 0, 0)


def test_deposed_objects_get_their_own_lifecycle(conn):
    import json

    doc = {"version": 4, "serial": 1, "lineage": "l", "resources": [
        {"mode": "managed", "type": "null_resource", "name": "a", "provider": 'provider["registry.terraform.io/hashicorp/null"]',
         "instances": [{"schema_version": 0, "attributes": {"id": "new"}},
                       {"schema_version": 0, "deposed": "00000001", "attributes": {"id": "old"}}]}]}
    res = write(conn, json.dumps(doc).encode())
    assert res.opened == 2
    rows = conn.execute("SELECT address, deposed, attributes->>'id' FROM resources ORDER BY deposed").fetchall()
    assert rows == [("null_resource.a", "", "new"), ("null_resource.a", "00000001", "old")]


def test_concurrent_writers_one_serial_one_winner(db_url, make_state):
    import threading

    with psycopg.connect(db_url) as c:
        write(c, make_state(1, {"a": {"id": "1"}}))
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def writer(n: int) -> None:
        with psycopg.connect(db_url) as c:
            barrier.wait()
            try:
                write(c, make_state(2, {"a": {"id": f"writer-{n}"}}))
                outcomes.append("ok")
            except errors.VersionConflict:
                outcomes.append("refused")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["ok", "refused", "refused", "refused"]
    with psycopg.connect(db_url) as c:
        assert one_row(c, "SELECT count(*) FROM resources WHERE delete_serial IS NULL")[0] == 1
        assert one_row(c, "SELECT count(*) FROM state_versions")[0] == 2
