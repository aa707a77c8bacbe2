"""Reading a state's versions: their rows, their text, and a version read back a piece at a time
(`kl state pull`, the document a refresh starts from). Writing one is store/writes.py.

`current_version` (and `current_text`) is the one definition of a state's current version: the
Terraform version with the highest serial. Observations (what a refresh read, migration 0019) carry
their base's serial and are never current: Terraform neither reads them nor checks against them.
"""
from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.rows import class_row, dict_row

from kilolock import tfstate
from kilolock.errors import KlError
from kilolock.store import states


@dataclass(frozen=True)
class VersionRow:
    """A stored state version's metadata."""

    id: str
    serial: int
    lineage: str
    source: str
    content_hash: str
    terraform_version: str | None = None
    actor: str | None = None
    created_at: datetime | None = None
    encrypted: bool = False  # an OpenTofu-encrypted envelope, given back as it was written
    unindexed: str | None = None  # why kl has no index of this (encrypted) version; None: indexed
    kind: str = "terraform"  # or "observation": what a refresh read, based on base_version_id
    base_version_id: str | None = None
    observation_number: int | None = None  # 1, 2, ... per base
    seq: int = 0  # the order of both kinds
    confirms: bool = False  # an observation that found everything as its base has it (no document of its own)

    @property
    def label(self) -> str:
        """How kl names the version: v7, or v7.3 for the third observation based on v7."""
        return f"v{self.serial}" if self.observation_number is None else f"v{self.serial}.{self.observation_number}"


# A big document is hashed and sent to the server this many characters at a time.
UTF8_CHUNK = 1 << 20


def content_hash(raw: bytes | str) -> str:
    """Identity of a version's bytes (of a str: its UTF-8): a retried write of the very same bytes is
    not a new version."""
    if isinstance(raw, bytes):
        return hashlib.sha256(raw).hexdigest()
    digest = hashlib.sha256()
    for chunk in utf8_chunks(raw):
        digest.update(chunk)
    return digest.hexdigest()


def utf8_chunks(text: str) -> Iterator[bytes]:
    """TEXT as UTF-8, a slice at a time (never a second whole copy); UnicodeEncodeError for a lone
    surrogate, which UTF-8 cannot carry."""
    for start in range(0, len(text), UTF8_CHUNK):
        yield text[start:start + UTF8_CHUNK].encode("utf-8")


VERSION_COLS = ("id::text AS id, serial, lineage, source, content_hash, terraform_version, actor, created_at, encrypted, "
                "unindexed, kind, base_version_id::text AS base_version_id, observation_number, seq, "
                "(raw_state IS NULL AND head_piece IS NULL) AS confirms")

# The current version of a state is its Terraform version with the highest serial. This is the only place that says so:
# every query that needs a state's current version is built from it, as a subquery whose state id
# is a parameter, a correlated column (s.id in a LATERAL join) or a lookup by name.
_CURRENT_VERSION_OF = ("SELECT * FROM state_versions WHERE state_id = {state_id} AND kind = 'terraform' "
                       "ORDER BY serial DESC LIMIT 1")


def current_version_of(state_id_expr: sql.Composable) -> sql.Composed:
    """The current-version subquery for the state whose id is ``state_id_expr``."""
    return sql.SQL(_CURRENT_VERSION_OF).format(state_id=state_id_expr)


_CURRENT_VERSION = sql.SQL("SELECT {cols} FROM ({current}) v").format(
    cols=sql.SQL(VERSION_COLS), current=current_version_of(sql.Placeholder()))

# kl_version_text (migration 0014) rebuilds a version stored as pieces; an older one is its raw_state.
_CURRENT_TEXT = sql.SQL("SELECT {cols}, kl_version_text(v.id) AS text FROM ({current}) v").format(
    cols=sql.SQL(VERSION_COLS), current=current_version_of(sql.SQL("(SELECT id FROM states WHERE name = %s)")))

_FIND_VERSION = (f"SELECT {VERSION_COLS} FROM state_versions WHERE state_id = %s AND serial = %s AND content_hash = %s "
                 "AND kind = 'terraform'")
