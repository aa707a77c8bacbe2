"""States, their versions, and the lifecycle index written with each version.

`write_version` is the one path by which a version enters the database (import, the HTTP
backend's apply writes, OpenTofu-encrypted envelopes, refresh commits): the version row and its
lifecycle rows and the drift records it finds or resolves (store/drift_records.py) in one
transaction, with the serial and lineage rules checked under a row lock on the state.
`current_version` (and `current_text`) is the one definition of a state's current version: the
one with the highest serial.
"""
from __future__ import annotations

import codecs
import contextlib
import hashlib
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql
from psycopg.adapt import Dumper
from psycopg.rows import class_row, dict_row

from kilolock import tfstate
from kilolock.errors import KlError
from kilolock.store import drift_records

log = logging.getLogger("kilolock.store.versions")

SOURCES = ("import", "apply", "refresh")


class StateNotFound(KlError):
    def __init__(self, name: str) -> None:
        super().__init__(f"no state named {name!r} (see `kl state list`)")
        self.name = name

    def suggesting(self, close: str | None) -> str:
        """The message, naming CLOSE (closest_name) when there is one."""
        return f"no state named {self.name!r}; did you mean {close!r}? (see `kl state list`)" if close else str(self)


class VersionConflict(KlError):
    """A write that would overwrite or fork history (serial not advancing, foreign lineage)."""


class SerialBehind(VersionConflict):
    """A write whose serial does not advance the state's: the writer's copy is behind what kl holds.

    ``newer`` are the versions kl holds from the writer's serial on (oldest first, a few at most):
    what was written since, and by what (a refresh, most often, when an old Terraform file is
    imported again). ``known`` is the serial of the version kl holds with the same content, when
    the writer's copy is one kl already has."""

    def __init__(self, name: str, held: VersionRow, new_serial: int, newer: list[VersionRow], known: int | None) -> None:
        super().__init__(
            f"state {name!r} is at serial {held.serial}; the new state has serial {new_serial}, which does not advance it "
            "(a write must have a higher serial unless it is byte-identical to the current version)"
        )
        self.name, self.held, self.new_serial, self.newer, self.known = name, held, new_serial, newer, known


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
    encrypted: bool = False  # an OpenTofu-encrypted envelope: no resources kl can see


@dataclass(frozen=True)
class WriteResult:
    """What writing a state version did."""

    state_id: str
    version: VersionRow
    created: bool  # False: an idempotent retry of the current version, nothing written
    opened: int = 0
    closed: int = 0
    unchanged: int = 0  # lifecycles kept, including those whose metadata alone was updated
    metadata_updated: int = 0  # open rows whose marks, provider address, schema version or flatmap form changed in place


class _JsonbText:
    """A version's bytes, sent to PostgreSQL as jsonb text exactly as they are: a str parameter
    would cost two more full copies of a big state (the decoded str, then psycopg's encoding)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _JsonbTextDumper(Dumper):
    oid = psycopg.adapters.types["jsonb"].oid

    def dump(self, obj: _JsonbText) -> bytes:
        # libpq sends a text parameter as a C string: a NUL byte would cut the document short.
        # psycopg refuses one in a str the same way.
        if b"\x00" in obj.data:
            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return obj.data


_UTF8_CHUNK = 1 << 20


def _is_utf8(raw: bytes) -> bool:
    """Whether RAW is UTF-8, checked a chunk at a time (no decoded copy of the whole document)."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(raw)
    try:
        for start in range(0, len(view), _UTF8_CHUNK):
            decoder.decode(view[start:start + _UTF8_CHUNK])
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        return False
    return True


def content_hash(raw: bytes | str) -> str:
    """Identity of a version's bytes (of a str: its UTF-8): a retried write of the very same bytes is
    not a new version."""
    if isinstance(raw, bytes):
        return hashlib.sha256(raw).hexdigest()
    digest = hashlib.sha256()
    for chunk in _utf8_chunks(raw):
        digest.update(chunk)
    return digest.hexdigest()


def _utf8_chunks(text: str) -> Iterator[bytes]:
    """TEXT as UTF-8, a slice at a time (never a second whole copy); UnicodeEncodeError for a lone
    surrogate, which UTF-8 cannot carry."""
    for start in range(0, len(text), _UTF8_CHUNK):
        yield text[start:start + _UTF8_CHUNK].encode("utf-8")


# COPY's text format: a backslash starts an escape, and a newline, carriage return or tab would
# end the row or the field. JSON text holds the last three only escaped, but a caller's need not.
_COPY_ESCAPES = ((b"\\", b"\\\\"), (b"\n", b"\\n"), (b"\r", b"\\r"), (b"\t", b"\\t"))


def _copy_text(chunk: bytes) -> bytes:
    for plain, escaped in _COPY_ESCAPES:
        if plain in chunk:
            chunk = chunk.replace(plain, escaped)
    return chunk


# --- states ------------------------------------------------------------------------------------

_STATE_ID = "SELECT id::text FROM states WHERE name = %s"
_ENSURE_STATE = "INSERT INTO states (name) VALUES (%s) ON CONFLICT (name) DO NOTHING"
_LOCK_STATE_ROW = "SELECT id::text FROM states WHERE name = %s FOR UPDATE"
_DELETE_STATE = "DELETE FROM states WHERE id = %s"


def state_id(conn: psycopg.Connection, name: str) -> str:
    row = conn.execute(_STATE_ID, (name,)).fetchone()
    if row is None:
        raise StateNotFound(name)
    return str(row[0])


