"""Read-only overviews of states for `kl state list` and `kl status`."""
from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, TypedDict, TypeVar

import psycopg
from psycopg import sql
from psycopg.rows import class_row

from kilolock.store.drift import OPEN_BY_STATE
from kilolock.store.states import state_id
from kilolock.store.versions import current_version_of

# The counts are kept on the states row (migration 0023): counted here, they cost 0.6 s at 10,000 states.
_LIST = sql.SQL("""
SELECT s.name, v.serial, s.version_count AS versions, s.instance_count AS resources, v.created_at AS updated_at
FROM states s
LEFT JOIN LATERAL ({current}) v ON true
ORDER BY s.name
""").format(current=current_version_of(sql.SQL("s.id")))

# The API's list, each state's object written by PostgreSQL: built in Python (a dict a row, a
# datetime each for json's fallback) it cost three times the statement at 10,000 states.
# A timestamp is written as datetime.isoformat writes it (json_body's way), in the session's zone:
# six digits of microseconds or none, where to_json trims trailing zeros (…:10.26557+00:00).
_ISOFORMAT = """to_char({t}, 'YYYY-MM-DD"T"HH24:MI:SS')
    || CASE WHEN extract(microseconds FROM {t})::bigint % 1000000 <> 0 THEN to_char({t}, '.US') ELSE '' END
    || to_char({t}, 'TZH:TZM')"""
_LIST_JSON = sql.SQL("""
SELECT s.name, json_build_object('name', s.name, 'serial', v.serial, 'versions', s.version_count,
                                 'resources', s.instance_count, 'updated_at', """ + _ISOFORMAT.format(t="v.created_at") + """,
                                 'lock', l.info)::text AS object
FROM states s
LEFT JOIN LATERAL ({current}) v ON true
LEFT JOIN state_locks l ON l.state_id = s.id
ORDER BY s.name
""").format(current=current_version_of(sql.SQL("s.id")))

# Many states at a glance, in one statement whatever their number: each state's current version
# and last run are index probes, its open drift one lookup in the fleet's counts read once.
_STATUSES = sql.SQL("""
SELECT s.name AS state, v.serial, s.instance_count AS resources,
       COALESCE((d.open ->> s.id::text)::bigint, 0) AS open_drift,
       rr.status AS last_refresh_status, rr.started_at AS last_refresh_at, l.who AS locked_by
FROM states s CROSS JOIN ({open}) d(open)
LEFT JOIN LATERAL ({current}) v ON true
LEFT JOIN LATERAL (SELECT x.status, x.started_at FROM refresh_runs x WHERE x.state_id = s.id
                   ORDER BY x.started_at DESC LIMIT 1) rr ON true
LEFT JOIN state_locks l ON l.state_id = s.id
WHERE s.name ~ %(regex)s
ORDER BY s.name
""").format(open=sql.SQL(OPEN_BY_STATE), current=current_version_of(sql.SQL("s.id")))

_STATUS = sql.SQL("""
SELECT v.serial, v.lineage, v.terraform_version, v.encrypted, v.unindexed,
       (SELECT count(*) FROM state_versions x WHERE x.state_id = %(sid)s) AS versions,
       (SELECT count(*) FROM resources r WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.mode = 'managed') AS managed,
       (SELECT count(*) FROM resources r WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL AND r.mode = 'data') AS data,
       (SELECT count(*) FROM current_resource_drift d WHERE d.state_id = %(sid)s) AS open_drift,
       (SELECT min(d.first_detected_serial) FROM current_resource_drift d
        WHERE d.state_id = %(sid)s) AS open_drift_first_serial,
       -- As kl drift names it: drift a refresh found was first detected at an observation (v7.3).
       (SELECT 'v' || d.first_detected_serial || COALESCE('.' || f.observation_number, '')
        FROM current_resource_drift d LEFT JOIN state_versions f ON f.id = d.first_detected_version_id
        WHERE d.state_id = %(sid)s ORDER BY d.first_detected_serial, d.first_detected_at LIMIT 1) AS open_drift_first_version,
       (SELECT max(now() - d.first_detected_at) FROM current_resource_drift d
        WHERE d.state_id = %(sid)s) AS open_drift_oldest_for,
       (SELECT who FROM state_locks l WHERE l.state_id = %(sid)s) AS locked_by,
       (SELECT info FROM state_locks l WHERE l.state_id = %(sid)s) AS lock
FROM (SELECT 1) one
LEFT JOIN LATERAL ({current}) v ON true
""").format(current=current_version_of(sql.Placeholder("sid")))

