"""A version stored as pieces (migration 0014): the document the write path put in the temporary
table kl_doc is split there into its top level, resources and instances, and only the pieces its
state does not hold yet are stored, with the version's layout (the list that puts them back in
order). A version whose resources are exactly an earlier one's shares that one's layout.
"""
from __future__ import annotations

from typing import Any

import psycopg

from kilolock.store.versions import VERSION_COLS, VersionRow, version_rows

# What the pieces can rebuild: an object whose resources (if any) are all objects with an
# "instances" array. Anything else is stored whole. Also the document's serial, as text.
# (The write path is given the document parsed and validated by tfstate.parse_state, which holds it
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

# An observation is a version row of its own kind, numbered per base.
_INSERT_PIECED_VERSION = f"""
INSERT INTO state_versions (state_id, serial, lineage, terraform_version, source, head_piece, head_serial, layout,
                            content_hash, actor, encrypted, kind, base_version_id, observation_number, compared_to_base)
VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, false, %s, %s, %s, %s) RETURNING {VERSION_COLS}
"""

_INSERT_WHOLE_FROM_DOC = f"""
INSERT INTO state_versions (state_id, serial, lineage, terraform_version, source, raw_state, content_hash, actor, encrypted,
                            kind, base_version_id, observation_number, compared_to_base)
SELECT %s, %s, %s, %s, %s, doc, %s, %s, false, %s, %s, %s, %s FROM kl_doc RETURNING {VERSION_COLS}
"""


def _kind(observation: tuple[str, int, bool] | None) -> tuple[str, str | None, int | None, bool | None]:
    """The kind, base, number and compared_to_base columns of a version row: OBSERVATION is (base
    id, number, whether what it found different from its base is recorded with it)."""
    return ("terraform", None, None, None) if observation is None else ("observation", *observation)


def insert_version(conn: psycopg.Connection, sid: str, serial: int, lineage: str, terraform_version: str | None,
                   source: str, new_hash: str, actor: str | None,
                   observation: tuple[str, int, bool] | None = None) -> tuple[VersionRow, bool, bool]:
    """Insert the version row for the document in kl_doc: as pieces when they can rebuild it, else
    whole; an observation's row when OBSERVATION (its base's id, its number, whether it is compared to its base) is given. Returns the row, whether it is pieced (kl_parts then holds the document's pieces; its
    head piece is stored, the rest waits for store_pieces) and whether it has resources."""
    cur = conn.cursor()
    shape = cur.execute(_DOC_SHAPE).fetchone()
    assert shape is not None
    splittable, doc_serial, has_resources = shape
    if not splittable:
        version = version_rows(conn).execute(
            _INSERT_WHOLE_FROM_DOC, (sid, serial, lineage, terraform_version, source, new_hash, actor,
                                     *_kind(observation))).fetchone()
        assert version is not None
        return version, False, False
    # The row keeps the serial: a head without it is the same piece from one refresh to the next.
    strip_serial = doc_serial == str(serial)
    params: dict[str, Any] = {"sid": sid, "strip_serial": strip_serial}
    cur.execute(_PARTS_TABLE, params)
    cur.execute("CREATE INDEX ON kl_parts (hash); ANALYZE kl_parts (kind, ri, ii, hash)")  # not the bodies: as lifecycles' tables
    cur.execute(_STORE_HEAD, params)
    head = cur.execute(_HEAD_PIECE, params).fetchone()
    assert head is not None
    version = version_rows(conn).execute(
        _INSERT_PIECED_VERSION,
        (sid, serial, lineage, terraform_version, source, head[0], strip_serial, None, new_hash, actor,
         *_kind(observation))).fetchone()
    assert version is not None
    return version, True, bool(has_resources)


def store_pieces(conn: psycopg.Connection, sid: str, version: VersionRow) -> None:
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