def closest_name(conn: psycopg.Connection, name: str) -> str | None:
    """The stored state name most like NAME, if one is close enough to be a typo of it."""
    import difflib

    names = [r[0] for r in conn.execute("SELECT name FROM states")]
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
    return close[0] if close else None


def no_state_matches(conn: psycopg.Connection, glob: str) -> str:
    """That GLOB (``--states``) matches no state, in one line, naming the stored name closest to it
    when one is close: a glob without wildcards is most often a mistyped name."""
    close = closest_name(conn, glob)
    return f"no state matches {glob!r}" + (f"; did you mean {close!r}?" if close else "") + " (see `kl state list`)"


def lock_state_row(conn: psycopg.Connection, name: str, *, create: bool) -> str | None:
    """Lock the ``states`` row of NAME (created first when ``create``) for the rest of the caller's
    transaction, and return its id; None when there is no such state. Every write and lock change
    on a state is serialised on this row lock."""
    if create:
        conn.execute(_ENSURE_STATE, (name,))
    row = conn.execute(_LOCK_STATE_ROW, (name,)).fetchone()
    return str(row[0]) if row else None


def delete_state(conn: psycopg.Connection, sid: str) -> None:
    """The state, its versions, lifecycles, lock and runs (all cascade from the states row)."""
    conn.execute(_DELETE_STATE, (sid,))


# --- reads -------------------------------------------------------------------------------------

_VERSION_COLS = "id::text AS id, serial, lineage, source, content_hash, terraform_version, actor, created_at, encrypted"

# The current version of a state is its highest serial. This is the only place that says so:
# every query that needs a state's current version is built from it, as a subquery whose state id
# is a parameter, a correlated column (s.id in a LATERAL join) or a lookup by name.
_CURRENT_VERSION_OF = "SELECT * FROM state_versions WHERE state_id = {state_id} ORDER BY serial DESC LIMIT 1"


def current_version_of(state_id_expr: sql.Composable) -> sql.Composed:
    """The current-version subquery for the state whose id is ``state_id_expr``."""
    return sql.SQL(_CURRENT_VERSION_OF).format(state_id=state_id_expr)


_CURRENT_VERSION = sql.SQL("SELECT {cols} FROM ({current}) v").format(
    cols=sql.SQL(_VERSION_COLS), current=current_version_of(sql.Placeholder()))

# kl_version_text (migration 0014) rebuilds a version stored as pieces; an older one is its raw_state.
_CURRENT_TEXT = sql.SQL("SELECT {cols}, kl_version_text(v.id) AS text FROM ({current}) v").format(
    cols=sql.SQL(_VERSION_COLS), current=current_version_of(sql.SQL("(SELECT id FROM states WHERE name = %s)")))

_FIND_VERSION = f"SELECT {_VERSION_COLS} FROM state_versions WHERE state_id = %s AND serial = %s AND content_hash = %s"
_LIST_VERSIONS = f"SELECT {_VERSION_COLS} FROM state_versions WHERE state_id = %s ORDER BY serial"
_VERSION_TEXT = "SELECT kl_version_text(id) FROM state_versions WHERE state_id = %s AND serial = %s"
_CONTENT_HASH = "SELECT content_hash FROM state_versions WHERE id = %s"
_HAS_OPEN_RESOURCES = "SELECT EXISTS (SELECT 1 FROM resources WHERE state_id = %s AND delete_serial IS NULL)"
_OPEN_ATTRIBUTES = """
SELECT address, deposed, attributes::text AS attributes FROM resources
WHERE state_id = %s AND delete_serial IS NULL AND mode = 'managed'
"""


def _versions(conn: psycopg.Connection) -> psycopg.Cursor[VersionRow]:
    return conn.cursor(row_factory=class_row(VersionRow))


def current_version(conn: psycopg.Connection, sid: str) -> VersionRow | None:
    return _versions(conn).execute(_CURRENT_VERSION, (sid,)).fetchone()


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
    return _versions(conn).execute(_FIND_VERSION, (sid, serial, hash_)).fetchone()


def list_versions(conn: psycopg.Connection, name: str) -> list[VersionRow]:
    sid = state_id(conn, name)
    return _versions(conn).execute(_LIST_VERSIONS, (sid,)).fetchall()


def raw_state_text(conn: psycopg.Connection, name: str, serial: int | None = None) -> str:
    if serial is None:
        found = current_text(conn, name)
        if found is None:
            state_id(conn, name)  # raises StateNotFound when that is why
            raise KlError(f"state {name!r} has no versions")
        return found[1]
    sid = state_id(conn, name)
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
WHERE v.state_id = %s AND v.serial = %s
"""

# One pass over the document (as _INCOMING_TABLE), one row per instance in document order, the
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


def write_pulled(conn: psycopg.Connection, name: str, serial: int | None, write: Callable[[str], object]) -> None:
    """Write version SERIAL of state NAME (default: the current one) as `kl state pull` gives it
    (tfstate.pretty_state of its text, byte for byte), streamed: the rows of one snapshot, one
    instance at a time, so a big state is never held whole."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        if serial is None:
            cur = current_version(conn, state_id(conn, name))
            if cur is None:
                raise KlError(f"state {name!r} has no versions")
            serial = cur.serial
        row = conn.execute(_PIECES_HEAD, (state_id(conn, name), serial)).fetchone()
        if row is None:
            raise KlError(f"state {name!r} has no version with serial {serial} (see `kl state versions {name}`)")
        vid, head, has_resources, count, streamable, encrypted, layout = row
        if encrypted:
            text = raw_state_text(conn, name, serial)
            written = conn.execute(_CONTENT_HASH, (vid,)).fetchone()
            # As OpenTofu wrote it when its layout gives those bytes back (jsonb keeps neither the
            # key order nor the spacing), else as stored.
            exact = tfstate.envelope_as_written(text, written[0]) if written else None
            write(exact if exact is not None else tfstate.pretty_state(text))
            return
        if head is None or (has_resources and not streamable):
            write(tfstate.pretty_state(raw_state_text(conn, name, serial)))
            return
        with _piece_rows(conn, vid, layout) as rows:
            tfstate.write_terraform_streamed(head, (count, _resources(rows)) if has_resources else None, write)


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


