"""The read-only JSON API for tools: states, versions, drift (sensitive values masked), health."""
from __future__ import annotations

from collections.abc import Callable

import psycopg

from kilolock.server.backend import Response, json_body, text
from kilolock.store import db, locks, summary
from kilolock.store import drift as drift_store
from kilolock.store import versions as versions_store
from kilolock.store.errors import StateNotFound


def states(conn: psycopg.Connection, may_read: Callable[[str], bool] | None = None) -> Response:
    """Every state, or with ``may_read`` (a principal's grants) those it may read."""
    held = locks.held(conn)
    rows = summary.list_states(conn)
    if may_read is not None:
        rows = [r for r in rows if may_read(r["name"])]
    for r in rows:
        r["lock"] = held.get(r["name"])
    return json_body(200, {"version": 1, "states": rows})


def _no_such_state(name: str) -> Response:
    # Not StateNotFound's own message: that one suggests a kl command, and an HTTP client gets
    # what the API offers instead.
    return text(404, f"no state named {name!r} (GET /api/v1/states lists them)")


def versions(conn: psycopg.Connection, name: str) -> Response:
    try:
        found = versions_store.list_versions(conn, name)
    except StateNotFound:
        return _no_such_state(name)
    rows = [{"serial": v.serial, "lineage": v.lineage, "source": v.source, "terraform_version": v.terraform_version,
             "actor": v.actor, "created_at": v.created_at, "content_hash": v.content_hash, "encrypted": v.encrypted}
            for v in found]
    return json_body(200, {"version": 1, "state": name, "versions": rows})


def drift_report(conn: psycopg.Connection, name: str, include_resolved: bool = False) -> Response:
    """The drift document of `kl drift --format json [--all]`, sensitive values masked."""
    try:
        return json_body(200, drift_store.document(conn, name, include_resolved=include_resolved))
    except StateNotFound:
        return _no_such_state(name)


def health(conn: psycopg.Connection) -> Response:
    db.ping(conn)
    return json_body(200, {"status": "ok"})