_LIST_VERSIONS = f"SELECT {VERSION_COLS} FROM state_versions WHERE state_id = %s ORDER BY seq"
_VERSION_TEXT = "SELECT kl_version_text(id) FROM state_versions WHERE state_id = %s AND serial = %s AND kind = 'terraform'"
_CONTENT_HASH = "SELECT content_hash FROM state_versions WHERE id = %s"
_TEXT_OF = "SELECT kl_version_text(%s)"
_TERRAFORM_VERSION_ID = "SELECT id::text FROM state_versions WHERE state_id = %s AND serial = %s AND kind = 'terraform'"
# An observation that stored no document has its base's (migration 0019).
_DOCUMENT_VERSION_ID = "SELECT kl_document_version(%s)::text"
_HAS_OPEN_RESOURCES = "SELECT EXISTS (SELECT 1 FROM resources WHERE state_id = %s AND delete_serial IS NULL)"
_OPEN_ATTRIBUTES = """
SELECT address, deposed, attributes::text AS attributes FROM resources
WHERE state_id = %s AND delete_serial IS NULL AND mode = 'managed'
"""


def version_rows(conn: psycopg.Connection) -> psycopg.Cursor[VersionRow]:
    return conn.cursor(row_factory=class_row(VersionRow))


def current_version(conn: psycopg.Connection, sid: str) -> VersionRow | None:
    return version_rows(conn).execute(_CURRENT_VERSION, (sid,)).fetchone()


def current_text(conn: psycopg.Connection, name: str) -> tuple[VersionRow, str] | None:
    """The current version of state NAME and its stored JSON text, in one query; None when there is
    no such state or it has no version yet."""
    row = conn.cursor(row_factory=dict_row).execute(_CURRENT_TEXT, (name,)).fetchone()
    if row is None:
        return None
    text = row.pop("text")
    return VersionRow(**row), str(text)


def find_version(conn: psycopg.Connection, sid: str, serial: int, hash_: str) -> VersionRow | None:
    """The version at SERIAL if it holds exactly the bytes hashed to HASH_ (did our write land?)."""
    return version_rows(conn).execute(_FIND_VERSION, (sid, serial, hash_)).fetchone()


def list_versions(conn: psycopg.Connection, name: str) -> list[VersionRow]:
    sid = states.state_id(conn, name)
    return version_rows(conn).execute(_LIST_VERSIONS, (sid,)).fetchall()


def raw_state_text(conn: psycopg.Connection, name: str, serial: int | None = None) -> str:
    if serial is None:
        found = current_text(conn, name)
        if found is None:
            states.state_id(conn, name)  # raises StateNotFound when that is why
            raise KlError(f"state {name!r} has no versions")
        return found[1]
    sid = states.state_id(conn, name)
    row = conn.execute(_VERSION_TEXT, (sid, serial)).fetchone()
    if row is None:
        raise KlError(f"state {name!r} has no version with serial {serial} (see `kl state versions {name}`)")
    return str(row[0])


# A version stored as pieces (migration 0014) is read a piece at a time; so is an older, whole one
# whose resources are all objects with an "instances" array (every version kl indexed). The rest
# (an encrypted envelope: given back exactly as stored) are read whole. CASE, not AND: SQL does not
# promise to test the type before jsonb_array_elements would fail on a non-array.
_PIECES_HEAD = """
SELECT v.id::text,
       CASE WHEN v.raw_state IS NULL
                THEN (h.body || CASE WHEN v.head_serial THEN jsonb_build_object('serial', v.serial) ELSE '{}'::jsonb END)::text
            WHEN jsonb_typeof(v.raw_state) = 'object' THEN (v.raw_state - 'resources')::text END,
       CASE WHEN v.raw_state IS NULL THEN v.layout IS NOT NULL ELSE v.raw_state ? 'resources' END,
       CASE WHEN v.raw_state IS NULL THEN cardinality(l.items)
            WHEN jsonb_typeof(v.raw_state -> 'resources') = 'array' THEN jsonb_array_length(v.raw_state -> 'resources') END,
       CASE WHEN v.raw_state IS NULL THEN true
            WHEN jsonb_typeof(v.raw_state -> 'resources') = 'array' THEN NOT EXISTS (
           SELECT 1 FROM jsonb_array_elements(v.raw_state -> 'resources') r(res)
           WHERE CASE WHEN jsonb_typeof(r.res) = 'object' THEN jsonb_typeof(r.res -> 'instances') IS DISTINCT FROM 'array'
                      ELSE true END) END,
       v.encrypted,
       v.layout
FROM state_versions v
LEFT JOIN version_pieces h ON h.id = v.head_piece
LEFT JOIN version_lists l ON l.id = v.layout
WHERE v.id = %s
"""