def load_document(conn: psycopg.Connection, name: str, serial: int, loads: Callable[[str], Any]) -> Any:
    """Version SERIAL of state NAME parsed with LOADS: the very value LOADS makes of its
    raw_state_text (keys in jsonb's order), but read a piece at a time, as the pull reads it, so
    neither the server builds nor this process holds the whole text next to the parsed document
    (a refresh of 100,000 instances spent more time on that text than on parsing it)."""
    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        row = conn.execute(_PIECES_HEAD, (state_id(conn, name), serial)).fetchone()
        if row is None:
            raise KlError(f"state {name!r} has no version with serial {serial} (see `kl state versions {name}`)")
        vid, head, has_resources, _count, streamable, encrypted, layout = row
        if encrypted or head is None or (has_resources and not streamable):
            return loads(raw_state_text(conn, name, serial))
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


def open_attributes(conn: psycopg.Connection, sid: str) -> dict[tuple[str, str], bytes]:
    """Attributes JSON of each managed object in the current version, by (address, deposed key).

    The open lifecycle rows hold exactly the current version's objects (written in the same
    transaction), and PostgreSQL renders their JSON far faster than Python re-serialises it.
    """
    # A few thousand rows at a time, not fetchall(): the rows of a 100,000-instance state, held at
    # once next to the bytes made from them, were a second full copy of its attributes; nor one at a
    # time (stream()), which spent more on each row's round of libpq calls than on its data.
    out: dict[tuple[str, str], bytes] = {}
    with conn.transaction(), conn.cursor(name="kl_open_attributes") as rows:
        rows.itersize = 2000
        rows.execute(_OPEN_ATTRIBUTES, (sid,))
        for address, deposed, attributes in rows:
            if attributes is not None:
                out[(address, deposed)] = attributes.encode()
    return out


# --- the write path ----------------------------------------------------------------------------

_DESCRIPTORS_TABLE = """
CREATE TEMP TABLE kl_descriptors (
    address text, deposed text, mode text, type text, name text, module text,
    index_key jsonb, provider text, ri int, ii int
) ON COMMIT DROP
"""

# The objects come from the document as PostgreSQL parsed it (kl_doc, or its pieces in kl_parts),
# so attributes are stored exactly as it did (no re-serialisation in Python). One pass over the
# document: a per-row `doc -> 'resources' -> ri` would de-TOAST the whole state once per instance.
# The content hash is the lifecycle's identity: the remote object in one shape (status,
# attributes, identity). Metadata (sensitivity marks, the provider address, the schema version)
# is kept on the open row and updated in place (_UPDATE_METADATA); private, dependencies and
# create_before_destroy are bookkeeping. Migration 0007 computes the same hash for older rows:
# change one, change both (in a new migration). An object in the legacy flatmap form (no
# `attributes`, only `attributes_flat`: its row's attributes are NULL) hashes its flatmap too;
# no row before that form was accepted has one, so older hashes are unchanged.
_INCOMING_TABLE = """
CREATE TEMP TABLE kl_incoming ON COMMIT DROP AS
SELECT d.address, d.deposed, d.mode, d.type, d.name, d.module, d.index_key, d.provider, o.obj,
       COALESCE((o.obj ->> 'schema_version')::bigint, 0) AS schema_version,
       COALESCE(o.obj -> 'sensitive_attributes', '[]'::jsonb) AS sensitive_attributes,
       encode(sha256(convert_to((jsonb_build_array(o.obj -> 'status', o.obj -> 'attributes', o.obj -> 'identity')
           || CASE WHEN o.obj ? 'attributes' OR NOT o.obj ? 'attributes_flat' THEN '[]'::jsonb
                   ELSE jsonb_build_array(o.obj -> 'attributes_flat') END)::text, 'UTF8')), 'hex') AS content_hash,
       CASE WHEN o.obj ? 'identity' THEN
       encode(sha256(convert_to((jsonb_build_array(o.obj -> 'status', o.obj -> 'attributes', NULL::jsonb)
           || CASE WHEN o.obj ? 'attributes' OR NOT o.obj ? 'attributes_flat' THEN '[]'::jsonb
                   ELSE jsonb_build_array(o.obj -> 'attributes_flat') END)::text, 'UTF8')), 'hex') END AS hash_without_identity
FROM kl_descriptors d
JOIN ({objects}) o ON o.ri = d.ri AND o.ii = d.ii
"""

_OBJECTS_OF_DOC = """
SELECT (r.ord - 1)::int AS ri, (inst.ord - 1)::int AS ii, inst.obj
FROM kl_doc v,
     jsonb_array_elements(v.doc -> 'resources') WITH ORDINALITY AS r(res, ord),
     jsonb_array_elements(r.res -> 'instances') WITH ORDINALITY AS inst(obj, ord)
"""

_OBJECTS_OF_PARTS = """
SELECT (ri - 1)::int AS ri, (ii - 1)::int AS ii, body AS obj FROM kl_parts WHERE kind = 'i'
UNION ALL
SELECT (ri - 1)::int, 0, body -> 'instances' -> 0 FROM kl_parts WHERE kind = 'r' AND jsonb_array_length(body -> 'instances') = 1
"""

