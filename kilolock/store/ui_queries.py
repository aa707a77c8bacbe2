"""The web UI's reads (kilolock/server/ui): one page, a few statements, each bounded by the page.

Every list is paginated here (LIMIT/OFFSET with a total), sorting is by a fixed set of columns,
and nothing loads a state document: instances, history, drift and search are answered from the
lifecycle index (`resources`), `state_versions`' own columns and the drift records. A caller passes
the states a principal may see; these functions never decide that.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict

import psycopg
from psycopg import sql
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

from kilolock.store.drift import OPEN_BY_STATE, VERSION_LABEL, drift_columns
from kilolock.store.errors import StateNotFound
from kilolock.store.versions import current_version_of


@dataclass(frozen=True)
class Page:
    """A page of rows and how many there are in all (with ``more``: more than that, uncounted)."""

    rows: list[dict[str, Any]]
    total: int
    more: bool = False


def _dicts(conn: psycopg.Connection) -> psycopg.Cursor[dict[str, Any]]:
    return conn.cursor(row_factory=dict_row)


# How far a read replica is behind its primary, as it knows it: 0 when it has replayed all the WAL
# it received (an idle primary sends none, and the age of the last replayed commit would then grow
# with no write missing), else the age of the last commit it replayed. None on a primary.
_REPLICA_LAG = """
SELECT CASE WHEN NOT pg_is_in_recovery() THEN NULL
            WHEN pg_last_wal_receive_lsn() = pg_last_wal_replay_lsn() THEN 0.0
            ELSE greatest(0.0, extract(epoch FROM now() - pg_last_xact_replay_timestamp()))::float8 END
"""


def replica_lag(conn: psycopg.Connection) -> float | None:
    """Seconds a read replica's data is behind its primary; None when CONN is not a replica."""
    row = conn.execute(_REPLICA_LAG).fetchone()
    return None if row is None or row[0] is None else float(row[0])


def read_only_snapshot(conn: psycopg.Connection) -> None:
    """Make the caller's open transaction one read-only snapshot: a page's lists agree with each
    other, and nothing a page runs can write. Without JIT: a page's statements read a page of
    rows, but their correlated subqueries inflate the planner's cost estimates past jit_above_cost,
    and compiling them took 2.4 s of a 2.4 s search that ran in 40 ms (10,000 instances). Each
    statement planned for its parameters: they carry the states the viewer may see, and the generic
    plan PostgreSQL switches to once psycopg has prepared a statement (its sixth run on a pooled
    connection) knows neither how many nor which; sorted by drift at 10,000 states, it took 12-16 s
    where a plan for the names took 60 ms."""
    conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    conn.execute("SET LOCAL jit = off")
    conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")


def state_names(conn: psycopg.Connection) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT name FROM states ORDER BY name").fetchall()]


# --- states overview ---------------------------------------------------------------------------

# The sort key of each state: only it is read for every state the caller may see; the page's
# other columns are read for its rows alone, so a page of 50 costs the same among 10,000 states
# but for its key. A sort by open drift reads every state's count at once (store.drift.OPEN_BY_STATE);
# MATERIALIZED keeps that object out of the rows sorted (each would carry a copy of it).
_CURRENT_SERIAL = "(SELECT v.{col} FROM state_versions v WHERE v.state_id = s.id AND v.kind = 'terraform' ORDER BY v.serial DESC LIMIT 1)"
OVERVIEW_SORTS = {
    "name": "s.name",
    "serial": _CURRENT_SERIAL.format(col="serial"),
    "resources": "s.instance_count",  # kept on the row (migration 0023): counting took 0.6 s at 1,000,000 instances
    "drift": "COALESCE((d.open_drift ->> s.id::text)::bigint, 0)",
    "refreshed": "(SELECT x.started_at FROM refresh_runs x WHERE x.state_id = s.id ORDER BY x.started_at DESC LIMIT 1)",
    "updated": _CURRENT_SERIAL.format(col="created_at"),
}

_DRIFT_COUNTS = sql.SQL("CROSS JOIN ({open}) d(open_drift)").format(open=sql.SQL(OPEN_BY_STATE))

