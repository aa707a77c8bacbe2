"""Reads of the drift records: `current_resource_drift` (open ones) and `resource_drift` (all).

`kl drift`, the drift API and `kl status`'s open count all read current_resource_drift, so the
count is exactly the rows listed. Records ignore rules hide (migrations 0009, 0012) are not there;
with ``include_resolved`` they come with the rules that hide them (ignore_rule_id and
ignore_reason: the oldest; ignore_rules: every one, ``[{"rule", "reason"}]``).

Every read takes a list of states and answers for all of them in one statement: `kl drift
--states '**'` over 10,000 states is three statements, not three per state.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypedDict, cast

import psycopg
from psycopg.rows import dict_row

from kilolock import drift
from kilolock.store import history
from kilolock.store.states import state_id

if TYPE_CHECKING:
    from uuid import UUID  # a refresh never loads uuid (its import costs start-up)

# A version's label as `kl state versions` writes it: v7 (Terraform's), v7.3 (its third observation).
VERSION_LABEL = "SELECT 'v' || v.serial || COALESCE('.' || v.observation_number, '') FROM state_versions v WHERE v.id = {}"
# The latest observation before the record's resolution (any, while it is open) that was of the
# version the drift is against: it saw the drift still there, or it would have resolved it.
_LAST_CONFIRMED = """SELECT 'v' || c.serial || '.' || c.observation_number FROM state_versions c
       WHERE c.state_id = {table}.state_id AND c.kind = 'observation' AND c.serial = {table}.detected_serial
         AND c.seq <= COALESCE((SELECT r.seq FROM state_versions r WHERE r.id = {resolved}), 9223372036854775807)
       ORDER BY c.seq DESC LIMIT 1"""


def drift_columns(table: str, resolved: str) -> str:
    """A drift row's columns as `kl drift` reads them from TABLE, with its versions' labels (v7.3)."""
    return f"""address, deposed, drift_kind, type, provider, detected_serial, detected_at, previous_attributes, current_attributes,
       previous_sensitive_attributes, current_sensitive_attributes, refresh_run_id, first_detected_serial,
       first_detected_at, last_confirmed_serial, open_for, changed_attributes,
       ({VERSION_LABEL.format("detected_version_id")}) AS detected_version,
       ({VERSION_LABEL.format("first_detected_version_id")}) AS first_detected_version,
       ({_LAST_CONFIRMED.format(table=table, resolved=resolved)}) AS last_confirmed_version"""

# A state's rows numbered in its order (k), so a per-state limit is one filter over all of them.
_LIST_OPEN = f"""
SELECT * FROM (
    SELECT state_id::text AS sid, {drift_columns("current_resource_drift", "NULL")}, NULL::bigint AS resolved_serial, NULL::timestamptz AS resolved_at,
           NULL::text AS resolved_how, NULL::bigint AS ignore_rule_id, NULL::text AS ignore_reason,
           NULL::jsonb AS ignore_rules, row_number() OVER (PARTITION BY state_id ORDER BY address, deposed) AS k
    FROM current_resource_drift WHERE state_id = ANY(%(sids)s::uuid[])) x
WHERE %(limit)s::bigint IS NULL OR k <= %(limit)s
ORDER BY sid, k
"""

# Open ones first, then the ignored ones, then the resolved ones, latest first.
_LIST_ALL = f"""
SELECT * FROM (
    SELECT state_id::text AS sid, {drift_columns("resource_drift", "resolved_version_id")}, resolved_serial, resolved_at, resolved_how, ignore_rule_id, ignore_reason,
           (SELECT jsonb_agg(jsonb_build_object('rule', r.id, 'reason', r.reason) ORDER BY r.id)
            FROM drift_ignore_rules r WHERE r.id = ANY(ignore_rule_ids)) AS ignore_rules,
           row_number() OVER (PARTITION BY state_id ORDER BY resolved_serial DESC NULLS FIRST, ignore_rule_id NULLS FIRST,
                                                             address, deposed, first_detected_serial DESC) AS k
    FROM resource_drift WHERE state_id = ANY(%(sids)s::uuid[])) x
WHERE %(limit)s::bigint IS NULL OR k <= %(limit)s
ORDER BY sid, k
"""

# current_resource_drift is resource_drift's unresolved records no rule hides: counted from the
# same rows, the open count is exactly what _LIST_OPEN lists.
_COUNTS = """
SELECT state_id::text AS sid,
       count(*) FILTER (WHERE resolved_version_id IS NULL AND ignore_rule_id IS NULL) AS open,
       count(*) AS total,
       count(*) FILTER (WHERE ignore_rule_id IS NOT NULL) AS ignored
FROM resource_drift WHERE state_id = ANY(%(sids)s::uuid[])
GROUP BY state_id
"""


# Every state's open drift as one jsonb object, {state id: count}, states without any left out:
# a fleet-wide view reads it once and looks each state up (``(o ->> s.id::text)::bigint``). Counted
# through the view per state it cost 90 us a state; joined as rows, the planner, blind to how many
# records are open (the ignore rules' filter), chose a nested loop over every pair of state and
# drifting state.
OPEN_BY_STATE = """
SELECT COALESCE(jsonb_object_agg(state_id, n), '{}') FROM (SELECT state_id, count(*) AS n FROM current_resource_drift GROUP BY state_id) c
"""


@dataclass(frozen=True)
class Counts:
    """A state's drift records counted as `kl drift` and `kl status` count them."""

    open: int  # what `kl drift` lists and `kl status` says
    total: int  # every record, resolved and ignored ones too
    ignored: int  # open records an ignore rule hides: not open drift, but said, so that none is forgotten


