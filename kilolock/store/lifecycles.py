"""The lifecycle index written with each version: which open ``resources`` rows the version's
objects continue, which it closes (gone or changed) and which it opens.

The objects are read from the document the write path put in the temporary table kl_doc (or
its pieces, kl_parts: store/pieces.py), never re-serialised in Python. kl_descriptors, made here,
outlives the index: pieces.store_pieces reads it, and the write path drops it.
"""
from __future__ import annotations

import json

import psycopg

from kilolock import tfstate
from kilolock.redact import MASK
from kilolock.store import identities
from kilolock.store.versions import VersionRow

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
       CASE WHEN jsonb_typeof(o.obj -> 'identity_schema_version') = 'number'
            THEN (o.obj ->> 'identity_schema_version')::bigint END AS identity_schema_version,
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

# An encrypted state's open row indexed with every value masked (its resource type had no cached
# schema: kilolock.encryption.masking) and an incoming object of the same status, identity and
# attribute names, null where the row is null: every difference is one kl could not see, so it is
# the same object, and its lifecycle takes the form the schema now lets kl index (_UNMASK). Only
# for a masked index (%(masked)s): a plain state's value spelled like the mask is a value.
_UNMASKED = f"""
%(masked)s AND to_jsonb(r.status) IS NOT DISTINCT FROM i.obj -> 'status'
AND r.identity IS NOT DISTINCT FROM i.obj -> 'identity'
AND jsonb_typeof(r.attributes) = 'object' AND jsonb_typeof(i.obj -> 'attributes') = 'object'
AND NOT EXISTS (SELECT 1 FROM jsonb_each(r.attributes) e WHERE e.value NOT IN ('null'::jsonb, '{json.dumps(MASK)}'::jsonb))
AND NOT EXISTS (SELECT 1 FROM jsonb_each(r.attributes) e FULL JOIN jsonb_each(i.obj -> 'attributes') n USING (key)
                WHERE e.key IS NULL OR n.key IS NULL OR (e.value = 'null'::jsonb) <> (n.value = 'null'::jsonb))
"""

# An open row no incoming object continues (same content, only reshaped, only given its first
# identity, or only unmasked): the object is gone or changed, so its lifecycle closes.
_CONTINUES = f"(i.content_hash = r.content_hash OR ({_RESHAPED}) OR {_IDENTITY_FIRST} OR ({_UNMASKED}))"
_NOT_INCOMING_AS_IS = f"""NOT EXISTS (
      SELECT 1 FROM kl_incoming i
      WHERE i.address = r.address AND i.deposed = r.deposed
        AND {_CONTINUES}
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
    schema_version = i.schema_version, sensitive_attributes = i.sensitive_attributes,
    identity = i.obj -> 'identity', identity_schema_version = i.identity_schema_version
FROM kl_incoming i
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
  AND {_RESHAPED}
"""

_IDENTITY_ADDED = f"""
UPDATE resources r SET content_hash = i.content_hash, identity = i.obj -> 'identity',
    identity_schema_version = i.identity_schema_version
FROM kl_incoming i
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
  AND {_IDENTITY_FIRST}
"""

_UNMASK = f"""
UPDATE resources r
SET attributes = i.obj -> 'attributes', content_hash = i.content_hash, provider = i.provider,
    schema_version = i.schema_version, sensitive_attributes = i.sensitive_attributes,
    identity_schema_version = i.identity_schema_version
FROM kl_incoming i
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
  AND r.content_hash <> i.content_hash AND {_UNMASKED}
"""

# Same object, new metadata: the open row follows it, one statement, no new lifecycle.
_UPDATE_METADATA = """
UPDATE resources r
SET provider = i.provider, schema_version = i.schema_version, sensitive_attributes = i.sensitive_attributes,
    identity_schema_version = i.identity_schema_version
FROM kl_incoming i
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
  AND r.content_hash = i.content_hash
  AND (r.provider, r.schema_version, r.sensitive_attributes, r.identity_schema_version)
      IS DISTINCT FROM (i.provider, i.schema_version, i.sensitive_attributes, i.identity_schema_version)
"""

_OPEN_NEW_OR_CHANGED = """
INSERT INTO resources (
    state_id, address, deposed, mode, type, name, module, index_key, provider, schema_version,
    status, attributes, sensitive_attributes, content_hash, create_serial, opened_by_version_id, identity,
    identity_schema_version
)
SELECT %(sid)s, i.address, i.deposed, i.mode, i.type, i.name, i.module, i.index_key, i.provider,
       i.schema_version, i.obj ->> 'status', i.obj -> 'attributes',
       i.sensitive_attributes, i.content_hash, %(serial)s, %(vid)s, i.obj -> 'identity', i.identity_schema_version
FROM kl_incoming i
WHERE NOT EXISTS (
    SELECT 1 FROM resources r
    WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
)
"""



