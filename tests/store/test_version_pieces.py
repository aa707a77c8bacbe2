"""Versions stored as pieces (migration 0014): a version stores what its state does not hold yet,
reads back byte for byte as a whole stored copy did, and goes with its state."""
from __future__ import annotations

import gzip
import io
import json
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from kilolock import tfstate
from kilolock.store import states, versions, writes
from kit.pg import one_row

STATES = Path(__file__).resolve().parents[1] / "fixtures" / "states"
NULL = 'provider["registry.terraform.io/hashicorp/null"]'

# Every real Terraform state the suite has, plus the big one: whatever Terraform writes must pull
# the same from pieces as from a whole copy (the v3 one is imported as its v4 upgrade, also listed).
FIXTURES = sorted(p for p in STATES.rglob("*.tfstate*") if p.name not in ("big10000.tfstate.gz", "v3-terraformer.tfstate"))


def _doc(serial: int, ids: dict[str, str], **top: Any) -> bytes:
    return json.dumps({"version": 4, "terraform_version": "1.8.5", "serial": serial, "lineage": "l",
                       "outputs": {"o": {"value": 1.50, "type": "number"}},
                       "resources": [{"mode": "managed", "type": "null_resource", "name": n, "provider": NULL,
                                      "instances": [{"schema_version": 0, "attributes": {"id": i}, "sensitive_attributes": [],
                                                     "private": "bnVsbA=="}]}
                                     for n, i in ids.items()], **top}).encode()


def _write(conn: psycopg.Connection, raw: bytes, name: str = "prod") -> writes.WriteResult:
    return writes.store_document(conn, name, tfstate.parse_state(raw), raw, source="import", actor="test")


def _pieces(conn: psycopg.Connection) -> tuple[int, int]:
    return one_row(conn, "SELECT (SELECT count(*) FROM version_pieces), (SELECT count(*) FROM version_lists)")


def _pull(conn: psycopg.Connection, name: str, serial: int | None = None) -> str:
    out = io.StringIO()
    versions.write_pulled(conn, name, serial, out.write)
    return out.getvalue()


def _loaded(conn: psycopg.Connection, name: str, serial: int | None = None) -> str:
    """The version as a refresh loads it (versions.load_document, a piece at a time), written back
    compact with its keys in the order it has them: it must be the text's parse, order included."""
    if serial is None:
        current = versions.current_version(conn, states.state_id(conn, name))
        assert current is not None
        serial = current.serial
    loaded = versions.load_document(conn, name, serial, tfstate.loads_exact)
    assert tfstate.dumps_compact(loaded) == tfstate.dumps_compact(tfstate.loads_exact(versions.raw_state_text(conn, name, serial)))
    return tfstate.dumps_compact(loaded)


def _store_whole(conn: psycopg.Connection, name: str, raw: bytes) -> None:
    """A version as kl stored every version before migration 0014: the whole document in raw_state."""
    with conn.transaction():
        sid = one_row(conn, "INSERT INTO states (name) VALUES (%s) RETURNING id", (name,))[0]
        conn.execute("INSERT INTO state_versions (state_id, serial, lineage, source, raw_state, content_hash) "
                     "VALUES (%s, 1, 'l', 'import', %s::jsonb, 'h')", (sid, raw.decode()))