_OVERVIEW = sql.SQL("""
WITH keyed AS MATERIALIZED (
    SELECT s.id, s.name, s.instance_count, {order} AS sort_key
    FROM states s
    {drift_counts}
    WHERE (%(readable)s::text[] IS NULL OR s.name ~ ANY(%(readable)s::text[]))
      AND (%(regex)s::text IS NULL OR s.name ~ %(regex)s)
), page AS (
    SELECT id, name, instance_count, sort_key, count(*) OVER () AS total FROM keyed
    ORDER BY sort_key {direction} NULLS LAST, name
    LIMIT %(limit)s OFFSET %(offset)s
)
SELECT p.name, v.serial, v.created_at AS updated_at, COALESCE(v.encrypted, false) AS encrypted,
       p.instance_count AS resources, (SELECT count(*) FROM current_resource_drift d WHERE d.state_id = p.id) AS open_drift,
       rr.started_at AS last_refresh_at, rr.status AS last_refresh_status,
       now() - rr.started_at AS last_refresh_age,
       l.who AS lock_who, l.operation AS lock_operation, l.created_at AS locked_at, p.total
FROM page p
LEFT JOIN LATERAL ({current}) v ON true
LEFT JOIN LATERAL (SELECT started_at, status FROM refresh_runs x WHERE x.state_id = p.id
                   ORDER BY started_at DESC LIMIT 1) rr ON true
LEFT JOIN state_locks l ON l.state_id = p.id
ORDER BY p.sort_key {direction} NULLS LAST, p.name
""")


def states_overview(conn: psycopg.Connection, readable: list[str] | None, name_regex: str | None, sort: str,
                    descending: bool, limit: int, offset: int) -> Page:
    """The states the caller may see (whose name matches one of the anchored regexes READABLE, or
    every state for None) whose name matches NAME_REGEX (a PostgreSQL regex from kilolock.globs, or
    None), sorted by one of OVERVIEW_SORTS. The grants' regexes, not the names they allow: 10,000
    names sent and matched cost 20 ms of a page that then read 9 ms."""
    query = _OVERVIEW.format(current=current_version_of(sql.SQL("p.id")), order=sql.SQL(OVERVIEW_SORTS[sort]),
                             direction=sql.SQL("DESC" if descending else "ASC"),
                             drift_counts=_DRIFT_COUNTS if sort == "drift" else sql.SQL(""))
    params = {"readable": readable, "regex": name_regex}
    rows = _dicts(conn).execute(query, {**params, "limit": limit, "offset": offset}).fetchall()
    return _paged(rows, conn, query, params, offset)


def _paged(rows: list[dict[str, Any]], conn: psycopg.Connection, query: sql.Composed | str,
           params: dict[str, Any], offset: int) -> Page:
    """A page with its total from the window count; past the last row the count comes from the
    first row again, so a page number out of range still says how many there are."""
    if rows:
        total = int(rows[0]["total"])
        for r in rows:
            del r["total"]
        return Page(rows, total)
    if offset == 0:
        return Page([], 0)
    again = _dicts(conn).execute(query, {**params, "limit": 1, "offset": 0}).fetchall()
    return Page([], int(again[0]["total"]) if again else 0)


# --- one state ---------------------------------------------------------------------------------

_HEADER = sql.SQL("""
SELECT s.id::text AS id, s.name, v.serial, v.lineage, v.terraform_version, v.created_at AS updated_at,
       COALESCE(v.encrypted, false) AS encrypted, v.unindexed,
       (SELECT count(*) FROM state_versions x WHERE x.state_id = s.id) AS versions,
       (SELECT count(*) FROM resources r WHERE r.state_id = s.id AND r.delete_serial IS NULL) AS resources,
       (SELECT count(*) FROM current_resource_drift d WHERE d.state_id = s.id) AS open_drift,
       -- open records ignore rules hide, as kl drift counts them: left out of open_drift, said apart
       (SELECT count(*) FROM resource_drift d WHERE d.state_id = s.id AND d.ignore_rule_id IS NOT NULL) AS ignored_drift,
       l.who AS lock_who, l.operation AS lock_operation, l.created_at AS locked_at
FROM states s
LEFT JOIN LATERAL ({current}) v ON true
LEFT JOIN state_locks l ON l.state_id = s.id
WHERE s.name = %s
""").format(current=current_version_of(sql.SQL("s.id")))


class StateHeader(TypedDict):
    """The head of a state's page: its current version (None fields before the first), counts and lock."""

    id: str
    name: str
    serial: int | None
    lineage: str | None
    terraform_version: str | None
    updated_at: datetime | None
    encrypted: bool
    unindexed: bool | None
    versions: int
    resources: int
    open_drift: int
    ignored_drift: int  # open records ignore rules hide
    lock_who: str | None
    lock_operation: str | None
    locked_at: datetime | None


