"""The identity index (migration 0024, ``resource_identities``): which remote object each open
instance is, keyed by (provider source, type, identity) or, for an object without an identity, by
its ``id`` attribute, as the state's latest observation saw it.

Kept by the write path (store/lifecycles.py calls the statements here in the version's
transaction, one per write, set-based over what the write touched), read by ``claims`` (which
instances claim a remote object: `kl discover`) and by the inventory (store/inventory.py).

An identity's key is ``kl_identity_key(identity, identity_schema_version)``: the sha256 of the
schema version and the identity's jsonb text (canonical: one key order, one spelling; numbers as
the JSON spelled them, which for Terraform's and providers' JSON is the shortest form). The
schema version is part of the key: an identity stored under an older identity schema is another
key until it is upgraded.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row
from psycopg.types.json import Jsonb

# The columns an index row takes from its values (IDENTITY, SCHEMA_VERSION and ATTRIBUTES are
# expressions), in resource_identities' order after resource_id and state_id.
_COLUMNS = ("mode, type, provider_source, provider_alias, identity, identity_schema_version, identity_key, object_id, "
            "observed, gone")
_UPSERT_TAIL = """
ON CONFLICT (resource_id) DO UPDATE SET
    mode = EXCLUDED.mode, type = EXCLUDED.type, provider_source = EXCLUDED.provider_source,
    provider_alias = EXCLUDED.provider_alias, identity = EXCLUDED.identity,
    identity_schema_version = EXCLUDED.identity_schema_version, identity_key = EXCLUDED.identity_key,
    object_id = EXCLUDED.object_id, observed = EXCLUDED.observed, gone = EXCLUDED.gone
WHERE (x.provider_source, x.provider_alias, x.identity, x.identity_schema_version, x.identity_key, x.object_id,
       x.observed, x.gone)
      IS DISTINCT FROM (EXCLUDED.provider_source, EXCLUDED.provider_alias, EXCLUDED.identity,
                        EXCLUDED.identity_schema_version, EXCLUDED.identity_key, EXCLUDED.object_id, EXCLUDED.observed,
                        EXCLUDED.gone)
"""

# A Terraform version (after the lifecycle statements, kl_incoming holding the objects it wrote,
# all or the touched ones): the rows of the lifecycles it closed go, those of the lifecycles it
# opened are inserted, those it changed in place (%(relabelled)s: any was) are set again from their
# lifecycle rows, and what an observation of an older version put in place is undone (a new
# Terraform version resolves what was observed; the next observation finds it again).
# A lifecycle the version continues unchanged keeps its row as it is: nothing it is made of
# changed. The opened ones are new rows, found by the version that opened them and inserted
# without a conflict check: comparing every object of a 20,000-instance import against rows
# that cannot exist yet was most of the index's cost.
FROM_TERRAFORM = f"""
WITH closed AS (
    DELETE FROM resource_identities d USING resources c
    WHERE c.closed_by_version_id = %(vid)s AND d.resource_id = c.id
),
opened AS MATERIALIZED (
    SELECT r.id, r.state_id, r.mode, r.type, r.provider, r.identity, r.identity_schema_version,
           kl_object_id(r.attributes) AS object_id
    FROM resources r WHERE r.opened_by_version_id = %(vid)s AND r.delete_serial IS NULL
),
ids AS (
    SELECT r.id FROM kl_incoming i
    JOIN resources r ON r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = i.address AND r.deposed = i.deposed
    WHERE %(relabelled)s AND r.opened_by_version_id <> %(vid)s
    UNION
    SELECT o.resource_id FROM resource_identities o WHERE o.state_id = %(sid)s AND o.observed
),
kept AS MATERIALIZED (
    SELECT r.id, r.state_id, r.mode, r.type, r.provider, r.identity, r.identity_schema_version,
           kl_object_id(r.attributes) AS object_id
    FROM ids JOIN resources r ON r.id = ids.id AND r.delete_serial IS NULL
),
-- A state has a few provider addresses: each is read once, not once per instance.
providers AS MATERIALIZED (
    SELECT p.provider, kl_provider_source(p.provider) AS source, kl_provider_alias(p.provider) AS alias
    FROM (SELECT provider FROM opened UNION SELECT provider FROM kept) p
),
inserted AS (
    INSERT INTO resource_identities (resource_id, state_id, {_COLUMNS})
    SELECT r.id, r.state_id, r.mode, r.type, p.source, p.alias, r.identity, r.identity_schema_version,
           kl_identity_key(r.identity, r.identity_schema_version), r.object_id, false, false
    FROM opened r JOIN providers p ON p.provider = r.provider
)
INSERT INTO resource_identities AS x (resource_id, state_id, {_COLUMNS})
SELECT r.id, r.state_id, r.mode, r.type, p.source, p.alias, r.identity, r.identity_schema_version,
       kl_identity_key(r.identity, r.identity_schema_version), r.object_id, false, false
