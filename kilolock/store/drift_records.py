"""The drift record, kept by the write path (store/writes.py) in the version's transaction.

Drift is the latest observation against the Terraform version it is based on (migration 0019): an
observation that finds an object different from Terraform's (changed or gone) opens a record there,
or updates the open one when what it found differs from the record's last finding (its first
detection stays); one that reads an object back as Terraform's version has it resolves the record
there (`refresh`). Any new Terraform version (an apply, an import, an accepted observation)
resolves every open record (`apply`, `import`, `accepted`, or `recreated` when it holds an object
again where one was deleted): the next observation finds what is still different.

Before observations, refreshes wrote Terraform versions, and the rule for those (migration 0007) is
kept for the refresh versions `kl refresh --commit` writes: a refresh-sourced version that closes the
open lifecycle at an address, with a new one there (`changed`) or none (`deleted`), opens a drift
record, or, when one is open there already, updates that same record (its first detection stays).
A refresh that reads the object back with the content the record started from resolves it
(`refresh`); any apply- or import-sourced version resolves every open record of the state
(`apply`, `import`, or `recreated` when it holds an object again where one was deleted).
Lifecycles ignore metadata (sensitivity marks, provider address, schema version), so a change of
metadata alone never closes one and is never drift.

Each statement is set-based over this version's closed lifecycles (an index lookup by
closed_by_version_id): a refresh commit costs what drifted, not what exists.
"""
from __future__ import annotations

from datetime import datetime

import psycopg

from kilolock.store import notify


def _changed_names(before: str, after: str) -> str:
    """SQL: the sorted top-level attribute names whose values differ between two jsonb objects."""
    def keys(expr: str) -> str:
        return f"jsonb_object_keys(CASE WHEN jsonb_typeof({expr}) = 'object' THEN {expr} ELSE '{{}}'::jsonb END)"
    return (f"ARRAY(SELECT k FROM (SELECT {keys(before)} UNION SELECT {keys(after)}) keys(k) "
            f"WHERE ({before}) -> k IS DISTINCT FROM ({after}) -> k ORDER BY k)")


# What this refresh version found: each lifecycle it closed, what it opened at the same address
# (nothing: deleted), and the open record there with the content it started from. The LATERAL ...
# LIMIT 1 lookups are planned per closed row, so each is a full-key probe of an open-row index
# however stale the statistics: right after a big import `resources` has none, and a plain join
# scanned the whole state once per closed row (1,000 drifted of 10,000 instances: 5 s, now 5 ms).
# An open row at the address of a row this version closed can only be one this version opened.
_FOUND = """
SELECT c.address, c.deposed, c.id AS closed_id, c.attributes AS closed_attributes,
       o.id AS opened_id, o.attributes AS opened_attributes,
       d.id AS record_id, d.baseline_attributes,
       COALESCE(o.content_hash = d.baseline_hash, false) AS read_back
FROM resources c
LEFT JOIN LATERAL (
    SELECT r.id, r.attributes, r.content_hash FROM resources r
    WHERE r.state_id = c.state_id AND r.address = c.address AND r.deposed = c.deposed AND r.delete_serial IS NULL
    LIMIT 1
) o ON true
LEFT JOIN LATERAL (
    SELECT x.id, b.attributes AS baseline_attributes, b.content_hash AS baseline_hash
    FROM drift_records x JOIN resources b ON b.id = x.baseline_resource_id
    WHERE x.state_id = c.state_id AND x.address = c.address AND x.deposed = c.deposed AND x.resolved_version_id IS NULL
    LIMIT 1
) d ON true
WHERE c.closed_by_version_id = %(vid)s
"""

_REFRESH = f"""
WITH found AS MATERIALIZED ({_FOUND}),
still_open AS (
    UPDATE drift_records d SET
        kind = CASE WHEN f.read_back THEN d.kind WHEN f.opened_id IS NULL THEN 'deleted' ELSE 'changed' END,
        current_resource_id = CASE WHEN f.read_back THEN d.current_resource_id ELSE f.opened_id END,
        changed_attributes = CASE WHEN f.read_back THEN d.changed_attributes WHEN f.opened_id IS NULL THEN NULL
                                  ELSE {_changed_names('f.baseline_attributes', 'f.opened_attributes')} END,
        detected_version_id = CASE WHEN f.read_back THEN d.detected_version_id ELSE %(vid)s END,
        detected_serial = CASE WHEN f.read_back THEN d.detected_serial ELSE %(serial)s END,
        detected_at = CASE WHEN f.read_back THEN d.detected_at ELSE %(at)s END,
        resolved_version_id = CASE WHEN f.read_back THEN %(vid)s::uuid END,
        resolved_serial = CASE WHEN f.read_back THEN %(serial)s::bigint END,
        resolved_at = CASE WHEN f.read_back THEN %(at)s::timestamptz END,
        resolved_how = CASE WHEN f.read_back THEN 'refresh' END
    FROM found f
    WHERE d.id = f.record_id
    RETURNING d.id
),
opened AS (
INSERT INTO drift_records (state_id, address, deposed, kind, baseline_resource_id, current_resource_id, changed_attributes,
                           first_detected_version_id, first_detected_serial, first_detected_at,
                           detected_version_id, detected_serial, detected_at)
SELECT %(sid)s, f.address, f.deposed, CASE WHEN f.opened_id IS NULL THEN 'deleted' ELSE 'changed' END,
       f.closed_id, f.opened_id,
       CASE WHEN f.opened_id IS NULL THEN NULL ELSE {_changed_names('f.closed_attributes', 'f.opened_attributes')} END,
       %(vid)s, %(serial)s, %(at)s, %(vid)s, %(serial)s, %(at)s
FROM found f
WHERE f.record_id IS NULL
RETURNING id
)
SELECT id::text FROM still_open UNION ALL SELECT id::text FROM opened
"""