_OBSERVE = f"""
INSERT INTO observed_objects (observation_id, state_id, address, deposed, baseline_resource_id, gone, status, attributes,
                              sensitive_attributes, content_hash, identity, identity_schema_version)
SELECT %(vid)s, %(sid)s, r.address, r.deposed, r.id, i.address IS NULL, i.obj ->> 'status', i.obj -> 'attributes',
       COALESCE(i.sensitive_attributes, '[]'::jsonb), i.content_hash, i.obj -> 'identity', i.identity_schema_version
FROM kl_scope s
JOIN resources r ON r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = s.address AND r.deposed = s.deposed
LEFT JOIN kl_incoming i ON i.address = r.address AND i.deposed = r.deposed
WHERE i.address IS NULL OR NOT COALESCE({_CONTINUES}, false)
"""


def _load_incoming(cur: psycopg.Cursor[tuple[object, ...]], state: tfstate.State, touched: set[tuple[str, str]] | None,
                   pieced: bool) -> None:
    """kl_descriptors, kl_scope (the TOUCHED objects) and kl_incoming (the objects the version holds,
    of the touched ones only when given), from the document in kl_doc or its pieces."""
    # Statements without parameters go together, one round trip each group (a small refresh's
    # commit is mostly round trips).
    cur.execute(_DESCRIPTORS_TABLE + ";" + _SCOPE_TABLE)
    if touched is not None:
        with cur.copy("COPY kl_scope (address, deposed) FROM STDIN") as copy:
            for address_deposed in touched:
                copy.write_row(address_deposed)
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
    # Of the columns joined and compared on only: the statistics of the objects (jsonb) were most
    # of ANALYZE's time, and no plan uses them (obj -> 'attributes' has no statistics of its own).
    cur.execute("ANALYZE kl_descriptors (ri, ii, address, deposed)" + (";ANALYZE kl_scope" if touched is not None else ""))
    # Right after a big import `resources` has no statistics yet either, and the planner then
    # probes kl_incoming once per open row: with this index a probe is a lookup, not a scan
    # (a 10,000-instance write went from 22 s to well under one).
    cur.execute(_INCOMING_TABLE.format(objects=_OBJECTS_OF_PARTS if pieced else _OBJECTS_OF_DOC)
                + ";CREATE INDEX ON kl_incoming (address, deposed)"
                + ";ANALYZE kl_incoming (address, deposed, content_hash, hash_without_identity)")


def index(conn: psycopg.Connection, sid: str, version: VersionRow, state: tfstate.State,
          touched: set[tuple[str, str]] | None, pieced: bool, *, masked: bool = False) -> tuple[int, int, int]:
    """Index the version's objects; returns (opened, closed, metadata updated in place). MASKED:
    the document is an encrypted state's index, its sensitive values masked."""
    cur = conn.cursor()
    _load_incoming(cur, state, touched, pieced)
    params = {"sid": sid, "vid": version.id, "serial": version.serial, "masked": masked}
    closed = cur.execute(_CLOSE_GONE_OR_CHANGED_SCOPED if touched is not None else _CLOSE_GONE_OR_CHANGED, params).rowcount
    relabelled = cur.execute(_RESHAPE, params).rowcount
    relabelled += cur.execute(_IDENTITY_ADDED, params).rowcount
    if masked:
        relabelled += cur.execute(_UNMASK, params).rowcount
    relabelled += cur.execute(_UPDATE_METADATA, params).rowcount
    opened = cur.execute(_OPEN_NEW_OR_CHANGED, params).rowcount
    cur.execute(identities.FROM_TERRAFORM, {**params, "relabelled": relabelled > 0})
    cur.execute("DROP TABLE kl_incoming, kl_scope")  # kl_descriptors: pieces.store_pieces reads it too
    return opened, closed, relabelled


def observe(conn: psycopg.Connection, sid: str, observation: VersionRow, state: tfstate.State,
            touched: set[tuple[str, str]], pieced: bool, *, on_current: bool = True, masked: bool = False) -> int:
    """Record what the observation's TOUCHED objects are where they differ from the open rows (the
    Terraform version it is based on, which must be the current one): each changed or gone object
    one observed_objects row. The index itself is Terraform's and stays as it is; a change of
    metadata alone, or a flatmap object's first structured form, is not a difference. Returns the
    number of observed objects. ON_CURRENT: the observation is of Terraform's current version, so
    what it read is what is open now (the identity index follows it)."""
    cur = conn.cursor()
    if not touched:
        # Nothing read differs from the open rows: nothing to compare, no temporary tables but the
        # (empty) descriptors pieces.store_pieces joins. What earlier observations put in the
        # identity index is undone, as an observation of every object read back does.
        cur.execute(_DESCRIPTORS_TABLE)
        if on_current:
            identities.confirmed(conn, sid)
        return 0
    _load_incoming(cur, state, touched, pieced)
    found = cur.execute(_OBSERVE, {"sid": sid, "vid": observation.id, "masked": masked}).rowcount
    if on_current:
        cur.execute(identities.FROM_OBSERVATION, {"sid": sid})
    cur.execute("DROP TABLE kl_incoming, kl_scope")  # kl_descriptors: pieces.store_pieces reads it too
    return found