_SCOPE_TABLE = "CREATE TEMP TABLE kl_scope (address text, deposed text) ON COMMIT DROP"

# An object stored as a flatmap (its row's attributes NULL) that comes back as an object, in the
# same status, is the same object in the form providers upgrade it to (UpgradeResourceState):
# it keeps its lifecycle, which takes that first structured form as its content (_RESHAPE).
_RESHAPED = """
r.attributes IS NULL AND i.obj -> 'attributes' IS NOT NULL AND to_jsonb(r.status) IS NOT DISTINCT FROM i.obj -> 'status'
"""

# An identity where the open row had none (the first refresh by Terraform >= 1.12 or kl of an object
# written before identities) names the same remote object: it keeps its lifecycle, whose hash now
# includes the identity (_IDENTITY_ADDED), and is not drift.
_IDENTITY_FIRST = "i.hash_without_identity = r.content_hash"

# An open row no incoming object continues (same content, only reshaped, or only given its first
# identity): the object is gone or changed, so its lifecycle closes.
_NOT_INCOMING_AS_IS = f"""NOT EXISTS (
      SELECT 1 FROM kl_incoming i
      WHERE i.address = r.address AND i.deposed = r.deposed
        AND (i.content_hash = r.content_hash OR ({_RESHAPED}) OR {_IDENTITY_FIRST})
  )"""

_CLOSE_GONE_OR_CHANGED = f"""
UPDATE resources r
SET delete_serial = %(serial)s, closed_by_version_id = %(vid)s
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL
  AND {_NOT_INCOMING_AS_IS}
"""

# A scoped write (touched given) closes among its touched objects only, found from them: testing
# every open row of the state against the scope cost a second at 100,000 instances, for none.
_CLOSE_GONE_OR_CHANGED_SCOPED = f"""
UPDATE resources r
SET delete_serial = %(serial)s, closed_by_version_id = %(vid)s
FROM kl_scope s
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = s.address AND r.deposed = s.deposed
  AND {_NOT_INCOMING_AS_IS}
"""

_RESHAPE = f"""
UPDATE resources r
SET attributes = i.obj -> 'attributes', content_hash = i.content_hash, provider = i.provider,
    schema_version = i.schema_version, sensitive_attributes = i.sensitive_attributes
FROM kl_incoming i
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
  AND {_RESHAPED}
"""

_IDENTITY_ADDED = f"""
UPDATE resources r SET content_hash = i.content_hash
FROM kl_incoming i
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
  AND {_IDENTITY_FIRST}
"""

# Same object, new metadata: the open row follows it, one statement, no new lifecycle.
_UPDATE_METADATA = """
UPDATE resources r
SET provider = i.provider, schema_version = i.schema_version, sensitive_attributes = i.sensitive_attributes
FROM kl_incoming i
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
  AND r.content_hash = i.content_hash
  AND (r.provider, r.schema_version, r.sensitive_attributes) IS DISTINCT FROM (i.provider, i.schema_version, i.sensitive_attributes)
"""

_OPEN_NEW_OR_CHANGED = """
INSERT INTO resources (
    state_id, address, deposed, mode, type, name, module, index_key, provider, schema_version,
    status, attributes, sensitive_attributes, content_hash, create_serial, opened_by_version_id
)
SELECT %(sid)s, i.address, i.deposed, i.mode, i.type, i.name, i.module, i.index_key, i.provider,
       i.schema_version, i.obj ->> 'status', i.obj -> 'attributes',
       i.sensitive_attributes, i.content_hash, %(serial)s, %(vid)s
FROM kl_incoming i
WHERE NOT EXISTS (
    SELECT 1 FROM resources r
    WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
)
"""


_INSERT_VERSION = f"""
INSERT INTO state_versions (state_id, serial, lineage, terraform_version, source, raw_state, content_hash, actor, encrypted)
VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s, %s) RETURNING {_VERSION_COLS}
"""

# --- a version as pieces (migration 0014) -------------------------------------------------------
# The document goes to a temporary table (no WAL, dropped at commit) and is split there; only the
# pieces its state does not hold yet are stored.

# Uncompressed (STORAGE EXTERNAL): the document lives for one transaction, and every statement
# that looks into it reads it whole again; compressing a big one, then decompressing it once per
# statement, cost more than the space it saved. work_mem for this transaction only: sorting and
# hashing a big state's pieces spilled to disk at the default 4 MB.
# JIT off for the write: the planner, blind to what the temporary tables hold, puts the
# statements over them far above jit_above_cost, and compiling them took 35-70 ms of a 10-instance
# refresh commit (on a server with JIT, as Debian's and most builds are) for queries that run in
# well under a millisecond. SET LOCAL: both end with the transaction (a transaction pooler is fine).
_DOC_TABLE = """
SET LOCAL jit = off;
CREATE TEMP TABLE kl_doc (doc jsonb) ON COMMIT DROP;
ALTER TABLE kl_doc ALTER COLUMN doc SET STORAGE EXTERNAL;
SET LOCAL work_mem = '64MB'
"""
_DOC_INSERT = "INSERT INTO kl_doc VALUES (%s::jsonb)"