# One pass over the document (as lifecycles.py reads it), one row per instance in document order, the
# resource's own fields on its first row; a resource without instances is one row of NULLs.
_PIECES = """
SELECT r.ord, CASE WHEN i.ord IS NULL OR i.ord = 1 THEN (r.res - 'instances')::text END, r.n, i.ord, i.obj::text
FROM state_versions v
CROSS JOIN LATERAL (
    -- Once per resource (OFFSET 0 keeps the planner from inlining it): `res -> 'instances'` copies
    -- the array, which per instance row made a 100,000-instance resource quadratic.
    SELECT e.res, e.ord, e.res -> 'instances' AS instances, jsonb_array_length(e.res -> 'instances') AS n
    FROM jsonb_array_elements(v.raw_state -> 'resources') WITH ORDINALITY AS e(res, ord) OFFSET 0
) r
LEFT JOIN LATERAL jsonb_array_elements(r.instances) WITH ORDINALITY AS i(obj, ord) ON true
WHERE v.id = %s
"""

# The same rows from a version's pieces (the order kl_version_text assembles them in). Each
# lookup is a LATERAL subquery (OFFSET 0 keeps it apart): nested loops over the layout's order, so
# the rows come in document order without sorting the whole state. A layout item > 0 is a whole
# resource piece, < 0 a resource list (migration 0014).
_PIECES_FROM_LAYOUT = """
SELECT r.ord, CASE WHEN i.ord IS NULL OR i.ord = 1 THEN res.head::text END, res.n, i.ord, i.text
FROM version_lists l
CROSS JOIN LATERAL unnest(l.items) WITH ORDINALITY AS r(item, ord)
CROSS JOIN LATERAL (
    SELECT w.whole - 'instances' AS head, jsonb_array_length(w.whole -> 'instances') AS n, w.whole -> 'instances' AS inline,
           NULL::bigint[] AS ids
    FROM (SELECT kl_piece(x.body, a.attributes, x.attributes_of, true) AS whole
          FROM version_pieces x LEFT JOIN resources a ON a.id = x.attributes_of WHERE x.id = r.item OFFSET 0) w
    WHERE r.item > 0
    UNION ALL
    SELECT hp.body, cardinality(y.items) - 1, NULL::jsonb, y.items[2:]
    FROM version_lists y JOIN version_pieces hp ON hp.id = y.items[1]
    WHERE r.item < 0 AND y.id = -r.item
) res
LEFT JOIN LATERAL (
    SELECT e.ord, e.obj::text AS text FROM jsonb_array_elements(res.inline) WITH ORDINALITY AS e(obj, ord)
    UNION ALL
    SELECT u.ord, (SELECT kl_piece(ip.body, a.attributes, ip.attributes_of, false)::text
                   FROM version_pieces ip LEFT JOIN resources a ON a.id = ip.attributes_of WHERE ip.id = u.pid)
    FROM unnest(res.ids) WITH ORDINALITY AS u(pid, ord)
) i ON true
WHERE l.id = %s
"""


@contextlib.contextmanager
def _snapshot(conn: psycopg.Connection) -> Iterator[None]:
    """A read-only transaction of one snapshot (repeatable read), begun in one round trip: BEGIN
    with its characteristics, not BEGIN then SET TRANSACTION."""
    saved = conn.isolation_level, conn.read_only
    conn.isolation_level, conn.read_only = psycopg.IsolationLevel.REPEATABLE_READ, True
    try:
        with conn.transaction():
            yield
    finally:
        # A lost connection is in no state to set anything on (nor to begin another transaction with).
        if conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.isolation_level, conn.read_only = saved