FROM kept r JOIN providers p ON p.provider = r.provider
{_UPSERT_TAIL}
"""

# An observation of Terraform's current version (kl_scope: the objects it may have read otherwise,
# kl_incoming: what it read of them): a touched object it does not hold is gone, one it read is
# keyed by what it read; every other row an earlier observation put in place is read back as
# Terraform has it (the observation holds it as its base does). `observed` marks a row whose
# values are not its lifecycle row's.
FROM_OBSERVATION = f"""
WITH ids AS (
    SELECT r.id, true AS in_scope FROM kl_scope s
    JOIN resources r ON r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.address = s.address AND r.deposed = s.deposed
    UNION ALL
    SELECT o.resource_id, false FROM resource_identities o
    WHERE o.state_id = %(sid)s AND o.observed
      AND NOT EXISTS (SELECT 1 FROM resources t JOIN kl_scope s ON s.address = t.address AND s.deposed = t.deposed
                      WHERE t.id = o.resource_id)
),
seen AS (
    SELECT r.*, ids.in_scope AND i.address IS NULL AS now_gone,
           CASE WHEN i.address IS NOT NULL THEN i.obj -> 'identity' ELSE r.identity END AS seen_identity,
           CASE WHEN i.address IS NOT NULL THEN i.identity_schema_version ELSE r.identity_schema_version END AS seen_version,
           kl_object_id(CASE WHEN i.address IS NOT NULL THEN i.obj -> 'attributes' ELSE r.attributes END) AS seen_id
    FROM ids JOIN resources r ON r.id = ids.id
    LEFT JOIN kl_incoming i ON ids.in_scope AND i.address = r.address AND i.deposed = r.deposed
)
INSERT INTO resource_identities AS x (resource_id, state_id, {_COLUMNS})
SELECT id, state_id, mode, type, kl_provider_source(provider), kl_provider_alias(provider), seen_identity, seen_version,
       kl_identity_key(seen_identity, seen_version), seen_id,
       now_gone OR (seen_identity, seen_version, seen_id) IS DISTINCT FROM (identity, identity_schema_version,
                                                                             kl_object_id(attributes)),
       now_gone
FROM seen
{_UPSERT_TAIL}
"""

# An observation that found every object as its base has them: what earlier ones put in place is undone.
_CONFIRMED = """
UPDATE resource_identities x
SET identity = r.identity, identity_schema_version = r.identity_schema_version,
    identity_key = kl_identity_key(r.identity, r.identity_schema_version), object_id = kl_object_id(r.attributes),
    observed = false, gone = false