# What the pieces can rebuild: an object whose resources (if any) are all objects with an
# "instances" array. Anything else is stored whole. Also the document's serial, as text.
# (write_version is given the document parsed and validated by tfstate.parse_state, which holds it
# to that shape; the check stays as the rule the pieces depend on, and is one pass over the
# resources, not their instances.)
_DOC_SHAPE = """
SELECT jsonb_typeof(doc) = 'object' AND CASE
           WHEN NOT doc ? 'resources' THEN true
           WHEN jsonb_typeof(doc -> 'resources') <> 'array' THEN false
           ELSE NOT EXISTS (
               SELECT 1 FROM jsonb_array_elements(doc -> 'resources') r(res)
               WHERE CASE WHEN jsonb_typeof(r.res) = 'object' THEN jsonb_typeof(r.res -> 'instances') IS DISTINCT FROM 'array'
                          ELSE true END) END,
       CASE WHEN jsonb_typeof(doc) = 'object' THEN (doc -> 'serial')::text END,
       CASE WHEN jsonb_typeof(doc) = 'object' THEN doc ? 'resources' END
FROM kl_doc
"""

# Every piece of the document with its place and kind (see migration 0014): (0, 0) the top level
# 'd'; (ri, 0) resource ri, whole ('r', at most one instance) or its own fields ('h'); (ri, ii) its
# instance ii ('i'); ri and ii from 1. The hash covers the kind and the whole text.
_PARTS_TABLE = """
CREATE TEMP TABLE kl_parts ON COMMIT DROP AS
WITH res AS (
    SELECT e.res, e.ord AS ri, jsonb_array_length(e.res -> 'instances') AS n
    FROM kl_doc, jsonb_array_elements(kl_doc.doc -> 'resources') WITH ORDINALITY AS e(res, ord)
    OFFSET 0
), parts AS (
    SELECT 0::bigint AS ri, 0::bigint AS ii, 'd' AS kind,
           CASE WHEN %(strip_serial)s THEN doc - 'resources' - 'serial' ELSE doc - 'resources' END AS body
    FROM kl_doc
    UNION ALL
    SELECT ri, 0, CASE WHEN n <= 1 THEN 'r' ELSE 'h' END, CASE WHEN n <= 1 THEN res ELSE res - 'instances' END FROM res
    UNION ALL
    SELECT res.ri, i.ord, 'i', i.obj
    FROM res CROSS JOIN LATERAL jsonb_array_elements(res.res -> 'instances') WITH ORDINALITY AS i(obj, ord)
    WHERE res.n > 1
)
SELECT ri, ii, kind, body, sha256(convert_to(kind || body::text, 'UTF8')) AS hash FROM parts
"""

# Only what the state lacks, each once, in hash order (writes of one state are serialised on its
# row lock, and pieces of different states never share a row: ON CONFLICT is a safety net). An
# instance whose attributes its open lifecycle row holds (same text: just indexed from this very
# document) leaves them to that row. Run after the lifecycle index, while kl_descriptors lists
# the indexed instances (a refresh commit's touched ones; the others are unchanged, so their
# pieces are held already, unless the version before was stored whole: those keep their attributes).
_STORE_PIECES = """
INSERT INTO version_pieces (state_id, hash, body, attributes_of)
SELECT DISTINCT ON (k.hash) %(sid)s, k.hash,
       CASE WHEN r.id IS NULL THEN k.body
            WHEN k.kind = 'i' THEN k.body - 'attributes'
            ELSE jsonb_set(k.body, '{instances,0}', (k.body -> 'instances' -> 0) - 'attributes') END,
       r.id
FROM kl_parts k
LEFT JOIN kl_descriptors d
       ON k.kind IN ('i', 'r') AND d.ri = k.ri - 1 AND d.ii = CASE WHEN k.kind = 'i' THEN k.ii - 1 ELSE 0 END
LEFT JOIN resources r
       ON r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = d.address AND r.deposed = d.deposed
      AND r.attributes IS NOT NULL
      AND r.attributes::text = (CASE WHEN k.kind = 'i' THEN k.body -> 'attributes' ELSE k.body -> 'instances' -> 0 -> 'attributes' END)::text
WHERE NOT EXISTS (SELECT 1 FROM version_pieces p WHERE p.state_id = %(sid)s AND p.hash = k.hash)
ORDER BY k.hash
ON CONFLICT (state_id, hash) DO NOTHING
"""

_RESOURCE_LISTS_TABLE = """
CREATE TEMP TABLE kl_resource_lists ON COMMIT DROP AS
SELECT ri, items, sha256(convert_to('r' || items::text, 'UTF8')) AS hash FROM (
    SELECT k.ri, array_agg(p.id ORDER BY k.ii) AS items
    FROM kl_parts k JOIN version_pieces p ON p.state_id = %(sid)s AND p.hash = k.hash
    WHERE k.kind IN ('h', 'i')
    GROUP BY k.ri
) x
"""

_STORE_RESOURCE_LISTS = """
INSERT INTO version_lists (state_id, hash, items)
SELECT DISTINCT ON (k.hash) %(sid)s, k.hash, k.items FROM kl_resource_lists k
WHERE NOT EXISTS (SELECT 1 FROM version_lists l WHERE l.state_id = %(sid)s AND l.hash = k.hash)
ORDER BY k.hash
ON CONFLICT (state_id, hash) DO NOTHING
"""

_LAYOUT_ITEMS = """
SELECT COALESCE(array_agg(x.item ORDER BY x.ri), '{}'::bigint[]) FROM (
    SELECT k.ri, p.id AS item FROM kl_parts k JOIN version_pieces p ON p.state_id = %(sid)s AND p.hash = k.hash
    WHERE k.kind = 'r'
    UNION ALL
    SELECT k.ri, -l.id FROM kl_resource_lists k JOIN version_lists l ON l.state_id = %(sid)s AND l.hash = k.hash
) x
"""