def write_pulled(conn: psycopg.Connection, name: str, serial: int | None, write: Callable[[str], object], *,
                 version_id: str | None = None) -> None:
    """Write version SERIAL of state NAME (default: the current one; VERSION_ID: that version,
    an observation too) as `kl state pull` gives it (tfstate.pretty_state of its text, byte for
    byte), streamed: the rows of one snapshot, one instance at a time, so a big state is never
    held whole."""
    with _snapshot(conn):
        vid = _document_id(conn, name, serial, version_id)
        row = conn.execute(_PIECES_HEAD, (vid,)).fetchone()
        assert row is not None  # _document_id found it
        _, head, has_resources, count, streamable, encrypted, layout = row
        if encrypted:
            text = _text_of(conn, vid)
            written = conn.execute(_CONTENT_HASH, (vid,)).fetchone()
            # As OpenTofu wrote it when its layout gives those bytes back (jsonb keeps neither the
            # key order nor the spacing), else as stored.
            exact = tfstate.envelope_as_written(text, written[0]) if written else None
            write(exact if exact is not None else tfstate.pretty_state(text))
            return
        if head is None or (has_resources and not streamable):
            write(tfstate.pretty_state(_text_of(conn, vid)))
            return
        with _piece_rows(conn, vid, layout) as rows:
            tfstate.write_terraform_streamed(head, (count, _resources(rows)) if has_resources else None, write)


def _document_id(conn: psycopg.Connection, name: str, serial: int | None, version_id: str | None) -> str:
    """The id of the version whose stored document is that of SERIAL (None: the current version) or
    of the version VERSION_ID of state NAME."""
    if version_id is not None:
        row = conn.execute(_DOCUMENT_VERSION_ID, (version_id,)).fetchone()
        if row is None or row[0] is None:
            raise KlError(f"state {name!r} has no version {version_id}")
        return str(row[0])
    sid = states.state_id(conn, name)
    if serial is None:
        cur = current_version(conn, sid)
        if cur is None:
            raise KlError(f"state {name!r} has no versions")
        return cur.id
    row = conn.execute(_TERRAFORM_VERSION_ID, (sid, serial)).fetchone()
    if row is None:
        raise KlError(f"state {name!r} has no version with serial {serial} (see `kl state versions {name}`)")
    return str(row[0])


def _text_of(conn: psycopg.Connection, vid: str) -> str:
    row = conn.execute(_TEXT_OF, (vid,)).fetchone()
    assert row is not None
    return str(row[0])


@contextlib.contextmanager
def _piece_rows(conn: psycopg.Connection, vid: str, layout: str | None) -> Iterator[Iterator[tuple[Any, ...]]]:
    """The _PIECES rows of version VID (through its LAYOUT when it has one), from a server-side
    cursor fetched a few thousand rows at a time: row by row (single-row mode), a loaded machine
    spent most of a pull handing the CPU between kl and the server."""
    with conn.cursor(name="kl_pieces") as rows:
        rows.itersize = 2000
        if layout is not None:
            rows.execute(_PIECES_FROM_LAYOUT, (layout,))
        else:
            rows.execute(_PIECES, (vid,))
        yield iter(rows)


def load_document(conn: psycopg.Connection, name: str, serial: int | None, loads: Callable[[str], Any], *,
                  version_id: str | None = None, terraform_version_id: str | None = None) -> Any:
    """Version SERIAL of state NAME (or the version VERSION_ID, an observation too, or
    TERRAFORM_VERSION_ID, one of Terraform's, which hold their own documents) parsed with
    LOADS: the very value LOADS makes of its stored text (keys in jsonb's order), but read a piece at
    a time, as the pull reads it, so neither the server builds nor this process holds the whole
    text next to the parsed document (a refresh of 100,000 instances spent more time on that text
    than on parsing it)."""
    with _snapshot(conn):
        vid = terraform_version_id or _document_id(conn, name, serial, version_id)
        row = conn.execute(_PIECES_HEAD, (vid,)).fetchone()
        assert row is not None  # _document_id found it, or the caller read its row
        _, head, has_resources, _count, streamable, encrypted, layout = row
        if encrypted or head is None or (has_resources and not streamable):
            return loads(_text_of(conn, vid))
        doc = loads(head)
        if not has_resources:
            return doc
        resources: list[Any] = []
        with _piece_rows(conn, vid, layout) as rows:
            for res_head, _n, instances in _resources(rows):
                resources.append(_with_key(loads(res_head), "instances", _load_batched(instances, loads)))
        return _with_key(doc, "resources", resources)


_LOAD_BATCH = 1000