def test_a_version_stores_only_the_pieces_its_state_lacks(conn):
    ids = {f"r{n}": f"id-{n}" for n in range(50)}
    _write(conn, _doc(1, ids))
    # 50 resources of one instance, each a piece, and the top level; the layout.
    assert _pieces(conn) == (51, 1)
    _write(conn, _doc(2, ids))  # a refresh that found nothing: a new serial only
    assert _pieces(conn) == (51, 1)
    assert one_row(conn, "SELECT count(*) FROM state_versions WHERE raw_state IS NOT NULL")[0] == 0
    # The lifecycle rows hold the attributes; the pieces name those rows instead of copying them.
    assert one_row(conn, "SELECT count(*) FROM version_pieces WHERE attributes_of IS NOT NULL")[0] == 50
    assert one_row(conn, "SELECT count(*) FROM version_pieces WHERE body -> 'instances' -> 0 ? 'attributes'")[0] == 0
    _write(conn, _doc(3, {**ids, "r7": "changed"}))  # one instance changed
    assert _pieces(conn) == (52, 2)  # its resource's piece, the new layout
    _write(conn, _doc(4, ids))  # back as it was: every piece is held already, the old layout too
    assert _pieces(conn) == (52, 2)
    for serial, doc in [(1, _doc(1, ids)), (2, _doc(2, ids)), (3, _doc(3, {**ids, "r7": "changed"})), (4, _doc(4, ids))]:
        assert _pull(conn, "prod", serial) == tfstate.pretty_state(doc.decode())
        assert json.loads(versions.raw_state_text(conn, "prod", serial)) == json.loads(doc)
        assert json.loads(_loaded(conn, "prod", serial)) == json.loads(doc)


@pytest.mark.parametrize("fixture", FIXTURES, ids=lambda p: str(p.relative_to(STATES)))
def test_pieces_read_back_exactly_as_a_whole_copy(conn, fixture):
    raw = fixture.read_bytes()
    raw = gzip.decompress(raw) if fixture.name.endswith(".gz") else raw
    state = tfstate.parse_state(raw, str(fixture))
    writes.store_document(conn, "pieced", state, raw, source="import", actor="test")
    _store_whole(conn, "whole", raw)
    assert one_row(conn, "SELECT raw_state IS NULL FROM state_versions v JOIN states s ON s.id = v.state_id "
                         "WHERE s.name = 'pieced'")[0]
    assert _pull(conn, "pieced") == _pull(conn, "whole")
    assert versions.raw_state_text(conn, "pieced") == versions.raw_state_text(conn, "whole")
    pieced, whole = versions.current_text(conn, "pieced"), versions.current_text(conn, "whole")  # the backend's GET
    assert pieced is not None and whole is not None and pieced[1] == whole[1]
    assert _loaded(conn, "pieced") == _loaded(conn, "whole")


@pytest.mark.parametrize("doc", [
    # numbers a float would round or jsonb would call equal (1.0, 1), unicode, an empty key, a resource
    # without instances, a flatmap object; no resources; empty resources
    (b'{"version": 4, "serial": 3, "lineage": "l", "outputs": {"": {"value": 1e400, "type": "number"}}, '
    b'"resources": [{"mode": "managed", "type": "t", "name": "n", "provider": "provider.null", "instances": []}, '
    b'{"mode": "managed", "type": "t", "name": "m", "provider": "provider.null", "each": "list", "instances": ['
    b'{"index_key": 0, "attributes": {"v": 1.0, "w": [1.50, 2e3]}}, {"index_key": 1, "attributes": {"v": 1}}, '
    b'{"index_key": 2, "attributes_flat": {"id": "x"}}]}], "x": "\\u2028\\u00e9"}'),
    # keys that sort around "resources" and "instances" in jsonb's order (length, then bytes)
    (b'{"version": 4, "serial": 2, "lineage": "l", "resourcez": 1, "aesources": 2, "\xc3\xa9\xc3\xa9\xc3\xa9\xc3\xa9": 3, '
     b'"a\\"b": 4, "a_key_longer_than_resources": 5, "resources": [{"mode": "managed", "type": "t", "name": "n", '
     b'"provider": "provider.null", "zzzzzzzzz": 1, "aaaaaaaaa": 2, "i\\u00f1stances": 3, "instances": ['
     b'{"attributes": {"id": "1"}}, {"index_key": "b", "attributes": {"id": "2"}}]}]}'),
    b'{"version": 4, "serial": 1, "lineage": "l", "outputs": {}}',
    b'{"version": 4, "serial": 1, "lineage": "l", "resources": []}',
], ids=["odd", "key-order", "no-resources", "empty-resources"])
def test_odd_documents_read_back_exactly(conn, doc):
    state = tfstate.parse_state(doc)
    writes.store_document(conn, "pieced", state, doc, source="import", actor="test")
    _store_whole(conn, "whole", doc)
    assert one_row(conn, "SELECT raw_state IS NULL FROM state_versions v JOIN states s ON s.id = v.state_id "
                         "WHERE s.name = 'pieced'")[0]
    assert versions.raw_state_text(conn, "pieced") == versions.raw_state_text(conn, "whole")
    assert _pull(conn, "pieced") == _pull(conn, "whole")
    assert _loaded(conn, "pieced") == _loaded(conn, "whole")