FROM resources r
WHERE x.state_id = %(sid)s AND x.observed AND r.id = x.resource_id
"""


def confirmed(conn: psycopg.Connection, sid: str) -> None:
    """State SID's latest observation (of its current version) found every object as that version
    holds it: the index says what the version says again."""
    conn.execute(_CONFIRMED, {"sid": sid})


# --- reading: which open instances claim an object ------------------------------------------------

@dataclass(frozen=True)
class Wanted:
    """A remote object to look for: its identity (with the identity schema version it is written
    in), its ``id`` attribute, or both. Values as JSON decodes them (numbers as the provider
    spelled them)."""

    identity: Mapping[str, Any] | None = None
    identity_schema_version: int = 0
    object_id: str | None = None


@dataclass(frozen=True)
class Claim:
    """An open instance (as its state's latest observation saw it) that is the object looked for."""

    index: int  # the position of the object in the list looked up
    evidence: str  # 'identity' (same identity key: certain) or 'id' (same id attribute: weak)
    state: str
    address: str
    deposed: str
    mode: str
    type: str
    provider: str  # the provider address as the state holds it
    provider_source: str
    provider_alias: str
    identity: dict[str, Any] | None
    identity_schema_version: int | None
    object_id: str | None
    resource_id: str  # the lifecycle row (resources.id)


_CLAIMS = """
WITH w AS (
    SELECT (t.ord - 1)::int AS index,
           kl_identity_key(t.o -> 'identity', (t.o ->> 'identity_schema_version')::bigint) AS ikey,
           NULLIF(t.o ->> 'id', '') AS oid
    FROM jsonb_array_elements(%(objects)s::jsonb) WITH ORDINALITY AS t(o, ord)
),
hits AS (
    SELECT w.index, 'identity' AS evidence, x.resource_id FROM w
    JOIN resource_identities x ON x.provider_source = %(source)s AND x.type = %(type)s AND x.identity_key = w.ikey
                              AND x.identity_key IS NOT NULL AND NOT x.gone AND x.mode = %(mode)s
    UNION ALL
    -- An id is the evidence only where one side has no identity: two identities that differ are
    -- two objects whatever their ids.
    SELECT w.index, 'id', x.resource_id FROM w
    JOIN resource_identities x ON x.provider_source = %(source)s AND x.type = %(type)s AND x.object_id = w.oid
                              AND x.object_id IS NOT NULL AND NOT x.gone AND x.mode = %(mode)s
    WHERE w.ikey IS NULL OR x.identity_key IS NULL
)
SELECT h.index, h.evidence, s.name AS state, r.address, r.deposed, r.mode, r.type, r.provider, x.provider_source,
       x.provider_alias, x.identity, x.identity_schema_version, x.object_id, r.id::text AS resource_id
FROM hits h
JOIN resource_identities x ON x.resource_id = h.resource_id
JOIN resources r ON r.id = h.resource_id
JOIN states s ON s.id = r.state_id
ORDER BY h.index, h.evidence DESC, s.name, r.address, r.deposed
"""


def claims(conn: psycopg.Connection, provider_source: str, type_: str, objects: Sequence[Wanted], *,
           mode: str = "managed") -> list[list[Claim]]:
    """For each of OBJECTS (of resource type TYPE_ of the provider PROVIDER_SOURCE, e.g.
    ``registry.terraform.io/hashicorp/aws``), the open instances that are it: those with the same
    identity key (evidence ``identity``), and, where the object or the instance has no identity,
    those with the same ``id`` attribute (evidence ``id``). One statement for the whole list."""
    payload = [{"identity": dict(o.identity) if o.identity is not None else None,
                "identity_schema_version": o.identity_schema_version, "id": o.object_id} for o in objects]
    found: list[list[Claim]] = [[] for _ in objects]
    rows = conn.cursor(row_factory=class_row(Claim)).execute(
        _CLAIMS, {"objects": Jsonb(payload), "source": provider_source, "type": type_, "mode": mode}).fetchall()
    for c in rows:
        found[c.index].append(c)
    return found


def identity_key(conn: psycopg.Connection, identity: Mapping[str, Any], identity_schema_version: int) -> str | None:
    """The key the index gives IDENTITY (None: it has no non-null value), computed by the one
    definition, kl_identity_key."""
    row = conn.execute("SELECT kl_identity_key(%s::jsonb, %s)", (Jsonb(dict(identity)), identity_schema_version)).fetchone()
    return None if row is None or row[0] is None else str(row[0])