# What an observation read at each open record's address (its observed object there, else
# Terraform's open row, else nothing: a record found before observations may be of an object a
# refresh version removed), and the observed objects no record is open for.
_OBSERVE = f"""
WITH obs AS MATERIALIZED (
    SELECT o.id, o.address, o.deposed, o.gone, o.content_hash, o.attributes, o.baseline_resource_id
    FROM observed_objects o WHERE o.observation_id = %(vid)s
),
seen AS MATERIALIZED (
    SELECT d.id, b.content_hash AS baseline_hash, b.attributes AS baseline_attributes,
           CASE WHEN d.current_observed_id IS NOT NULL THEN oc.content_hash ELSE cr.content_hash END AS current_hash,
           o.id AS observed_id, t.id AS open_id,
           CASE WHEN o.id IS NOT NULL THEN o.content_hash ELSE t.content_hash END AS seen_hash,
           CASE WHEN o.id IS NOT NULL THEN o.attributes ELSE t.attributes END AS seen_attributes
    FROM drift_records d
    JOIN resources b ON b.id = d.baseline_resource_id
    LEFT JOIN observed_objects oc ON oc.id = d.current_observed_id
    LEFT JOIN resources cr ON cr.id = d.current_resource_id
    LEFT JOIN obs o ON o.address = d.address AND o.deposed = d.deposed
    LEFT JOIN LATERAL (
        SELECT r.id, r.content_hash, r.attributes FROM resources r
        WHERE r.state_id = d.state_id AND r.address = d.address AND r.deposed = d.deposed AND r.delete_serial IS NULL
        LIMIT 1
    ) t ON o.id IS NULL
    WHERE d.state_id = %(sid)s AND d.resolved_version_id IS NULL
),
read_back AS (
    UPDATE drift_records d SET resolved_version_id = %(vid)s, resolved_serial = %(serial)s, resolved_at = %(at)s,
                               resolved_how = 'refresh'
    FROM seen s
    WHERE d.id = s.id AND s.seen_hash = s.baseline_hash
    RETURNING d.id
),
still_open AS (
    UPDATE drift_records d SET
        kind = CASE WHEN s.seen_hash IS NULL THEN 'deleted' ELSE 'changed' END,
        current_observed_id = CASE WHEN s.seen_hash IS NOT NULL THEN s.observed_id END,
        current_resource_id = CASE WHEN s.seen_hash IS NOT NULL THEN s.open_id END,
        changed_attributes = CASE WHEN s.seen_hash IS NULL THEN NULL
                                  ELSE {_changed_names('s.baseline_attributes', 's.seen_attributes')} END,
        detected_version_id = %(vid)s, detected_serial = %(serial)s, detected_at = %(at)s
    FROM seen s
    WHERE d.id = s.id AND s.seen_hash IS DISTINCT FROM s.baseline_hash AND s.seen_hash IS DISTINCT FROM s.current_hash
    RETURNING d.id
),
opened AS (
    INSERT INTO drift_records (state_id, address, deposed, kind, baseline_resource_id, current_observed_id,
                               changed_attributes, first_detected_version_id, first_detected_serial, first_detected_at,
                               detected_version_id, detected_serial, detected_at)
    SELECT %(sid)s, o.address, o.deposed, CASE WHEN o.gone THEN 'deleted' ELSE 'changed' END, o.baseline_resource_id,
           CASE WHEN o.gone THEN NULL ELSE o.id END,
           CASE WHEN o.gone THEN NULL ELSE {_changed_names('b.attributes', 'o.attributes')} END,
           %(vid)s, %(serial)s, %(at)s, %(vid)s, %(serial)s, %(at)s
    FROM obs o JOIN resources b ON b.id = o.baseline_resource_id
    WHERE NOT EXISTS (SELECT 1 FROM drift_records x
                      WHERE x.state_id = %(sid)s AND x.address = o.address AND x.deposed = o.deposed
                        AND x.resolved_version_id IS NULL)
    RETURNING id
)
SELECT id::text FROM read_back UNION ALL SELECT id::text FROM still_open UNION ALL SELECT id::text FROM opened
"""

