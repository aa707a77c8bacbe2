"""Reading discovery runs (migration 0025): a run, the objects it listed, the newest runs, and each
scope's latest finished run, for `kl discover --results`, `kl status`, `/metrics` and the web UI.
Recording them is store/discovery_runs.py."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import class_row


@dataclass(frozen=True)
class RunRow:
    id: str
    source: str
    alias: str
    state: str | None
    type: str
    list_config: dict[str, Any]
    list_limit: int | None
    status: str
    started_at: datetime
    finished_at: datetime | None
    listed: int | None
    managed: int | None
    unmanaged: int | None
    managed_twice: int | None
    new_unmanaged: int | None
    error: str | None
    actor: str | None


@dataclass(frozen=True)
class ObjectRow:
    identity: dict[str, Any]
    display_name: str
    match: str
    claims: list[dict[str, str]]
    is_new: bool


_RUN_COLS = """r.id::text AS id, r.source, r.alias, s.name AS state, r.type, r.list_config, r.list_limit, r.status,
r.started_at, r.finished_at, r.listed, r.managed, r.unmanaged, r.managed_twice, r.new_unmanaged, r.error, r.actor"""
_GET = f"SELECT {_RUN_COLS} FROM discovery_runs r LEFT JOIN states s ON s.id = r.state_id WHERE r.id = %s"
_LATEST = f"""
SELECT {_RUN_COLS} FROM discovery_runs r LEFT JOIN states s ON s.id = r.state_id
WHERE (%(source)s::text IS NULL OR r.source = %(source)s) AND (%(type)s::text IS NULL OR r.type = %(type)s)
ORDER BY r.started_at DESC LIMIT %(limit)s
"""
_RUN_OBJECTS = """
SELECT identity, display_name, match, claims, is_new FROM discovered_objects WHERE run_id = %s ORDER BY position
"""

# The latest finished run of every scope, and when the scope last succeeded: what kl status and
# /metrics report (STATE: only the scopes that use that state's provider config).
_SCOPES = f"""
SELECT DISTINCT ON (r.source, r.alias, r.state_id, r.type, r.config_hash) {_RUN_COLS}, left(r.config_hash, 12) AS config,
       (SELECT extract(epoch FROM max(x.finished_at))::float8 FROM discovery_runs x
        WHERE (x.source, x.alias, x.type, x.config_hash) = (r.source, r.alias, r.type, r.config_hash)
          AND x.state_id IS NOT DISTINCT FROM r.state_id AND x.status = 'succeeded') AS last_success
FROM discovery_runs r LEFT JOIN states s ON s.id = r.state_id
WHERE r.status <> 'running' AND (%(state)s::text IS NULL OR s.name = %(state)s)
ORDER BY r.source, r.alias, r.state_id, r.type, r.config_hash, r.started_at DESC
"""


def get(conn: psycopg.Connection, run_id: str) -> RunRow | None:
    return conn.cursor(row_factory=class_row(RunRow)).execute(_GET, (run_id,)).fetchone()


def latest(conn: psycopg.Connection, source: str | None = None, type_: str | None = None, limit: int = 20) -> list[RunRow]:
    """The newest runs first, of SOURCE and TYPE_ where given."""
    return conn.cursor(row_factory=class_row(RunRow)).execute(
        _LATEST, {"source": source, "type": type_, "limit": limit}).fetchall()


@dataclass(frozen=True)
class ScopeRow(RunRow):
    """A scope's latest finished run (RunRow), its list config's short hash, and when a run of it
    last succeeded (Unix seconds; None: never)."""

    config: str = ""
    last_success: float | None = None


def scopes(conn: psycopg.Connection, state: str | None = None) -> list[ScopeRow]:
    """Every scope's latest finished run; with STATE, of the scopes using that state's provider config."""
    return conn.cursor(row_factory=class_row(ScopeRow)).execute(_SCOPES, {"state": state}).fetchall()


def objects(conn: psycopg.Connection, run_id: str) -> list[ObjectRow]:
    return conn.cursor(row_factory=class_row(ObjectRow)).execute(_RUN_OBJECTS, (run_id,)).fetchall()