def state_header(conn: psycopg.Connection, name: str) -> StateHeader:
    row = conn.cursor(row_factory=class_row(StateHeader)).execute(_HEADER, (name,)).fetchone()
    if row is None:
        raise StateNotFound(name)
    return row


# What each version changed, from the lifecycle rows it opened and closed (both indexed by
# version): opened and closed at one address by one version is a change; opened alone, added;
# closed alone, removed. The page of versions is cut first, so the cost is what the page's
# versions changed, not the history's.
# Each run of observations that confirmed their base unchanged (no document of their own) is one
# row, as `kl state versions` folds them: a 30 s schedule writes thousands of them, and a page of
# "confirmed" rows would push every version that changed something off the page. A run is the
# confirmations between two other rows (nothing else interrupts them, so they share a base).
_VERSIONS = """
WITH marked AS (
    SELECT id, seq, serial, kind, observation_number, source, actor, created_at, encrypted, unindexed, terraform_version,
           kind = 'observation' AND raw_state IS NULL AND head_piece IS NULL AS confirms
    FROM state_versions WHERE state_id = %(sid)s),
grouped AS (
    SELECT *, sum(CASE WHEN confirms THEN 0 ELSE 1 END) OVER (ORDER BY seq) AS run FROM marked),
folded AS (
    SELECT (array_agg(id ORDER BY seq DESC))[1] AS id, max(seq) AS seq, count(*) AS confirmed,
           (array_agg(observation_number ORDER BY seq))[1] AS first_number,
           count(*) OVER () AS total
    FROM grouped GROUP BY run, confirms
    ORDER BY max(seq) DESC
    LIMIT %(limit)s OFFSET %(offset)s)
SELECT v.serial,
       CASE WHEN v.kind = 'terraform' THEN 'v' || v.serial
            WHEN f.confirmed > 1 THEN 'v' || v.serial || '.' || f.first_number || '-v' || v.serial || '.' || v.observation_number
            ELSE 'v' || v.serial || '.' || v.observation_number END AS label,
       v.kind, v.source, v.actor, v.created_at, v.encrypted, v.unindexed, v.terraform_version,
       CASE WHEN m.confirms THEN f.confirmed ELSE 0 END AS confirmed,
       CASE WHEN v.kind = 'observation' THEN 0 ELSE o.n - b.n END AS added,
       CASE WHEN v.kind = 'observation' THEN ob.changed ELSE b.n END AS changed,
       CASE WHEN v.kind = 'observation' THEN ob.gone ELSE c.n - b.n END AS removed, f.total
FROM folded f JOIN state_versions v ON v.id = f.id JOIN marked m ON m.id = f.id
LEFT JOIN LATERAL (SELECT count(*) AS n FROM resources r WHERE r.opened_by_version_id = v.id) o ON true
LEFT JOIN LATERAL (SELECT count(*) AS n FROM resources r WHERE r.closed_by_version_id = v.id) c ON true
LEFT JOIN LATERAL (SELECT count(*) AS n FROM resources r JOIN resources p
                   ON p.closed_by_version_id = v.id AND p.address = r.address AND p.deposed = r.deposed
                   WHERE r.opened_by_version_id = v.id) b ON true
-- An observation's counts are what it found different from its base.
LEFT JOIN LATERAL (SELECT count(*) FILTER (WHERE NOT x.gone) AS changed, count(*) FILTER (WHERE x.gone) AS gone
                   FROM observed_objects x WHERE x.observation_id = v.id) ob ON true
ORDER BY f.seq DESC
"""


def versions_page(conn: psycopg.Connection, sid: str, limit: int, offset: int) -> Page:
    """Newest first, each with what it added, changed and removed; runs of confirmations folded
    (``confirmed``: how many a row stands for, 0 for a row that is no confirmation)."""
    params = {"sid": sid}
    rows = _dicts(conn).execute(_VERSIONS, {**params, "limit": limit, "offset": offset}).fetchall()
    return _paged(rows, conn, _VERSIONS, params, offset)