# Open records whose baseline is what Terraform's current version holds at their address: a run
# that reads the object there back as Terraform has it (finds no difference) resolves them.
_ON_TERRAFORMS_BASELINE = """
SELECT d.address, d.deposed, d.kind FROM drift_records d
JOIN resources b ON b.id = d.baseline_resource_id
JOIN resources t ON t.state_id = d.state_id AND t.address = d.address AND t.deposed = d.deposed AND t.delete_serial IS NULL
WHERE d.state_id = %s AND d.resolved_version_id IS NULL AND t.content_hash = b.content_hash
ORDER BY d.address, d.deposed
"""

# A refresh version (kl refresh --commit) that holds an observed record's baseline again read it back.
_READ_BACK_BY_VERSION = """
UPDATE drift_records d SET resolved_version_id = %(vid)s, resolved_serial = %(serial)s, resolved_at = %(at)s,
                           resolved_how = 'refresh'
FROM resources b, resources t
WHERE d.state_id = %(sid)s AND d.resolved_version_id IS NULL AND d.current_observed_id IS NOT NULL
  AND b.id = d.baseline_resource_id AND t.state_id = d.state_id AND t.address = d.address AND t.deposed = d.deposed
  AND t.delete_serial IS NULL AND t.content_hash = b.content_hash
RETURNING d.id::text
"""

# Whether an observation found anything, or the state has open drift it may resolve.
_FOUND_OR_OPEN = """
SELECT EXISTS (SELECT 1 FROM observed_objects WHERE observation_id = %s)
    OR EXISTS (SELECT 1 FROM drift_records WHERE state_id = %s AND resolved_version_id IS NULL)
"""

# Terraform's own view of the state (an apply, an import) replaces what refresh saw.
_RESOLVE_ALL = """
UPDATE drift_records d SET
    resolved_version_id = %(vid)s, resolved_serial = %(serial)s, resolved_at = %(at)s,
    resolved_how = CASE WHEN d.kind = 'deleted' AND EXISTS (
        SELECT 1 FROM resources r
        WHERE r.state_id = d.state_id AND r.address = d.address AND r.deposed = d.deposed AND r.delete_serial IS NULL
    ) THEN 'recreated' ELSE %(source)s END
WHERE d.state_id = %(sid)s AND d.resolved_version_id IS NULL
RETURNING d.id::text
"""


_ACCEPT = """
UPDATE drift_records d SET resolved_version_id = %(vid)s, resolved_serial = %(serial)s, resolved_at = %(at)s,
                           resolved_how = 'accepted'
FROM unnest(%(addresses)s::text[], %(deposed)s::text[]) AS a(address, deposed)
WHERE d.state_id = %(sid)s AND d.resolved_version_id IS NULL AND d.address = a.address AND d.deposed = a.deposed
RETURNING d.id::text
"""


def accept(conn: psycopg.Connection, sid: str, vid: str, serial: int, at: datetime | None,
           accepted: set[tuple[str, str]]) -> None:
    """Resolve the open records at the ACCEPTED (address, deposed) objects as `accepted` by the
    version just written (same transaction), with their notification events."""
    keys = sorted(accepted)
    params = {"sid": sid, "vid": vid, "serial": serial, "at": at,
              "addresses": [a for a, _ in keys], "deposed": [d for _, d in keys]}
    touched = [str(r[0]) for r in conn.execute(_ACCEPT, params).fetchall()]
    notify.record_drift_events(conn, sid, vid, serial, touched)


def on_terraforms_baseline(conn: psycopg.Connection, sid: str) -> list[tuple[str, str, str]]:
    """(address, deposed, kind) of the open records that reading the object back as Terraform's
    current version holds it would resolve."""
    return [(str(a), str(d), str(k)) for a, d, k in conn.execute(_ON_TERRAFORMS_BASELINE, (sid,)).fetchall()]


def observe(conn: psycopg.Connection, sid: str, vid: str, serial: int, at: datetime | None) -> None:
    """Bring the state's drift records up to the observation just recorded (same transaction, after
    its observed objects), which must be based on Terraform's current version, and make the
    notification events of the records it opened, updated or resolved."""
    found = conn.execute(_FOUND_OR_OPEN, (vid, sid)).fetchone()
    if not (found and found[0]):
        return  # nothing found and nothing open: the common confirmation costs one lookup
    params = {"sid": sid, "vid": vid, "serial": serial, "at": at}
    touched = [str(r[0]) for r in conn.execute(_OBSERVE, params).fetchall()]
    notify.record_drift_events(conn, sid, vid, serial, touched)


def record(conn: psycopg.Connection, sid: str, vid: str, serial: int, at: datetime | None, source: str) -> None:
    """Bring the state's drift records up to the version just written (same transaction, after
    its lifecycle rows), and the notification events they make (store/notify.py) from the
    records this version opened, updated or resolved."""
    params = {"sid": sid, "vid": vid, "serial": serial, "at": at, "source": source}
    touched = [str(r[0]) for r in conn.execute(_REFRESH if source == "refresh" else _RESOLVE_ALL, params).fetchall()]
    if source == "refresh":
        touched += [str(r[0]) for r in conn.execute(_READ_BACK_BY_VERSION, params).fetchall()]
    notify.record_drift_events(conn, sid, vid, serial, touched)
