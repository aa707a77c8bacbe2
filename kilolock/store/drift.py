"""Reads of the current_resource_drift view."""
from __future__ import annotations

from typing import Any

import psycopg
from psycopg.rows import dict_row

from kilolock.store.versions import state_id

_LIST = """
SELECT address, deposed, drift_kind, type, detected_serial, detected_at, previous_attributes, current_attributes,
       previous_sensitive_attributes, current_sensitive_attributes, refresh_run_id
FROM current_resource_drift WHERE state_id = %s
ORDER BY address, deposed
LIMIT %s
"""

_COUNT = "SELECT count(*) FROM current_resource_drift WHERE state_id = %s"


def list_drift(conn: psycopg.Connection, name: str, limit: int | None = None) -> list[dict[str, Any]]:
    """Raises StateNotFound for an unknown state, so "no drift" and "no such state" differ."""
    sid = state_id(conn, name)
    return conn.cursor(row_factory=dict_row).execute(_LIST, (sid, limit)).fetchall()


def count_drift(conn: psycopg.Connection, name: str) -> int:
    sid = state_id(conn, name)
    row = conn.execute(_COUNT, (sid,)).fetchone()
    return int(row[0]) if row else 0