_STORE_LIST = """
INSERT INTO version_lists (state_id, hash, items) VALUES (%(sid)s, sha256(convert_to('l' || %(items)s::bigint[]::text, 'UTF8')), %(items)s)
ON CONFLICT (state_id, hash) DO NOTHING
"""
_FIND_LIST = "SELECT id FROM version_lists WHERE state_id = %(sid)s AND hash = sha256(convert_to('l' || %(items)s::bigint[]::text, 'UTF8'))"

_STORE_HEAD = """
INSERT INTO version_pieces (state_id, hash, body) SELECT %(sid)s, hash, body FROM kl_parts WHERE kind = 'd'
ON CONFLICT (state_id, hash) DO NOTHING
"""
_HEAD_PIECE = "SELECT p.id FROM kl_parts k JOIN version_pieces p ON p.state_id = %(sid)s AND p.hash = k.hash WHERE k.kind = 'd'"
_SET_LAYOUT = "UPDATE state_versions SET layout = %(layout)s WHERE id = %(vid)s"

# A version whose resources another version holds (_insert_sharing_layout): that version's layout,
# if it is pieced with the serial out of its head, and the head piece of the new top level, hashed
# as _PARTS_TABLE hashes kind 'd' (jsonb's text of the body, which does not depend on key order).
_SHARED_LAYOUT = "SELECT layout FROM state_versions WHERE id = %s AND head_piece IS NOT NULL AND head_serial AND layout IS NOT NULL"
_HEAD_HASH = "sha256(convert_to('d' || %(head)s::jsonb::text, 'UTF8'))"
_FIND_HEAD = f"SELECT id FROM version_pieces WHERE state_id = %(sid)s AND hash = {_HEAD_HASH}"
_ADD_HEAD = f"INSERT INTO version_pieces (state_id, hash, body) VALUES (%(sid)s, {_HEAD_HASH}, %(head)s::jsonb) RETURNING id"

_INSERT_PIECED_VERSION = f"""
INSERT INTO state_versions (state_id, serial, lineage, terraform_version, source, head_piece, head_serial, layout,
                            content_hash, actor, encrypted)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, false) RETURNING {_VERSION_COLS}
"""

_INSERT_WHOLE_FROM_DOC = f"""
INSERT INTO state_versions (state_id, serial, lineage, terraform_version, source, raw_state, content_hash, actor, encrypted)
SELECT %s, %s, %s, %s, %s, doc, %s, %s, false FROM kl_doc RETURNING {_VERSION_COLS}
"""


_NEWER = f"""
SELECT {_VERSION_COLS} FROM state_versions WHERE state_id = %s AND serial >= %s ORDER BY serial LIMIT 5
"""


def _check_advance(conn: psycopg.Connection, sid: str, name: str, cur: VersionRow, new: tfstate.State | tfstate.EnvelopeIds,
                   new_hash: str, force: bool) -> bool:
    """The serial and lineage rules. True: the write is a retry of the current version."""
    if new_hash == cur.content_hash:
        return True
    # A version kl numbered itself (an encrypted one from before kl read their lineage) has none.
    if new.lineage != cur.lineage and (cur.lineage or not cur.encrypted) and not force:
        raise VersionConflict(
            f"state {name!r} has lineage {cur.lineage}, the new state has {new.lineage}: "
            "it is a different state; use --force to replace it anyway"
        )
    if new.serial <= cur.serial:
        newer = _versions(conn).execute(_NEWER, (sid, new.serial)).fetchall()
        known = next((v.serial for v in newer if v.serial == new.serial and v.content_hash == new_hash), None)
        raise SerialBehind(name, cur, new.serial, newer, known)
    return False


