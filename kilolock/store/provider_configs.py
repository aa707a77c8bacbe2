"""Provider configuration per (state or global, source, alias), and version pins."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg


@dataclass(frozen=True)
class ProviderConfig:
    source: str
    alias: str
    config: dict[str, Any]
    pinned_version: str | None
    state_scoped: bool


def lookup(conn: psycopg.Connection, state_id: str | None, source: str, alias: str) -> ProviderConfig | None:
    """The state's own row wins over the global one."""
    row = conn.execute(
        """SELECT config, pinned_version, state_id IS NOT NULL FROM provider_configs
           WHERE source = %s AND alias = %s AND (state_id = %s OR state_id IS NULL)
           ORDER BY state_id IS NULL LIMIT 1""",
        (source, alias, state_id),
    ).fetchone()
    return ProviderConfig(source, alias, row[0], row[1], row[2]) if row else None


def upsert(conn: psycopg.Connection, state_id: str | None, source: str, alias: str, *,
           config: dict[str, Any] | None = None, pinned_version: str | None = None) -> None:
    with conn.transaction():
        conn.execute(
            """INSERT INTO provider_configs (state_id, source, alias, config, pinned_version) VALUES (%s, %s, %s, %s, %s)
               ON CONFLICT (COALESCE(state_id, '00000000-0000-0000-0000-000000000000'::uuid), source, alias)
               DO UPDATE SET config = CASE WHEN %s THEN EXCLUDED.config ELSE provider_configs.config END,
                             pinned_version = CASE WHEN %s THEN EXCLUDED.pinned_version ELSE provider_configs.pinned_version END,
                             updated_at = now()""",
            (state_id, source, alias, json.dumps(config or {}), pinned_version, config is not None, pinned_version is not None),
        )


def list_all(conn: psycopg.Connection) -> list[tuple[str | None, ProviderConfig]]:
    rows = conn.execute(
        """SELECT s.name, c.source, c.alias, c.config, c.pinned_version FROM provider_configs c
           LEFT JOIN states s ON s.id = c.state_id ORDER BY c.source, c.alias, s.name NULLS FIRST"""
    ).fetchall()
    return [(r[0], ProviderConfig(r[1], r[2], r[3], r[4], r[0] is not None)) for r in rows]
