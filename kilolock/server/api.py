"""The read-only JSON API for tools: states, versions, drift (sensitive values masked), health."""
from __future__ import annotations

from typing import Any

import psycopg

from kilolock import drift
from kilolock.server.backend import Response, json_body, text
from kilolock.store import drift as drift_store
from kilolock.store import summary
from kilolock.store.versions import StateNotFound, state_id

_LOCKS = "SELECT s.name, l.info FROM state_locks l JOIN states s ON s.id = l.state_id"

_VERSIONS = """
SELECT serial, lineage, source, terraform_version, actor, created_at, content_hash, encrypted
FROM state_versions WHERE state_id = %s ORDER BY serial
"""


def states(conn: psycopg.Connection) -> Response:
    held = {name: info for name, info in conn.execute(_LOCKS).fetchall()}
    rows = summary.list_states(conn)
    for r in rows:
        r["lock"] = held.get(r["name"])
    return json_body(200, {"version": 1, "states": rows})


def versions(conn: psycopg.Connection, name: str) -> Response:
    try:
        sid = state_id(conn, name)
    except StateNotFound as exc:
        return text(404, str(exc))
    keys = ("serial", "lineage", "source", "terraform_version", "actor", "created_at", "content_hash", "encrypted")
    rows = [dict(zip(keys, r)) for r in conn.execute(_VERSIONS, (sid,)).fetchall()]
    return json_body(200, {"version": 1, "state": name, "versions": rows})


def drift_report(conn: psycopg.Connection, name: str) -> Response:
    try:
        rows = drift_store.list_drift(conn, name)
    except StateNotFound as exc:
        return text(404, str(exc))
    out: list[dict[str, Any]] = []
    for r in rows:
        changes = [] if r["drift_kind"] == "deleted" else drift.changes(
            r["previous_attributes"], r["current_attributes"],
            r["previous_sensitive_attributes"], r["current_sensitive_attributes"])
        out.append({"address": r["address"], "deposed": r["deposed"] or None, "kind": r["drift_kind"], "type": r["type"],
                    "detected_serial": r["detected_serial"], "detected_at": r["detected_at"],
                    "refresh_run_id": str(r["refresh_run_id"]) if r["refresh_run_id"] else None,
                    "changes": [{"path": c.path, "before": c.before, "after": c.after} for c in changes]})
    return json_body(200, {"version": 1, "state": name, "total": len(out), "drift": out})


def health(conn: psycopg.Connection) -> Response:
    conn.execute("SELECT 1").fetchone()
    return json_body(200, {"status": "ok"})