def write_version(
    conn: psycopg.Connection,
    name: str,
    state: tfstate.State | None,
    raw: bytes | str,
    *,
    source: str,
    actor: str | None,
    force: bool = False,
    expect_serial: int | None = None,
    expect_lineage: str | None = None,
    touched: set[tuple[str, str]] | None = None,
    same_resources: bool = False,
    origin: str = "state",
    envelope: tfstate.EnvelopeIds | None = None,
) -> WriteResult:
    """Store ``raw`` (already parsed into ``state``) as the next version of state ``name``.

    ``state`` None means ``raw`` is an OpenTofu-encrypted envelope, kept opaque: it hides the
    resources, so it indexes no lifecycles. ``envelope`` is the serial and lineage it carries in
    the clear (tfstate.envelope_ids), checked by the same rules as a plain state's; an envelope
    without them is numbered after the current version and keeps the lineage kl knew (the serial
    order of versions stays the order of writes).
    ``expect_serial``/``expect_lineage`` make it a compare-and-swap: the write happens only if the
    current version is still the one the caller started from (the refresh commit uses it).
    ``touched`` (only with ``expect_serial``) lists the (address, deposed) objects that may differ
    from that version, removed ones included; the caller guarantees every other object is
    unchanged, so the lifecycle index looks at the touched ones only and a refresh commit costs
    what drifted, not what exists. ``same_resources`` (only with an empty ``touched``): the caller
    guarantees more, that the document's resources are exactly those of that version, byte for
    byte (a refresh that changed no object, the common case); the new version then shares that
    version's layout and stores only its top level, so such a commit costs a few statements
    whatever the state's size. ``origin`` names the input in error messages.
    ``raw`` as a str (a refresh's own serialisation; only with ``state``) is the version's UTF-8,
    sent a slice at a time: neither its bytes nor libpq's copy of a parameter are ever held whole.
    """
    if touched is not None and expect_serial is None:
        raise ValueError("touched needs expect_serial: it describes a change against a known version")
    if state is None and expect_serial is not None:
        raise ValueError("an encrypted envelope has no serial to compare and swap on")
    if same_resources and touched != set():
        raise ValueError("same_resources needs an empty touched: it says no object differs from a known version")
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}")
    if isinstance(raw, str) and state is None:
        raise ValueError("an encrypted envelope is stored as the bytes it came as")
    try:
        new_hash = content_hash(raw)
    except UnicodeEncodeError:
        raise tfstate.StateError(f"{origin}: not UTF-8 text (a lone surrogate)") from None
    if isinstance(raw, bytes) and not _is_utf8(raw):
        raise tfstate.StateError(f"{origin}: not UTF-8 text")
    with conn.transaction():
        sid = lock_state_row(conn, name, create=True)
        assert sid is not None  # created above, and deletes wait for the row lock we hold
        cur = current_version(conn, sid)
        if expect_serial is not None and (cur is None or cur.serial != expect_serial or cur.lineage != expect_lineage):
            now = f"serial {cur.serial}, lineage {cur.lineage}" if cur else "no version"
            raise VersionConflict(
                f"state {name!r} changed while this run was in progress (started from serial {expect_serial}, now {now}); nothing was written"
            )
        if state is None and envelope is not None:
            if cur is not None and _check_advance(conn, sid, name, cur, envelope, new_hash, force):
                return WriteResult(state_id=sid, version=cur, created=False)
            serial, lineage, terraform_version = envelope.serial, envelope.lineage, None
        elif state is None:
            if cur is not None and cur.content_hash == new_hash:
                return WriteResult(state_id=sid, version=cur, created=False)
            serial, lineage, terraform_version = (cur.serial + 1 if cur else 1), (cur.lineage if cur else ""), None
        else:
            if cur is not None and _check_advance(conn, sid, name, cur, state, new_hash, force):
                return WriteResult(state_id=sid, version=cur, created=False)
            serial, lineage, terraform_version = state.serial, state.lineage, state.terraform_version or None
            if same_resources:
                assert cur is not None  # the compare-and-swap above found it
                version = _insert_sharing_layout(conn, sid, cur, state, serial, lineage, terraform_version, source,
                                                 new_hash, actor)
                if version is not None:
                    log.debug("%s serial %d: no object differs from serial %d, stored as its top level on that "
                              "version's layout", name, serial, cur.serial)
                    if source != "refresh":  # as below: a refresh that closed nothing has no drift to record
                        drift_records.record(conn, sid, version.id, version.serial, version.created_at, source)
                    return WriteResult(state_id=sid, version=version, created=True, unchanged=len(state.instances))
        cur_versions = _versions(conn)
        cur_versions.adapters.register_dumper(_JsonbText, _JsonbTextDumper)
        try:
            if state is None:
                assert isinstance(raw, bytes)  # refused above as a str
                version = cur_versions.execute(
                    _INSERT_VERSION,
                    (sid, serial, lineage, terraform_version, source, _JsonbText(raw), new_hash, actor, True),
                ).fetchone()
            else:
                cur_versions.execute(_DOC_TABLE)
                if isinstance(raw, str):
                    with cur_versions.copy("COPY kl_doc (doc) FROM STDIN") as copy:
                        for chunk in _utf8_chunks(raw):
                            copy.write(_copy_text(chunk))
                else:
                    cur_versions.execute(_DOC_INSERT, (_JsonbText(raw),))
        except psycopg.errors.DataError as exc:  # e.g. \u0000, which jsonb cannot store
            raise tfstate.StateError(f"{origin}: PostgreSQL cannot store it as JSON: {str(exc).strip().splitlines()[0]}") from None
        if state is None:
            assert version is not None
            drift_records.record(conn, sid, version.id, version.serial, version.created_at, source)
            return WriteResult(state_id=sid, version=version, created=True)
        version, pieced, has_resources = _insert_version(conn, sid, serial, lineage, terraform_version, source, new_hash, actor)
        opened, closed, relabelled = _index_lifecycles(conn, sid, version, state, touched, pieced)
        if has_resources:
            _store_pieces(conn, sid, version)
        conn.execute("DROP TABLE kl_descriptors, kl_doc" + (", kl_parts" if pieced else ""))
        # A refresh's drift is its closed lifecycles: none closed (most refreshes), nothing to record,
        # and the statement that looks (planned afresh on every connection) is spared.
        if source != "refresh" or closed:
            drift_records.record(conn, sid, version.id, version.serial, version.created_at, source)
    return WriteResult(state_id=sid, version=version, created=True, opened=opened, closed=closed,
                       unchanged=len(state.instances) - opened, metadata_updated=relabelled)


