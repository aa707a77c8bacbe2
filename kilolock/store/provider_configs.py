"""Provider configuration per (state or global, source, alias), and version pins."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.rows import class_row, dict_row


@dataclass(frozen=True)
class ProviderConfig:
    """A stored provider configuration, for a state or for every state."""

    source: str
    alias: str
    config: dict[str, Any]
    pinned_version: str | None
    state_scoped: bool


_LOOKUP = """
SELECT source, alias, config, pinned_version, state_id IS NOT NULL AS state_scoped FROM provider_configs
WHERE source = %s AND alias = %s AND (state_id = %s OR state_id IS NULL)
ORDER BY state_id IS NULL LIMIT 1
"""

_UPSERT = """
INSERT INTO provider_configs (state_id, source, alias, config, pinned_version) VALUES (%s, %s, %s, %s, %s)
ON CONFLICT (COALESCE(state_id, '00000000-0000-0000-0000-000000000000'::uuid), source, alias)
DO UPDATE SET config = CASE WHEN %s THEN EXCLUDED.config ELSE provider_configs.config END,
              pinned_version = CASE WHEN %s THEN EXCLUDED.pinned_version ELSE provider_configs.pinned_version END,
              updated_at = now()
"""

_LIST = """
SELECT s.name AS state, c.source, c.alias, c.config, c.pinned_version FROM provider_configs c
LEFT JOIN states s ON s.id = c.state_id ORDER BY c.source, c.alias, s.name NULLS FIRST
"""


def lookup(conn: psycopg.Connection, state_id: str | None, source: str, alias: str) -> ProviderConfig | None:
    """The state's own row wins over the global one."""
    return conn.cursor(row_factory=class_row(ProviderConfig)).execute(_LOOKUP, (source, alias, state_id)).fetchone()


def upsert(conn: psycopg.Connection, state_id: str | None, source: str, alias: str, *,
           config: dict[str, Any] | None = None, pinned_version: str | None = None) -> None:
    with conn.transaction():
        conn.execute(
            _UPSERT,
            (state_id, source, alias, json.dumps(config or {}), pinned_version, config is not None, pinned_version is not None),
        )


def list_all(conn: psycopg.Connection) -> list[tuple[str | None, ProviderConfig]]:
    """Every row with the name of its state (None: it applies to all states)."""
    rows = conn.cursor(row_factory=dict_row).execute(_LIST).fetchall()
    return [(r["state"], ProviderConfig(r["source"], r["alias"], r["config"], r["pinned_version"], r["state"] is not None))
            for r in rows]