# refresh_runs does not record --dry-run: a run that succeeded without a version is one, since
# every other run that succeeds records an observation or a version.
_RUNS = """
SELECT rr.id::text AS id, rr.status, rr.started_at, rr.finished_at, rr.finished_at - rr.started_at AS took,
       (rr.status = 'succeeded' AND rr.to_version_id IS NULL) AS dry_run,
       rr.resources_checked, rr.resources_changed, rr.resources_failed, rr.error_summary, rr.actor,
       f.serial AS from_serial, CASE WHEN t.kind = 'terraform' THEN t.serial END AS to_serial, CASE WHEN t.kind = 'observation' THEN 'v' || t.serial || '.' || t.observation_number END AS observation, count(*) OVER () AS total
FROM refresh_runs rr
JOIN state_versions f ON f.id = rr.from_version_id
LEFT JOIN state_versions t ON t.id = rr.to_version_id
WHERE rr.state_id = %(sid)s
ORDER BY rr.started_at DESC
LIMIT %(limit)s OFFSET %(offset)s
"""


def runs_page(conn: psycopg.Connection, sid: str, limit: int, offset: int) -> Page:
    params = {"sid": sid}
    rows = _dicts(conn).execute(_RUNS, {**params, "limit": limit, "offset": offset}).fetchall()
    return _paged(rows, conn, _RUNS, params, offset)


# The columns kilolock.drift.entry reads; open drift is never resolved nor ignored.
_OPEN_DRIFT = f"""
SELECT {drift_columns("current_resource_drift", "NULL")},
       (SELECT b.mode FROM drift_records x JOIN resources b ON b.id = x.baseline_resource_id WHERE x.id = drift_id) AS mode,
       NULL::bigint AS resolved_serial, NULL::timestamptz AS resolved_at, NULL::text AS resolved_how,
       NULL::bigint AS ignore_rule_id, NULL::text AS ignore_reason, count(*) OVER () AS total
FROM current_resource_drift WHERE state_id = %(sid)s
ORDER BY address, deposed
LIMIT %(limit)s OFFSET %(offset)s
"""


def open_drift_page(conn: psycopg.Connection, sid: str, limit: int, offset: int) -> Page:
    """Open drift as store.drift.list_drift reads it (the rows `kl drift` lists), a page of it."""
    params = {"sid": sid}
    rows = _dicts(conn).execute(_OPEN_DRIFT, {**params, "limit": limit, "offset": offset}).fetchall()
    return _paged(rows, conn, _OPEN_DRIFT, params, offset)


_RULES_FOR = """
SELECT r.id, r.states_glob, r.address_glob, r.path, r.reason, r.created_at, r.created_by, r.expires_at,
       (SELECT count(*) FROM resource_drift d WHERE d.state_id = %(sid)s AND r.id = ANY(d.ignore_rule_ids)) AS hides
FROM drift_ignore_rules r
WHERE %(name)s ~ r.states_regex AND (r.expires_at IS NULL OR r.expires_at > now())
ORDER BY r.id
"""


class RuleFor(TypedDict):
    id: int
    states_glob: str
    address_glob: str
    path: str | None
    reason: str | None
    created_at: datetime
    created_by: str | None
    expires_at: datetime | None
    hides: int  # records of the state it hides


def ignore_rules_for(conn: psycopg.Connection, sid: str, name: str) -> list[RuleFor]:
    """The unexpired ignore rules whose state glob matches NAME, with how many open records each hides."""
    return conn.cursor(row_factory=class_row(RuleFor)).execute(_RULES_FOR, {"sid": sid, "name": name}).fetchall()