def test_deleting_a_state_removes_its_pieces_only(conn):
    ids = {f"r{n}": f"id-{n}" for n in range(5)}
    _write(conn, _doc(1, ids), "a")
    _write(conn, _doc(1, ids), "b")  # the same content: its own pieces, not shared ones
    assert _pieces(conn) == (2 * 6, 2 * 1)
    with conn.transaction():
        states.delete_state(conn, states.state_id(conn, "a"))
    assert _pieces(conn) == (6, 1)
    assert _pull(conn, "b") == tfstate.pretty_state(_doc(1, ids).decode())


def test_writers_of_states_with_the_same_content_do_not_wait_for_each_other(db_url):
    # Each state's pieces are its own: a writer holding its transaction open (its pieces written,
    # not committed) does not block another state's writer of the very same document.
    raw = _doc(1, {f"r{n}": f"id-{n}" for n in range(20)})
    with psycopg.connect(db_url, autocommit=True) as first, psycopg.connect(db_url, autocommit=True) as second:
        second.execute("SET lock_timeout = '5s'")
        with first.transaction():
            _write(first, raw, "a")
            done = threading.Event()

            def other() -> None:
                _write(second, raw, "b")
                done.set()

            t = threading.Thread(target=other)
            t.start()
            t.join(30)
            assert done.is_set(), "the second state's write waited for the first's transaction"
        assert _pull(first, "a") == _pull(first, "b")


def test_a_refresh_commit_after_a_whole_version_reads_back_exactly(conn):
    # A version stored whole (as before migration 0014), then a refresh commit that names only the
    # object it changed: the unchanged ones become pieces with their attributes (no lifecycle row
    # was indexed for them in this write), the changed one leaves its attributes to its new row.
    ids = {f"r{n}": f"id-{n}" for n in range(4)}
    first = _write(conn, _doc(1, ids))
    conn.execute("UPDATE state_versions SET raw_state = kl_version_document(id), head_piece = NULL, layout = NULL")
    conn.execute("DELETE FROM version_lists; DELETE FROM version_pieces")
    second = _doc(2, {**ids, "r2": "changed"})
    writes.commit_delta(conn, "prod", tfstate.parse_state(second), second, expect_serial=1, expect_lineage="l",
                        touched={("null_resource.r2", "")}, actor="test")
    assert one_row(conn, "SELECT count(*) FILTER (WHERE attributes_of IS NOT NULL), count(*) FROM version_pieces") == (1, 5)
    assert _pull(conn, "prod", 1) == tfstate.pretty_state(_doc(1, ids).decode())
    assert _pull(conn, "prod", 2) == tfstate.pretty_state(second.decode())
    assert first.version.serial == 1


def _rows_of(conn: psycopg.Connection, name: str) -> list[tuple[Any, ...]]:
    """A state's versions as stored, by piece body and list items rather than ids (which differ
    from state to state): what two ways of storing the same history must agree on."""
    return conn.execute(
        """SELECT v.serial, v.content_hash, v.head_serial, h.body, l.items IS NOT NULL,
                  (SELECT array_agg(p.body ORDER BY x.n) FROM unnest(l.items) WITH ORDINALITY x(item, n)
                   JOIN version_pieces p ON p.id = x.item)
           FROM state_versions v JOIN states s ON s.id = v.state_id
           LEFT JOIN version_pieces h ON h.id = v.head_piece LEFT JOIN version_lists l ON l.id = v.layout
           WHERE s.name = %s ORDER BY v.serial""", (name,)).fetchall()


