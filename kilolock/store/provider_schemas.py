"""The GetProviderSchema cache, keyed by (source, version)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

import psycopg
from psycopg.rows import class_row

from kilolock import schema as sch


@dataclass(frozen=True)
class CachedSchema:
    """One cache entry, without the schema itself (what `kl provider list` shows)."""

    source: str
    version: str
    protocol_version: int
    fetched_at: datetime


_GET = "SELECT schema FROM provider_schemas WHERE source = %s AND version = %s"
_PUT = """
INSERT INTO provider_schemas (source, version, protocol_version, schema) VALUES (%s, %s, %s, %s)
ON CONFLICT (source, version) DO UPDATE SET protocol_version = EXCLUDED.protocol_version,
    schema = EXCLUDED.schema, fetched_at = now()
"""
_LIST = "SELECT source, version, protocol_version, fetched_at FROM provider_schemas ORDER BY source, version"


def get(conn: psycopg.Connection, source: str, version: str) -> sch.ProviderSchema | None:
    row = conn.execute(_GET, (source, version)).fetchone()
    return sch.provider_schema_from_json(row[0]) if row else None


def put(conn: psycopg.Connection, source: str, version: str, ps: sch.ProviderSchema) -> None:
    with conn.transaction():
        conn.execute(_PUT, (source, version, ps.protocol_version, json.dumps(sch.provider_schema_to_json(ps))))


def list_cached(conn: psycopg.Connection) -> list[CachedSchema]:
    return conn.cursor(row_factory=class_row(CachedSchema)).execute(_LIST).fetchall()