# Open drift at each of the state's last versions, counted as the badge counts it: what is open
# now comes from current_resource_drift (so records an ignore rule hides are left out, and the last
# point is the state's open drift), what was resolved from drift_records (ignore rules apply to
# open records only, and are not historical). One pass makes a +1/-1 per serial; each version sums
# those up to its serial (a record is resolved only after it was found, so found-by-then minus
# resolved-by-then is what is open then).
# A point a version: Terraform's and the observations of it (v8, v8.1, v8.2), so the chart moves
# with the refreshes that find drift, not only with applies. A record counts from the version that
# first detected it until the one that resolved it; open ones as current_resource_drift shows them
# (ignore rules applied there), resolved ones whatever rules say now.
_DRIFT_SERIES = """
WITH pts AS (
    SELECT serial, COALESCE(observation_number, 0) AS obs, created_at, source,
           'v' || serial || COALESCE('.' || observation_number, '') AS label
    FROM state_versions WHERE state_id = %(sid)s
    ORDER BY serial DESC, COALESCE(observation_number, 0) DESC LIMIT %(points)s
),
deltas AS MATERIALIZED (
    SELECT v.serial, COALESCE(v.observation_number, 0) AS obs, sum(e.d) AS d
    FROM (SELECT d.first_detected_version_id AS vid, 1 AS d FROM drift_records d
          WHERE d.state_id = %(sid)s
            AND (d.resolved_version_id IS NOT NULL
                 OR d.id IN (SELECT c.drift_id FROM current_resource_drift c WHERE c.state_id = %(sid)s))
          UNION ALL
          SELECT d.resolved_version_id, -1 FROM drift_records d
          WHERE d.state_id = %(sid)s AND d.resolved_version_id IS NOT NULL) e
    JOIN state_versions v ON v.id = e.vid
    GROUP BY 1, 2
)
SELECT p.serial, p.label, p.created_at, p.source,
       COALESCE((SELECT sum(x.d) FROM deltas x WHERE (x.serial, x.obs) <= (p.serial, p.obs)), 0)::bigint AS open
FROM pts p
ORDER BY p.serial, p.obs
"""


class SeriesPoint(TypedDict):
    serial: int
    label: str  # v8, or v8.1 for an observation of it
    created_at: datetime
    source: str
    open: int


def drift_series(conn: psycopg.Connection, sid: str, points: int) -> list[SeriesPoint]:
    return conn.cursor(row_factory=class_row(SeriesPoint)).execute(_DRIFT_SERIES, {"sid": sid, "points": points}).fetchall()


# --- a resource instance's lifecycle --------------------------------------------------------------

_LIFECYCLES = """
SELECT r.address, r.deposed, r.mode, r.type, r.provider, r.status, r.attributes, r.sensitive_attributes,
       r.create_serial, r.delete_serial,
       o.source AS opened_source, o.actor AS opened_actor, o.created_at AS opened_at,
       c.source AS closed_source, c.actor AS closed_actor, c.created_at AS closed_at,
       count(*) OVER () AS total
FROM resources r
JOIN state_versions o ON o.id = r.opened_by_version_id
LEFT JOIN state_versions c ON c.id = r.closed_by_version_id
WHERE r.state_id = %(sid)s AND r.address = %(address)s AND r.deposed = %(deposed)s
ORDER BY r.create_serial DESC
LIMIT %(limit)s OFFSET %(offset)s
"""


def lifecycles_page(conn: psycopg.Connection, sid: str, address: str, deposed: str, limit: int, offset: int) -> Page:
    """The instance's lifecycles, newest first; a caller asks for one more than it shows, to
    compare the oldest shown with the one before it."""
    params = {"sid": sid, "address": address, "deposed": deposed}
    rows = _dicts(conn).execute(_LIFECYCLES, {**params, "limit": limit, "offset": offset}).fetchall()
    return _paged(rows, conn, _LIFECYCLES, params, offset)


_DRIFT_AT = f"""
SELECT drift_kind, first_detected_serial, ({VERSION_LABEL.format("first_detected_version_id")}) AS first_detected_version,
       first_detected_at, detected_serial, resolved_serial,
       ({VERSION_LABEL.format("resolved_version_id")}) AS resolved_version, resolved_at, resolved_how,
       ignore_rule_id, changed_attributes
FROM resource_drift
WHERE state_id = %s AND address = %s AND deposed = %s
ORDER BY first_detected_serial DESC
LIMIT 100
"""


class DriftAt(TypedDict):
    """A drift record of one instance as its page shows it, dated by version labels (v8.1) as kl drift dates it."""

    drift_kind: str
    first_detected_serial: int
    first_detected_version: str
    first_detected_at: datetime
    detected_serial: int
    resolved_serial: int | None
    resolved_version: str | None
    resolved_at: datetime | None
    resolved_how: str | None
    ignore_rule_id: int | None
    changed_attributes: list[str] | None


def drift_at(conn: psycopg.Connection, sid: str, address: str, deposed: str) -> list[DriftAt]:
    """The drift records of one instance, latest first (at most 100)."""
    return conn.cursor(row_factory=class_row(DriftAt)).execute(_DRIFT_AT, (sid, address, deposed)).fetchall()


_INSTANCES = """
SELECT r.address, r.deposed, r.mode, r.type, r.provider, r.create_serial, count(*) OVER () AS total
FROM resources r
WHERE r.state_id = %(sid)s AND r.delete_serial IS NULL
ORDER BY r.address, r.deposed
LIMIT %(limit)s OFFSET %(offset)s
"""