def _insert_version(conn: psycopg.Connection, sid: str, serial: int, lineage: str, terraform_version: str | None,
                    source: str, new_hash: str, actor: str | None) -> tuple[VersionRow, bool, bool]:
    """Insert the version row for the document in kl_doc: as pieces when they can rebuild it, else
    whole. Returns the row, whether it is pieced (kl_parts then holds the document's pieces; its
    head piece is stored, the rest waits for _store_pieces) and whether it has resources."""
    cur = conn.cursor()
    shape = cur.execute(_DOC_SHAPE).fetchone()
    assert shape is not None
    splittable, doc_serial, has_resources = shape
    if not splittable:
        version = _versions(conn).execute(
            _INSERT_WHOLE_FROM_DOC, (sid, serial, lineage, terraform_version, source, new_hash, actor)).fetchone()
        assert version is not None
        return version, False, False
    # The row keeps the serial: a head without it is the same piece from one refresh to the next.
    strip_serial = doc_serial == str(serial)
    params: dict[str, Any] = {"sid": sid, "strip_serial": strip_serial}
    cur.execute(_PARTS_TABLE, params)
    cur.execute("CREATE INDEX ON kl_parts (hash)")
    cur.execute("ANALYZE kl_parts")
    cur.execute(_STORE_HEAD, params)
    head = cur.execute(_HEAD_PIECE, params).fetchone()
    assert head is not None
    version = _versions(conn).execute(
        _INSERT_PIECED_VERSION,
        (sid, serial, lineage, terraform_version, source, head[0], strip_serial, None, new_hash, actor)).fetchone()
    assert version is not None
    return version, True, bool(has_resources)


def _insert_sharing_layout(conn: psycopg.Connection, sid: str, prior: VersionRow, state: tfstate.State, serial: int,
                           lineage: str, terraform_version: str | None, source: str, new_hash: str,
                           actor: str | None) -> VersionRow | None:
    """The version row of a document whose resources are exactly ``prior``'s (the caller's word):
    prior's layout under the document's own head piece, as _insert_version and _store_pieces would
    have stored them from the whole text. None when prior is not stored that way (whole, or with the
    serial left in its head): the caller then stores the document."""
    doc = state.raw
    if type(doc.get("serial")) is not int or doc["serial"] != serial:  # a head that must keep it (_insert_version)
        return None
    layout = conn.execute(_SHARED_LAYOUT, (prior.id,)).fetchone()
    if layout is None:
        return None
    params = {"sid": sid, "head": tfstate.dumps_compact({k: v for k, v in doc.items() if k not in ("resources", "serial")})}
    head = conn.execute(_FIND_HEAD, params).fetchone() or conn.execute(_ADD_HEAD, params).fetchone()
    assert head is not None
    return _versions(conn).execute(
        _INSERT_PIECED_VERSION,
        (sid, serial, lineage, terraform_version, source, head[0], True, layout[0], new_hash, actor)).fetchone()


def _store_pieces(conn: psycopg.Connection, sid: str, version: VersionRow) -> None:
    """Store the pieces of kl_parts the state lacks and the version's layout (after the lifecycle
    index: pieces name the lifecycle rows that hold their attributes)."""
    cur = conn.cursor()
    params: dict[str, Any] = {"sid": sid, "vid": version.id}
    cur.execute(_STORE_PIECES, params)
    cur.execute(_RESOURCE_LISTS_TABLE, params)
    cur.execute(_STORE_RESOURCE_LISTS, params)
    items_row = cur.execute(_LAYOUT_ITEMS, params).fetchone()
    assert items_row is not None
    params["items"] = items_row[0]
    cur.execute(_STORE_LIST, params)
    found = cur.execute(_FIND_LIST, params).fetchone()
    assert found is not None
    params["layout"] = int(found[0])
    cur.execute(_SET_LAYOUT, params)
    cur.execute("DROP TABLE kl_resource_lists")


def _index_lifecycles(conn: psycopg.Connection, sid: str, version: VersionRow, state: tfstate.State,
                      touched: set[tuple[str, str]] | None, pieced: bool) -> tuple[int, int, int]:
    """Index the version's objects; returns (opened, closed, metadata updated in place)."""
    cur = conn.cursor()
    cur.execute(_DESCRIPTORS_TABLE)
    cur.execute(_SCOPE_TABLE)
    if touched is not None:
        with cur.copy("COPY kl_scope (address, deposed) FROM STDIN") as copy:
            for address_deposed in touched:
                copy.write_row(address_deposed)
        cur.execute("ANALYZE kl_scope")
    with cur.copy(
        "COPY kl_descriptors (address, deposed, mode, type, name, module, index_key, provider, ri, ii) FROM STDIN"
    ) as copy:
        for inst in state.instances:
            if touched is not None and (inst.address, inst.deposed) not in touched:
                continue
            key = None if inst.index_key is None else json.dumps(inst.index_key)
            copy.write_row((inst.address, inst.deposed, inst.mode, inst.type, inst.name, inst.module, key,
                            inst.provider, inst.resource_index, inst.instance_index))
    # Temp tables have no statistics until analysed; without them the joins below go quadratic.
    cur.execute("ANALYZE kl_descriptors")
    cur.execute(_INCOMING_TABLE.format(objects=_OBJECTS_OF_PARTS if pieced else _OBJECTS_OF_DOC))
    # Right after a big import `resources` has no statistics yet either, and the planner then
    # probes kl_incoming once per open row: with this index a probe is a lookup, not a scan
    # (a 10,000-instance write went from 22 s to well under one).
    cur.execute("CREATE INDEX ON kl_incoming (address, deposed)")
    cur.execute("ANALYZE kl_incoming")
    params = {"sid": sid, "vid": version.id, "serial": version.serial}
    closed = cur.execute(_CLOSE_GONE_OR_CHANGED_SCOPED if touched is not None else _CLOSE_GONE_OR_CHANGED, params).rowcount
    relabelled = cur.execute(_RESHAPE, params).rowcount
    relabelled += cur.execute(_IDENTITY_ADDED, params).rowcount
    relabelled += cur.execute(_UPDATE_METADATA, params).rowcount
    opened = cur.execute(_OPEN_NEW_OR_CHANGED, params).rowcount
    cur.execute("DROP TABLE kl_incoming, kl_scope")  # kl_descriptors: _store_pieces reads it too
    return opened, closed, relabelled