_NONE = Counts(0, 0, 0)


def _uuid_array(sids: list[str]) -> str:
    """SIDS as one array literal for ``%s::uuid[]``: psycopg adapts a list element by element in
    Python, 57 ms for 10,000 ids, each time they are sent. A uuid's text needs no quoting."""
    return "{" + ",".join(sids) + "}"


class DriftRow(TypedDict):
    """A drift record as `kl drift` reads it (drift_columns, then its resolution and ignore rule):
    the object's attributes and sensitivity marks before and now are the state's JSON."""

    address: str
    deposed: str
    drift_kind: str  # changed, deleted
    type: str
    provider: str
    detected_serial: int
    detected_at: datetime
    previous_attributes: Any
    current_attributes: Any
    previous_sensitive_attributes: Any
    current_sensitive_attributes: Any
    refresh_run_id: UUID | None
    first_detected_serial: int
    first_detected_at: datetime
    last_confirmed_serial: int | None
    open_for: timedelta
    changed_attributes: list[str] | None
    detected_version: str  # v7 or v7.3
    first_detected_version: str
    last_confirmed_version: str | None
    resolved_serial: int | None
    resolved_at: datetime | None
    resolved_how: str | None
    ignore_rule_id: int | None
    ignore_reason: str | None
    ignore_rules: list[dict[str, Any]] | None  # JSON: rule, reason


def rows_of(conn: psycopg.Connection, sids: list[str], limit: int | None = None, *,
            include_resolved: bool = False) -> dict[str, list[DriftRow]]:
    """The records of each state in SIDS (open ones, or all), at most LIMIT per state; a state
    without any is absent."""
    out: dict[str, list[DriftRow]] = {}
    cur = conn.cursor(row_factory=dict_row)
    query = _LIST_ALL if include_resolved else _LIST_OPEN
    for r in cur.execute(query, {"sids": _uuid_array(sids), "limit": limit}).fetchall():
        del r["k"]
        sid = r.pop("sid")
        out.setdefault(sid, []).append(cast(DriftRow, r))  # the columns the query names, less sid and k
    return out


def counts_of(conn: psycopg.Connection, sids: list[str]) -> dict[str, Counts]:
    """The counts of each state in SIDS; a state without any record is absent (``counts_of(...).get(sid, NONE)``)."""
    return {r[0]: Counts(int(r[1]), int(r[2]), int(r[3]))
            for r in conn.execute(_COUNTS, {"sids": _uuid_array(sids)}).fetchall()}


def documents(conn: psycopg.Connection, states: list[tuple[str, str]], limit: int | None = None, *,
              include_resolved: bool = False) -> list[dict[str, Any]]:
    """The drift document (kilolock.drift.document) of each (name, id) in STATES, in that order:
    one snapshot, so each document's rows and counts agree."""
    sids = [sid for _, sid in states]
    with conn.transaction():
        rows = rows_of(conn, sids, limit, include_resolved=include_resolved)
        counts = counts_of(conn, sids)
        # The providers' schemas shape the paths (single.n, tags["env"], sets as sets).
        schemas = history.cached_schemas(conn, drift.schema_keys(r for found in rows.values() for r in found))
    out = []
    for name, sid in states:
        c = counts.get(sid, _NONE)
        out.append(drift.document(name, rows.get(sid, []), total=c.total if include_resolved else c.open, open_count=c.open,
                                  ignored_count=c.ignored, include_resolved=include_resolved, schemas=schemas))
    return out


def document(conn: psycopg.Connection, name: str, limit: int | None = None, *,
             include_resolved: bool = False) -> dict[str, Any]:
    """The drift document of state NAME; raises StateNotFound for an unknown state, so "no drift"
    and "no such state" differ."""
    with conn.transaction():
        return documents(conn, [(name, state_id(conn, name))], limit, include_resolved=include_resolved)[0]


def counts(conn: psycopg.Connection, name: str) -> Counts:
    """Raises StateNotFound for an unknown state."""
    sid = state_id(conn, name)
    return counts_of(conn, [sid]).get(sid, _NONE)


def list_drift(conn: psycopg.Connection, name: str, limit: int | None = None, *,
               include_resolved: bool = False) -> list[DriftRow]:
    """Raises StateNotFound for an unknown state."""
    sid = state_id(conn, name)
    return rows_of(conn, [sid], limit, include_resolved=include_resolved).get(sid, [])


def count_drift(conn: psycopg.Connection, name: str, *, include_resolved: bool = False) -> int:
    found = counts(conn, name)
    return found.total if include_resolved else found.open


def count_ignored(conn: psycopg.Connection, name: str) -> int:
    return counts(conn, name).ignored