_LAST_REFRESH = """
SELECT f.serial AS from_serial, CASE WHEN t.kind = 'terraform' THEN t.serial END AS to_serial, CASE WHEN t.kind = 'observation' THEN 'v' || t.serial || '.' || t.observation_number END AS observation, rr.status, rr.started_at, rr.id::text AS run_id
FROM refresh_runs rr
JOIN state_versions f ON f.id = rr.from_version_id
LEFT JOIN state_versions t ON t.id = rr.to_version_id
WHERE rr.state_id = %s
ORDER BY rr.started_at DESC LIMIT 1
"""


_Row = TypeVar("_Row")


class ListedState(TypedDict):
    """A row of `kl state list`."""

    name: str
    serial: int | None  # None: no version yet
    versions: int
    resources: int
    updated_at: datetime | None


class StateLine(TypedDict):
    """A row of `kl status --states`."""

    state: str
    serial: int | None
    resources: int
    open_drift: int
    last_refresh_status: str | None  # None: never refreshed
    last_refresh_at: datetime | None
    locked_by: str | None


class LastRefresh(TypedDict):
    from_serial: int
    to_serial: int | None  # Terraform's version it wrote (--commit)
    observation: str | None  # or the observation it recorded, "v7.3"
    status: str
    started_at: datetime
    run_id: str


class _StatusRow(TypedDict):
    serial: int | None
    lineage: str | None
    terraform_version: str | None
    encrypted: bool | None
    unindexed: bool | None
    versions: int
    managed: int
    data: int
    open_drift: int
    open_drift_first_serial: int | None
    open_drift_first_version: str | None  # as kl drift names it: v7 or v7.3
    open_drift_oldest_for: timedelta | None
    locked_by: str | None
    lock: dict[str, Any] | None  # the LockInfo


class StateStatus(_StatusRow):
    """`kl status STATE`: the current version (None fields before the first), counts, open drift,
    the lock and the latest refresh run."""

    state: str
    last_refresh: LastRefresh | None


def _fleet_wide(conn: psycopg.Connection, row: type[_Row], query: sql.Composed, params: dict[str, Any] | None = None) -> list[_Row]:
    """QUERY's rows (as ROW) without JIT: a probe a state puts the planner's estimate past
    jit_above_cost from about 10,000 states on, and compiling took 55-85 ms of a statement that ran in 170."""
    with conn.transaction():
        conn.execute("SET LOCAL jit = off")
        return conn.cursor(row_factory=class_row(row)).execute(query, params).fetchall()


def list_states(conn: psycopg.Connection) -> list[ListedState]:
    return _fleet_wide(conn, ListedState, _LIST)


class _NamedObject(TypedDict):
    name: str
    object: str  # JSON text


def states_as_json(conn: psycopg.Connection) -> list[tuple[str, str]]:
    """Every state as (name, its `kl state list --format json` object with its lock's LockInfo,
    as JSON text), in one snapshot."""
    return [(r["name"], r["object"]) for r in _fleet_wide(conn, _NamedObject, _LIST_JSON)]


def states_status(conn: psycopg.Connection, name_regex: str) -> list[StateLine]:
    """`kl status --states`: each state whose name matches NAME_REGEX (kilolock.globs.sql_regex),
    by name: serial, resources, open drift (as `kl status STATE` counts it), its latest refresh
    run and who holds its lock."""
    return _fleet_wide(conn, StateLine, _STATUSES, {"regex": name_regex})


def state_status(conn: psycopg.Connection, name: str) -> StateStatus:
    """``open_drift`` counts exactly the rows `kl drift` lists (both read current_resource_drift)."""
    sid = state_id(conn, name)
    status = conn.cursor(row_factory=class_row(_StatusRow)).execute(_STATUS, {"sid": sid}).fetchone()
    assert status is not None  # FROM (SELECT 1): always one row
    last = conn.cursor(row_factory=class_row(LastRefresh)).execute(_LAST_REFRESH, (sid,)).fetchone()
    return StateStatus(state=name, **status, last_refresh=last)
