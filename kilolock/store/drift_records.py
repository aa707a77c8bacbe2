"""The drift record, kept by the write path (store/writes.py) in the version's transaction.

The rule (also in migration 0007 and README "Drift"): a refresh-sourced version that closes the
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


def record(conn: psycopg.Connection, sid: str, vid: str, serial: int, at: datetime | None, source: str) -> None:
    """Bring the state's drift records up to the version just written (same transaction, after
    its lifecycle rows), and the notification events they make (store/notify.py) from the
    records this version opened, updated or resolved."""
    params = {"sid": sid, "vid": vid, "serial": serial, "at": at, "source": source}
    touched = [str(r[0]) for r in conn.execute(_REFRESH if source == "refresh" else _RESOLVE_ALL, params).fetchall()]
    notify.record_drift_events(conn, sid, vid, serial, touched)
