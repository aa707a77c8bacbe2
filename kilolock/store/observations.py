"""Reading a state's observations (migration 0019): the latest one, and what it found different
from the Terraform version it is based on. Recording one is store/writes.py."""
from __future__ import annotations

from dataclasses import dataclass

import psycopg
from psycopg.rows import class_row

from kilolock.store.versions import VERSION_COLS, VersionRow, version_rows

_LATEST = f"""
SELECT {VERSION_COLS} FROM state_versions WHERE state_id = %s AND kind = 'observation' ORDER BY seq DESC LIMIT 1
"""

# With whether an ignore rule hides the open drift record there (the latest observation's, when it
# is based on Terraform's current version).
_DIFFERENCES = """
SELECT o.address, o.deposed, o.gone,
       COALESCE((SELECT d.ignore_rule_id IS NOT NULL FROM resource_drift d
                 WHERE d.state_id = o.state_id AND d.address = o.address AND d.deposed = o.deposed
                   AND d.resolved_version_id IS NULL LIMIT 1), false) AS ignored
FROM observed_objects o WHERE o.observation_id = %s ORDER BY o.address, o.deposed
"""


_LAST_NUMBER = """
SELECT COALESCE(max(observation_number), 0) FROM state_versions WHERE base_version_id = %s AND kind = 'observation'
"""

_RECORDED_AFTER = f"""
SELECT {VERSION_COLS} FROM state_versions
WHERE base_version_id = %s AND kind = 'observation' AND observation_number > %s AND content_hash = %s
  AND actor IS NOT DISTINCT FROM %s
ORDER BY observation_number LIMIT 1
"""


@dataclass(frozen=True)
class Difference:
    """An object an observation found different from Terraform's version: changed, or gone."""

    address: str
    deposed: str
    gone: bool
    ignored: bool  # an ignore rule hides its drift (what it hides is still what was observed)


def latest(conn: psycopg.Connection, sid: str) -> VersionRow | None:
    return version_rows(conn).execute(_LATEST, (sid,)).fetchone()


def differences(conn: psycopg.Connection, observation_id: str) -> list[Difference]:
    return conn.cursor(row_factory=class_row(Difference)).execute(_DIFFERENCES, (observation_id,)).fetchall()


def last_number(conn: psycopg.Connection, base_id: str) -> int:
    """The number of the latest observation of the version BASE_ID (0: none)."""
    row = conn.execute(_LAST_NUMBER, (base_id,)).fetchone()
    return int(row[0]) if row else 0


def recorded_after(conn: psycopg.Connection, base_id: str, number: int, content_hash: str,
                   actor: str | None) -> VersionRow | None:
    """An observation of BASE_ID numbered after NUMBER with that content and actor: did the one
    whose answer was lost land?"""
    return version_rows(conn).execute(_RECORDED_AFTER, (base_id, number, content_hash, actor)).fetchone()