def instances_page(conn: psycopg.Connection, sid: str, limit: int, offset: int) -> Page:
    """The state's current instances, by address."""
    params = {"sid": sid}
    rows = _dicts(conn).execute(_INSTANCES, {**params, "limit": limit, "offset": offset}).fetchall()
    return _paged(rows, conn, _INSTANCES, params, offset)


# --- search across states ------------------------------------------------------------------------


@dataclass(frozen=True)
class Search:
    """What to look for among the current instances of some states; every part is optional."""

    # None: every state (a list of every one costs its length at each row the search reads)
    state_ids: list[str] | None
    type: str | None = None
    address_regex: str | None = None  # kilolock.globs.address_regex
    provider: str | None = None  # a substring of the provider address, case-insensitive
    path: list[str] | None = None  # the attribute path as jsonb path steps ({tags,env}, {rule,0,cidr})
    value: str | None = None  # a JSON document the value at PATH must equal
    exclude_types: tuple[str, ...] = ()  # types whose schema calls PATH secret
    # Types whose schema stores the value at PATH elsewhere (under a dynamic value's wrapper): the
    # jsonb paths to look at instead, one per cached schema of the type.
    stored_paths: Mapping[str, list[list[str]]] = field(default_factory=dict)
    # A document the attributes contain wherever VALUE is at PATH (attrsearch.containing), which the
    # attribute index answers; with ``exact``, containing it is holding the value. None: no such
    # document (a path through a list index, or a type storing the value elsewhere).
    contains: str | None = None
    exact: bool = False


# At most this many matches of a search are counted: past it the page says "more than". Counting
# every match of a search that matches a million instances took 1.9 s; the first page walks the
# states by name and stops when it is full.
SEARCH_COUNT_CAP = 10_000


_SEARCH_FILTERS = """
FROM resources r JOIN states st ON st.id = r.state_id
WHERE r.delete_serial IS NULL AND (%(ids)s::uuid[] IS NULL OR r.state_id = ANY(%(ids)s::uuid[]))
  AND (%(type)s::text IS NULL OR r.type = %(type)s)
  AND (%(address)s::text IS NULL OR r.address ~ %(address)s)
  AND (%(provider)s::text IS NULL OR strpos(lower(r.provider), lower(%(provider)s)) > 0)
"""

_SEARCH_WHERE = f"""{_SEARCH_FILTERS}
  AND (%(contains)s::jsonb IS NULL OR r.attributes @> %(contains)s::jsonb)
  AND (%(path)s::text[] IS NULL OR (
        (%(exact)s OR CASE WHEN %(stored)s::jsonb ? r.type
             THEN EXISTS (SELECT 1 FROM jsonb_array_elements(%(stored)s::jsonb -> r.type) p(steps)
                          WHERE r.attributes #> ARRAY(SELECT jsonb_array_elements_text(p.steps)) = %(value)s::jsonb)
             ELSE r.attributes #> %(path)s::text[] = %(value)s::jsonb END)
        AND NOT (r.type = ANY(%(exclude)s::text[]))
        AND (r.sensitive_attributes = '[]'::jsonb OR NOT kl_marks_touch(r.sensitive_attributes, %(path)s::text[]))))
"""

# A page of the matches in order, the planner choosing between walking the states by name until the
# page is full (many matches) and gathering the few the indexes find (the attribute index, a type);
# and their count up to SEARCH_COUNT_CAP + 1. Gathered whole, counted and sorted, a search matching
# every one of 1,000,000 instances took 1.9 s; by an attribute alone, read from every row, 3.4 s.
_SEARCH = f"""
SELECT st.name AS state, r.address, r.deposed, r.type, r.provider, r.mode, r.create_serial
{_SEARCH_WHERE}
ORDER BY st.name, r.address, r.deposed
LIMIT %(limit)s OFFSET %(offset)s
"""

_SEARCH_COUNT = f"SELECT count(*) FROM (SELECT 1 {_SEARCH_WHERE} LIMIT %(cap)s) m"

