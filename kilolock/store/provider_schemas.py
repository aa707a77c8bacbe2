"""The GetProviderSchema cache, keyed by (source, version)."""
from __future__ import annotations

import json

import psycopg

from kilolock import schema as sch


def get(conn: psycopg.Connection, source: str, version: str) -> sch.ProviderSchema | None:
    row = conn.execute("SELECT schema FROM provider_schemas WHERE source = %s AND version = %s", (source, version)).fetchone()
    return sch.provider_schema_from_json(row[0]) if row else None


def put(conn: psycopg.Connection, source: str, version: str, ps: sch.ProviderSchema) -> None:
    with conn.transaction():
        conn.execute(
            """INSERT INTO provider_schemas (source, version, protocol_version, schema) VALUES (%s, %s, %s, %s)
               ON CONFLICT (source, version) DO UPDATE SET protocol_version = EXCLUDED.protocol_version,
                   schema = EXCLUDED.schema, fetched_at = now()""",
            (source, version, ps.protocol_version, json.dumps(sch.provider_schema_to_json(ps))),
        )
