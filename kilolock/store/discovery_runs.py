"""Discovery runs (migration 0025): the audit row of each `kl discover`, and the objects it listed
with what matched them. Written by kilolock.unmanaged.service; read through store/discovery_results.py.

A run's scope is (source, alias, state, type, list config): an unmanaged object is new when the
previous succeeded run of the same scope did not list it as unmanaged, compared by identity (jsonb
equality: one spelling, any key order).
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from kilolock.store import notify

MATCHES = ("managed", "unmanaged", "managed twice")


@dataclass(frozen=True)
class Scope:
    """What a run lists: a provider (its configuration, a state's when STATE is set), a type, and
    the list block's configuration."""

    source: str
    alias: str
    state: str | None
    type: str
    list_config: dict[str, Any]

    @property
    def config_hash(self) -> str:
        text = json.dumps(self.list_config, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True)
class Found:
    """One listed object and what claims it: [{"state", "address", "deposed"}]."""

    identity: dict[str, Any]
    display_name: str
    match: str
    claims: list[dict[str, str]]


_BEGIN = """
INSERT INTO discovery_runs (source, alias, state_id, type, list_config, config_hash, list_limit, actor)
VALUES (%(source)s, %(alias)s, (SELECT id FROM states WHERE name = %(state)s), %(type)s, %(config)s, %(hash)s,
        %(limit)s, %(actor)s)
RETURNING id::text
"""

_OBJECTS = """
INSERT INTO discovered_objects (run_id, position, identity, display_name, match, claims)
SELECT %(run)s, (t.ord - 1)::int, t.o -> 'identity', t.o ->> 'display_name', t.o ->> 'match', t.o -> 'claims'
FROM jsonb_array_elements(%(objects)s::jsonb) WITH ORDINALITY AS t(o, ord)
"""

# The previous succeeded run of the same scope; its unmanaged objects are not new.
_MARK_NEW = """
WITH run AS (SELECT * FROM discovery_runs WHERE id = %(run)s),
previous AS (
    SELECT p.id FROM discovery_runs p, run
    WHERE p.source = run.source AND p.alias = run.alias AND p.type = run.type AND p.config_hash = run.config_hash
      AND p.state_id IS NOT DISTINCT FROM run.state_id AND p.status = 'succeeded' AND p.id <> run.id
    ORDER BY p.started_at DESC LIMIT 1
)
UPDATE discovered_objects o SET is_new = true
WHERE o.run_id = %(run)s AND o.match = 'unmanaged'
  AND NOT EXISTS (SELECT 1 FROM discovered_objects q JOIN previous ON q.run_id = previous.id
                  WHERE q.match = 'unmanaged' AND q.identity = o.identity)
"""

_FINISH = """
UPDATE discovery_runs r SET status = %(status)s, finished_at = now(), error = %(error)s,
    listed = c.listed, managed = c.managed, unmanaged = c.unmanaged, managed_twice = c.twice, new_unmanaged = c.new
FROM (SELECT count(*) AS listed, count(*) FILTER (WHERE match = 'managed') AS managed,
             count(*) FILTER (WHERE match = 'unmanaged') AS unmanaged,
             count(*) FILTER (WHERE match = 'managed twice') AS twice,
             count(*) FILTER (WHERE is_new) AS new
      FROM discovered_objects WHERE run_id = %(run)s) c
WHERE r.id = %(run)s AND r.status = 'running'
"""

# In begin's transaction: a worker that dies at any point after leaves a run its job names, which
# the take-over of the job's expired lease finishes.
_LINK_JOB = "UPDATE fleet_jobs SET discovery_run_id = %s WHERE id = %s AND kind = 'discover' AND status = 'running'"


def begin(conn: psycopg.Connection, scope: Scope, limit: int | None, actor: str | None, *,
          fleet_job: int | None = None) -> str:
    """The run's row, `running`; linked to FLEET_JOB (a worker's discover job) when given."""
    with conn.transaction():
        row = conn.execute(_BEGIN, {"source": scope.source, "alias": scope.alias, "state": scope.state, "type": scope.type,
                                    "config": Jsonb(scope.list_config), "hash": scope.config_hash, "limit": limit,
                                    "actor": actor}).fetchone()
        assert row is not None  # INSERT … RETURNING
        if fleet_job is not None:
            conn.execute(_LINK_JOB, (row[0], fleet_job))
    return str(row[0])


def finish(conn: psycopg.Connection, run_id: str, found: Sequence[Found], *, status: str, error: str | None = None) -> None:
    """Stores what RUN_ID listed and ends it. Only a succeeded run marks its new unmanaged objects
    (and notifies resource.unmanaged of them): a run that failed or was cancelled listed part of
    them, and the next one compares with the last complete listing. A run finished meanwhile (by
    the take-over of a worker that looked dead) is left as it is."""
    payload = [{"identity": f.identity, "display_name": f.display_name, "match": f.match, "claims": f.claims} for f in found]
    with conn.transaction():
        row = conn.execute("SELECT status FROM discovery_runs WHERE id = %s FOR UPDATE", (run_id,)).fetchone()
        if row is None or row[0] != "running":
            return  # finished meanwhile: a worker's take-over found this run's worker dead
        if payload:
            conn.execute(_OBJECTS, {"run": run_id, "objects": Jsonb(payload)})
        if status == "succeeded":
            conn.execute(_MARK_NEW, {"run": run_id})
        conn.execute(_FINISH, {"run": run_id, "status": status, "error": error})
        if status == "succeeded":
            notify.record_discovery_events(conn, run_id)

