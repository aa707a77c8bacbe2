"""The read-only JSON API for tools: states, versions, drift (sensitive values masked), health."""
from __future__ import annotations

from typing import Any

import psycopg

from kilolock import drift
from kilolock.server.backend import Response, json_body, text
from kilolock.store import db, locks, summary
from kilolock.store import drift as drift_store
from kilolock.store import versions as versions_store
from kilolock.store.versions import StateNotFound


def states(conn: psycopg.Connection) -> Response:
    held = locks.held(conn)
    rows = summary.list_states(conn)
    for r in rows:
        r["lock"] = held.get(r["name"])
    return json_body(200, {"version": 1, "states": rows})


def versions(conn: psycopg.Connection, name: str) -> Response:
    try:
        found = versions_store.list_versions(conn, name)
    except StateNotFound as exc:
        return text(404, str(exc))
    rows = [{"serial": v.serial, "lineage": v.lineage, "source": v.source, "terraform_version": v.terraform_version,
             "actor": v.actor, "created_at": v.created_at, "content_hash": v.content_hash, "encrypted": v.encrypted}
            for v in found]
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
    db.ping(conn)
    return json_body(200, {"status": "ok"})
