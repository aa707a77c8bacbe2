"""Reads of the drift records: `current_resource_drift` (open ones) and `resource_drift` (all).

`kl drift`, the drift API and `kl status`'s open count all read current_resource_drift, so the
count is exactly the rows listed. Records ignore rules hide (migrations 0009, 0012) are not there;
with ``include_resolved`` they come with the rules that hide them (ignore_rule_id and
ignore_reason: the oldest; ignore_rules: every one, ``[{"rule", "reason"}]``).
"""
from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from kilolock.store.states import state_id

# A version's label as `kl state versions` writes it: v7 (Terraform's), v7.3 (its third observation).
_LABEL = "SELECT 'v' || v.serial || COALESCE('.' || v.observation_number, '') FROM state_versions v WHERE v.id = {}"
# The latest observation before the record's resolution (any, while it is open) that was of the
# version the drift is against: it saw the drift still there, or it would have resolved it.
_LAST_CONFIRMED = """SELECT 'v' || c.serial || '.' || c.observation_number FROM state_versions c
       WHERE c.state_id = {table}.state_id AND c.kind = 'observation' AND c.serial = {table}.detected_serial
         AND c.seq <= COALESCE((SELECT r.seq FROM state_versions r WHERE r.id = {resolved}), 9223372036854775807)
       ORDER BY c.seq DESC LIMIT 1"""


def _cols(table: str, resolved: str) -> str:
    return f"""address, deposed, drift_kind, type, provider, detected_serial, detected_at, previous_attributes, current_attributes,
       previous_sensitive_attributes, current_sensitive_attributes, refresh_run_id, first_detected_serial,
       first_detected_at, last_confirmed_serial, open_for, changed_attributes,
       ({_LABEL.format("detected_version_id")}) AS detected_version,
       ({_LABEL.format("first_detected_version_id")}) AS first_detected_version,
       ({_LAST_CONFIRMED.format(table=table, resolved=resolved)}) AS last_confirmed_version"""

_LIST_OPEN = f"""
SELECT {_cols("current_resource_drift", "NULL")}, NULL::bigint AS resolved_serial, NULL::timestamptz AS resolved_at, NULL::text AS resolved_how,
       NULL::bigint AS ignore_rule_id, NULL::text AS ignore_reason, NULL::jsonb AS ignore_rules
FROM current_resource_drift WHERE state_id = %s
ORDER BY address, deposed
LIMIT %s
"""

# Open ones first, then the ignored ones, then the resolved ones, latest first.
_LIST_ALL = f"""
SELECT {_cols("resource_drift", "resolved_version_id")}, resolved_serial, resolved_at, resolved_how, ignore_rule_id, ignore_reason,
       (SELECT jsonb_agg(jsonb_build_object('rule', r.id, 'reason', r.reason) ORDER BY r.id)
        FROM drift_ignore_rules r WHERE r.id = ANY(ignore_rule_ids)) AS ignore_rules
FROM resource_drift WHERE state_id = %s
ORDER BY resolved_serial DESC NULLS FIRST, ignore_rule_id NULLS FIRST, address, deposed, first_detected_serial DESC
LIMIT %s
"""

_COUNT_OPEN = "SELECT count(*) FROM current_resource_drift WHERE state_id = %s"
_COUNT_ALL = "SELECT count(*) FROM drift_records WHERE state_id = %s"
_COUNT_IGNORED = "SELECT count(*) FROM resource_drift WHERE state_id = %s AND ignore_rule_id IS NOT NULL"


def list_drift(conn: psycopg.Connection, name: str, limit: int | None = None, *,
               include_resolved: bool = False) -> list[dict[str, Any]]:
    """Raises StateNotFound for an unknown state, so "no drift" and "no such state" differ."""
    sid = state_id(conn, name)
    query = _LIST_ALL if include_resolved else _LIST_OPEN
    return conn.cursor(row_factory=dict_row).execute(query, (sid, limit)).fetchall()


def count_drift(conn: psycopg.Connection, name: str, *, include_resolved: bool = False) -> int:
    sid = state_id(conn, name)
    row = conn.execute(_COUNT_ALL if include_resolved else _COUNT_OPEN, (sid,)).fetchone()
    return int(row[0]) if row else 0


def count_ignored(conn: psycopg.Connection, name: str) -> int:
    """Open records an ignore rule hides: not open drift, but said, so that none is forgotten."""
    row = conn.execute(_COUNT_IGNORED, (state_id(conn, name),)).fetchone()
    return int(row[0]) if row else 0