# Every (type, provider, mode) of the open lifecycle rows, a probe of resources_kind_idx each (a
# loose index scan): a few hundred probes where reading which rows hold an attribute was a pass
# over every open instance (5.3 s at 1,000,000).
OPEN_KINDS = """
WITH RECURSIVE k AS (
    (SELECT type, provider, mode FROM resources WHERE delete_serial IS NULL ORDER BY type, provider, mode LIMIT 1)
    UNION ALL
    SELECT n.type, n.provider, n.mode FROM k CROSS JOIN LATERAL (
        SELECT r.type, r.provider, r.mode FROM resources r
        WHERE r.delete_serial IS NULL AND (r.type, r.provider, r.mode) > (k.type, k.provider, k.mode)
        ORDER BY r.type, r.provider, r.mode LIMIT 1) n
)
SELECT provider, mode, type FROM k
WHERE (%(type)s::text IS NULL OR type = %(type)s) AND (%(regex)s::text IS NULL OR type ~ %(regex)s)
  AND (%(source)s::text IS NULL OR kl_provider_source(provider) = %(source)s)
"""


def _search_params(s: Search) -> dict[str, Any]:
    return {"ids": s.state_ids, "type": s.type, "address": s.address_regex, "provider": s.provider,
            "path": s.path, "value": s.value, "exclude": list(s.exclude_types), "stored": Jsonb(dict(s.stored_paths)),
            "contains": s.contains, "exact": s.exact and s.contains is not None}


class SearchKind(TypedDict):
    provider: str
    mode: str
    type: str


def search_kinds(conn: psycopg.Connection, s: Search) -> list[SearchKind]:
    """The (provider, mode, type) of every open instance of S's type, in any state (OPEN_KINDS, a
    probe of an index a kind; reading which rows hold the attribute was a pass over every one):
    whose schemas say where the value is stored and whether it is secret. More kinds
    than the search may match only add hints that match nothing; what a page names of them goes
    through present_types."""
    return conn.cursor(row_factory=class_row(SearchKind)).execute(OPEN_KINDS, {
        "type": s.type, "regex": None, "source": None}).fetchall()


def present_types(conn: psycopg.Connection, state_ids: list[str] | None, types: Sequence[str]) -> list[str]:
    """Those of TYPES with an open instance in the states: what a viewer of them may be told of."""
    rows = conn.execute("SELECT t.type FROM unnest(%(types)s::text[]) t(type) WHERE EXISTS ("
                        "SELECT 1 FROM resources r WHERE r.type = t.type AND r.delete_serial IS NULL "
                        "AND (%(ids)s::uuid[] IS NULL OR r.state_id = ANY(%(ids)s::uuid[]))) ORDER BY t.type",
                        {"types": list(types), "ids": state_ids}).fetchall()
    return [str(r[0]) for r in rows]


def search(conn: psycopg.Connection, s: Search, limit: int, offset: int) -> Page:
    """Current instances matching S, by state and address, and how many (at most SEARCH_COUNT_CAP:
    ``more`` says there are more). A value at a path that a mark of the row covers never matches:
    a search must not tell a secret by its yes or no."""
    params = _search_params(s)
    rows = _dicts(conn).execute(_SEARCH, {**params, "limit": limit, "offset": offset}).fetchall()
    if offset == 0 and len(rows) < limit:
        return Page(rows, len(rows))
    counted = conn.execute(_SEARCH_COUNT, {**params, "cap": SEARCH_COUNT_CAP + 1}).fetchone()
    total = int(counted[0]) if counted else 0
    return Page(rows, min(total, SEARCH_COUNT_CAP), more=total > SEARCH_COUNT_CAP)


def state_ids(conn: psycopg.Connection, names: list[str]) -> list[str]:
    return [str(r[0]) for r in conn.execute("SELECT id::text FROM states WHERE name = ANY(%s)", (names,)).fetchall()]


# --- discovery ---------------------------------------------------------------------------------


def discovery_scopes(conn: psycopg.Connection) -> list[Any]:
    """Every discovery scope's latest finished run (store/discovery_results.ScopeRow)."""
    from kilolock.store import discovery_results

    return list(discovery_results.scopes(conn))


def discovery_run(conn: psycopg.Connection, run_id: str) -> tuple[Any, list[Any]] | None:
    """A discovery run (RunRow) and the objects it listed (ObjectRow); None when there is no such run."""
    import uuid

    from kilolock.store import discovery_results

    try:
        uuid.UUID(run_id)
    except ValueError:
        return None
    run = discovery_results.get(conn, run_id)
    return None if run is None else (run, discovery_results.objects(conn, run_id))