def _load_batched(texts: Iterator[str], loads: Callable[[str], Any]) -> list[Any]:
    """The JSON TEXTS parsed, a batch of them as one array: the parser shares the key strings
    within one call only, and each instance's own copies of its keys were a third of a big
    document's memory (and a call per instance its time)."""
    out: list[Any] = []
    batch: list[str] = []
    for text in texts:
        batch.append(text)
        if len(batch) == _LOAD_BATCH:
            out.extend(loads("[" + ",".join(batch) + "]"))
            batch.clear()
    if batch:
        out.extend(loads("[" + ",".join(batch) + "]"))
    return out


def _jsonb_key_order(key: str) -> tuple[int, bytes]:
    encoded = key.encode("utf-8", "surrogatepass")
    return len(encoded), encoded


def _with_key(obj: Any, key: str, value: Any) -> Any:
    """OBJ (parsed from jsonb text, so its keys in jsonb's order: shorter first, then bytewise)
    with KEY, which it lacks, put where jsonb's text of the whole would have it."""
    if not isinstance(obj, dict):
        raise KlError("stored state: a piece of it is not a JSON object")
    rank = _jsonb_key_order(key)
    out: dict[str, Any] = {}
    for k, v in obj.items():
        if key not in out and _jsonb_key_order(k) > rank:
            out[key] = value
        out[k] = v
    out.setdefault(key, value)
    return out


def _resources(rows: Iterator[tuple[Any, ...]]) -> Iterator[tfstate.StreamedResource]:
    """The resources of _PIECES rows, each with an iterator of its instances' texts, which must be
    consumed before the next resource is asked for (write_terraform_streamed does)."""
    pending = next(rows, None)
    expected_ri = 1
    while pending is not None:
        ri, head, count, ii, _ = pending
        if ri != expected_ri or head is None:
            raise KlError("stored state: its resources came back out of order")  # a guard: the rows carry their positions

        def instances(first: tuple[Any, ...], ri: int = ri) -> Iterator[str]:
            nonlocal pending
            row: tuple[Any, ...] | None = first
            expected_ii = 1
            while row is not None and row[0] == ri and row[3] is not None:
                if row[3] != expected_ii:
                    raise KlError("stored state: its instances came back out of order")
                yield row[4]
                expected_ii += 1
                row = next(rows, None)
            pending = row

        if ii is None:  # no instances: this row is the whole resource
            pending = next(rows, None)
            yield head, 0, iter(())
        else:
            yield head, count, instances(pending)
        expected_ri += 1


def has_open_resources(conn: psycopg.Connection, sid: str) -> bool:
    """Whether the current version has any resource instance kl indexed (none when encrypted)."""
    row = conn.execute(_HAS_OPEN_RESOURCES, (sid,)).fetchone()
    return bool(row and row[0])


_OPEN_ATTRIBUTES_BATCH = 2000


def open_attributes(conn: psycopg.Connection, sid: str, expected: int | None = None) -> dict[tuple[str, str], bytes]:
    """Attributes JSON of each managed object in the current version, by (address, deposed key).
    EXPECTED: about how many there are, when the caller knows (the instances of the loaded version).

    The open lifecycle rows hold exactly the current version's objects (written in the same
    transaction), and PostgreSQL renders their JSON far faster than Python re-serialises it.
    """
    out: dict[tuple[str, str], bytes] = {}
    if expected is not None and expected < _OPEN_ATTRIBUTES_BATCH:
        # What fits in one batch is one statement: a cursor costs four round trips more (begin,
        # declare, close, commit), a quarter of a small refresh's statements before its reads.
        for address, deposed, attributes in conn.execute(_OPEN_ATTRIBUTES, (sid,)):
            if attributes is not None:
                out[(address, deposed)] = attributes.encode()
        return out
    # A few thousand rows at a time, not fetchall(): the rows of a 100,000-instance state, held at
    # once next to the bytes made from them, were a second full copy of its attributes; nor one at a
    # time (stream()), which spent more on each row's round of libpq calls than on its data.
    with conn.transaction(), conn.cursor(name="kl_open_attributes") as rows:
        rows.itersize = _OPEN_ATTRIBUTES_BATCH
        rows.execute(_OPEN_ATTRIBUTES, (sid,))
        for address, deposed, attributes in rows:
            if attributes is not None:
                out[(address, deposed)] = attributes.encode()
    return out

