"""The fleet's inventory (`kl resources`, /api/v1/resources): every open instance of some states, as
the `inventory` view (migration 0024) shows it, filtered in SQL and cut into pages by a keyset
(state, address, deposed); and the objects claimed by more than one instance (``duplicates``).

A caller passes the states a principal may see (None: all, for the CLI); these functions never
decide that. A value searched at a path that a mark of the row (or the type's schema: the
caller's ``secret_types``) calls sensitive never matches, as the UI's search: a search must not
tell a secret by its yes or no.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import psycopg
from psycopg import sql
from psycopg.rows import class_row, dict_row
from psycopg.types.json import Jsonb

from kilolock import schema as sch
from kilolock.store.ui_queries import OPEN_KINDS

# The keys of each instance, in this order (docs/inventory.md): the JSON, the CSV header and
# the API's items.
COLUMNS = ("state", "address", "deposed", "mode", "type", "provider", "provider_alias", "id", "identity",
           "identity_schema_version", "evidence", "status", "drift")


class InventoryRow(TypedDict):
    """An open instance as `kl resources` and /api/v1/resources list it (COLUMNS, in order)."""

    state: str
    address: str
    deposed: str | None
    mode: str
    type: str
    provider: str  # the provider's source address
    provider_alias: str | None
    id: str | None  # the object's id attribute
    identity: dict[str, Any] | None  # the resource identity (JSON)
    identity_schema_version: int | None
    evidence: str | None  # 'identity', 'id' or None: what duplicates compare
    status: str
    drift: str | None  # the open drift's kind


class InstanceKind(TypedDict):
    provider: str
    mode: str
    type: str


class Duplicate(TypedDict):
    """An object claimed more than once: how sure (``certain``: one identity; ``likely``: one id
    with matching provider configurations), by what, and every claim (JSON: state, address,
    deposed, provider_alias, id, identity, identity_schema_version)."""

    confidence: str
    evidence: str
    provider: str
    type: str
    key: str  # the identity key, or the id
    claims: list[dict[str, Any]]


class DuplicatesPageRow(Duplicate):
    claims_hash: str  # the group's place in the pages, after its key


@dataclass(frozen=True)
class Where:
    """The value at PATH (jsonb steps) is one of VALUES (JSON texts)."""

    path: list[str]
    values: list[str]
    secret_types: tuple[str, ...] = ()  # types whose schema calls the value at PATH secret: never match
    stored_paths: Mapping[str, list[list[str]]] = field(default_factory=dict)  # attrsearch.Hints.stored_paths
    # Documents the attributes contain wherever one of VALUES is at PATH (attrsearch.containing), which
    # the attribute index answers; with ``exact``, containing one is holding a value. Empty: no such
    # documents (a path through a list index, a type storing the value elsewhere).
    contains: tuple[str, ...] = ()
    exact: bool = False


@dataclass(frozen=True)
class Filters:
    """What `kl resources` and /api/v1/resources select (None: anything)."""

    state_ids: list[str] | None = None  # None: every state
    type: str | None = None  # an exact type
    type_regex: str | None = None  # a PostgreSQL regex (kilolock.globs.sql_regex of a type glob)
    provider_source: str | None = None  # HOST/NAMESPACE/TYPE
    address_regex: str | None = None  # kilolock.globs.address_regex
    wheres: tuple[Where, ...] = ()
    drifted: bool = False
    resource_ids: list[str] | None = None  # among these lifecycle rows only (with_candidates)


_SELECT = """
SELECT i.state_name AS state, i.address, NULLIF(i.deposed, '') AS deposed, i.mode, i.type, i.provider_source AS provider,
       NULLIF(i.provider_alias, '') AS provider_alias, i.id, i.identity, i.identity_schema_version, i.evidence, i.status,
       i.drift_kind AS drift
FROM inventory i
"""

# One --where: the value at the path (or, for a type whose schema stores it elsewhere, at each
# place it may be) is one of the values, the type's schema does not call it secret, and no mark of
# the row covers it or lies inside it.
_WHERE = """(
    CASE WHEN {stored}::jsonb ? i.type
         THEN EXISTS (SELECT 1 FROM jsonb_array_elements({stored}::jsonb -> i.type) p(steps)
                      WHERE i.attributes #> ARRAY(SELECT jsonb_array_elements_text(p.steps)) = ANY({values}::jsonb[]))
         ELSE i.attributes #> {path}::text[] = ANY({values}::jsonb[]) END)"""
_NOT_SECRET = """(NOT (i.type = ANY({secret}::text[]))
    AND (i.sensitive_attributes = '[]'::jsonb OR NOT kl_marks_touch(i.sensitive_attributes, {path}::text[])))"""


def _conditions(f: Filters) -> tuple[sql.Composed, dict[str, Any]]:
    """The WHERE clause of F over the view (as ``i``) and its parameters."""
    parts: list[sql.Composable] = [sql.SQL("true")]
    params: dict[str, Any] = {}

    def add(clause: str, **values: Any) -> None:
        names = {k: f"{k}{len(params)}" for k in values}
        params.update({names[k]: v for k, v in values.items()})
        parts.append(sql.SQL(clause).format(**{k: sql.Placeholder(n) for k, n in names.items()}))

    if f.state_ids is not None:
        add("i.state_id = ANY({ids}::uuid[])", ids=f.state_ids)
    if f.resource_ids is not None:
        add("i.resource_id = ANY({rids}::uuid[])", rids=f.resource_ids)
    if f.type is not None:
        add("i.type = {type}", type=f.type)
    if f.type_regex is not None:
        add("i.type ~ {regex}", regex=f.type_regex)
    if f.provider_source is not None:
        add("i.provider_source = {source}", source=f.provider_source)
    if f.address_regex is not None:
        add("i.address ~ {regex}", regex=f.address_regex)
    for w in f.wheres:
        if w.contains:
            # one test of the index per document, so that the planner can read it for each
            add("(" + " OR ".join(f"i.attributes @> {{d{n}}}::jsonb" for n in range(len(w.contains))) + ")",
                **{f"d{n}": doc for n, doc in enumerate(w.contains)})
        if not w.exact:
            add(_WHERE, stored=Jsonb(dict(w.stored_paths)), values=list(w.values), path=w.path)
        add(_NOT_SECRET, secret=list(w.secret_types), path=w.path)
    if f.drifted:
        parts.append(sql.SQL("i.drift_kind IS NOT NULL"))
    return sql.SQL(" AND ").join(parts), params


def _instances_query(f: Filters, limit: int | None, after: tuple[str, str, str] | None) -> tuple[sql.Composed, dict[str, Any]]:
    where, params = _conditions(f)
    if after is not None:
        # The state's bound said alone as well: the row comparison spans two tables, so no index
        # takes it, and a page deep in the fleet walked every state before it (248 ms halfway
        # through 10,000 states; with the bound 5 ms, as the first page).
        where = sql.SQL("{} AND i.state_name >= %(after_state)s AND (i.state_name, i.address, i.deposed) "
                        "> (%(after_state)s, %(after_address)s, %(after_deposed)s)").format(where)
        params.update(after_state=after[0], after_address=after[1], after_deposed=after[2])
    params["limit"] = limit
    if limit is not None and f.resource_ids is None and f.wheres:
        # Many instances may hold the value (with_candidates): a page walks the states by name and
        # each one's rows until it is full.
        params["walk_states"] = f.state_ids
        return sql.SQL("SELECT w.* FROM states s CROSS JOIN LATERAL ({select} WHERE i.state_id = s.id AND {where} "
                       "ORDER BY i.address, i.deposed LIMIT %(limit)s) w "
                       "WHERE (%(walk_states)s::uuid[] IS NULL OR s.id = ANY(%(walk_states)s::uuid[])) {after} "
                       "ORDER BY s.name, w.address, w.deposed LIMIT %(limit)s").format(
            select=sql.SQL(_SELECT), where=where,
            after=sql.SQL("AND s.name >= %(after_state)s" if after is not None else "")), params
    query = sql.SQL("{select} WHERE {where} ORDER BY i.state_name, i.address, i.deposed LIMIT %(limit)s").format(
        select=sql.SQL(_SELECT), where=where)
    return query, params


# At most this many instances holding a searched value are gathered and sorted; with more, a page
# walks the states in order (it fills soon). The planner cannot tell which through the view's
# attributes (a drift's observed ones over the lifecycle row's): left to itself it gathered and
# sorted 190,000 matches of 1,000,000 for a page (1.2 s), or walked every state for a value no
# instance holds (6 s).
GATHER_AT_MOST = 10_000

# The lifecycle rows that may hold a --where's value ({lifecycle}), and those whose open drift's
# observed attributes may ({observed}): what the page then reads, when there are few.
_CANDIDATES = """
(SELECT id FROM resources WHERE delete_serial IS NULL AND ({lifecycle}) LIMIT %(cap)s)
UNION
SELECT r.id FROM drift_records d
JOIN observed_objects oc ON oc.id = d.current_observed_id AND NOT oc.gone
JOIN resources r ON r.state_id = d.state_id AND r.address = d.address AND r.deposed = d.deposed AND r.delete_serial IS NULL
WHERE d.resolved_version_id IS NULL AND ({observed})
"""


def with_candidates(conn: psycopg.Connection, f: Filters) -> Filters:
    """F narrowed to the lifecycle rows that may hold its first --where's value (one the attribute
    index answers if any: else a read of every open row's value at the path, a type storing it
    elsewhere taken whole), when they are at most GATHER_AT_MOST; F itself otherwise."""
    w = next((w for w in f.wheres if w.contains), f.wheres[0] if f.wheres else None)
    if w is None:
        return f
    lifecycle: sql.Composable
    observed: sql.Composable
    if w.contains:
        # the index read once per document (a test of ANY(...) is not one it takes)
        lifecycle = sql.SQL(" OR ").join(sql.SQL("attributes @> {}::jsonb").format(sql.Literal(d)) for d in w.contains)
        observed = sql.SQL("oc.attributes @> ANY({}::jsonb[])").format(sql.Literal(list(w.contains)))
    else:
        lifecycle = sql.SQL("attributes #> {}::text[] = ANY({}::jsonb[]) OR type = ANY({}::text[])").format(
            sql.Literal(w.path), sql.Literal(list(w.values)), sql.Literal(list(w.stored_paths)))
        observed = sql.SQL("true")  # few: every open drift's observed object
    query = sql.SQL(_CANDIDATES).format(lifecycle=lifecycle, observed=observed)
    ids = [str(r[0]) for r in conn.execute(query, {"cap": GATHER_AT_MOST + 1})]
    return f if len(ids) > GATHER_AT_MOST else Filters(**{**f.__dict__, "resource_ids": ids})


def instances(conn: psycopg.Connection, f: Filters, *, limit: int | None = None,
              after: tuple[str, str, str] | None = None) -> list[InventoryRow]:
    """The open instances matching F, by state, address and deposed key (COLUMNS each): at most
    LIMIT of them, those after AFTER (the (state, address, deposed) of the last one of a page)."""
    with conn.transaction():
        _read_settings(conn)
        query, params = _instances_query(with_candidates(conn, f), limit, after)
        return conn.cursor(row_factory=class_row(InventoryRow)).execute(query, params).fetchall()


def _read_settings(conn: psycopg.Connection) -> None:
    """For the open transaction: not JIT-compiled (the planner's estimates over the view's joins pass
    jit_above_cost for queries that read an index range, and compiling cost more than running
    them), and each statement planned for its parameters. kl serve runs these on pooled
    connections, where psycopg prepares a statement at its sixth run and PostgreSQL may then plan it
    generically, blind to the states, the type and the values: at 10,000 states and 1,000,000
    instances such a plan listed a page in 28 s where one for its parameters took 2 s (a --where
    page: 59 s against 7)."""
    conn.execute("SET LOCAL jit = off")
    conn.execute("SET LOCAL plan_cache_mode = force_custom_plan")


# Rows fetched at a time from a streamed listing: enough to amortize the round trips, few enough
# that a million-instance fleet is never held at once.
STREAM_BATCH = 2000


def stream_instances(conn: psycopg.Connection, f: Filters) -> Iterator[InventoryRow]:
    """instances() of F, all of them, read through a server-side cursor a batch at a time (one
    transaction, held while the caller consumes them): `kl resources` of a whole fleet."""
    with conn.transaction():
        _read_settings(conn)
        query, params = _instances_query(with_candidates(conn, f), None, None)
        with conn.cursor(name="kl_resources", row_factory=class_row(InventoryRow)) as cur:
            cur.itersize = STREAM_BATCH
            cur.execute(query, params)
            yield from cur


def kinds(conn: psycopg.Connection, f: Filters) -> list[InstanceKind]:
    """The (provider, mode, type) of every open instance of F's type and provider, in any state:
    whose schemas say where a value at a path is stored and whether it is secret. More kinds than
    F's states hold (or than hold the attribute) only add hints that match nothing."""
    with conn.transaction():
        _read_settings(conn)
        return conn.cursor(row_factory=class_row(InstanceKind)).execute(OPEN_KINDS, {
            "type": f.type, "regex": f.type_regex, "source": f.provider_source}).fetchall()


def filters(conn: psycopg.Connection, state_ids: list[str] | None, type_glob: str | None, provider: str | None,
            address: str | None, wheres: list[tuple[sch.AttributePath, list[str]]], drifted: bool) -> Filters:
    """The store's filters: a type glob without wildcards is an exact type (the index's), each
    condition with what the cached schemas say of its path (where the value is stored, whether it
    is secret)."""
    from kilolock import attrsearch, globs
    from kilolock.store import history

    base = Filters(
        state_ids=state_ids,
        type=type_glob if type_glob and not globs.is_glob(type_glob) else None,
        type_regex=globs.sql_regex(type_glob) if type_glob and globs.is_glob(type_glob) else None,
        provider_source=provider, address_regex=globs.address_regex(address) if address else None, drifted=drifted)
    out = []
    found = kinds(conn, base) if wheres else []
    schemas = history.cached_schemas(conn, attrsearch.schema_keys(found))
    for path, values in wheres:
        hints = attrsearch.hints(found, schemas, path)
        # The attribute index answers for the values where every type keeps them at the path itself.
        contains = None if hints.stored_paths else attrsearch.containing(path, values)
        out.append(Where(attrsearch.path_steps(path), values, hints.secret_types, hints.stored_paths,
                         contains.documents if contains else (), bool(contains and contains.exact)))
    return Filters(**{**base.__dict__, "wheres": tuple(out)})


# --- duplicates ---------------------------------------------------------------------------------

# Objects claimed by more than one open managed instance (as the latest observations saw them):
# `certain` where the identity keys are one, `likely` where the ids are one and the provider
# configurations match (the same stored configuration, the state's own winning over the global one
# as a refresh reads it, or none on either side) and at least one claim has no identity (two
# identities that differ are two objects). An id alone is weak: the same name in two accounts, or
# local_file's hash of its content. Claims outside STATE_IDS are shown too, for a group with one inside.
# An id an encrypted state's index holds masked (redact.MASK) names no object.
# The repeated keys and ids are found in one pass over their indexes (any mode: the index answers
# alone, and a group with one managed claim is dropped below), then their claims read by the
# index a group (OFFSET 0 keeps each a probe: the planner, guessing the groups from the distinct
# ids, would hash every instance to join a few hundred groups). Tested with IN, over 1,000,000 instances with distinct ids, the planner could not
# hash the ids' groups in work_mem and read them again for every instance: minutes.
DUPLICATES = """
WITH keys AS MATERIALIZED (
    SELECT provider_source, type, identity_key FROM resource_identities
    WHERE identity_key IS NOT NULL AND NOT gone GROUP BY 1, 2, 3 HAVING count(*) > 1
),
ids AS MATERIALIZED (
    SELECT provider_source, type, object_id FROM resource_identities
    WHERE object_id IS NOT NULL AND object_id <> '(sensitive)' AND NOT gone GROUP BY 1, 2, 3 HAVING count(*) > 1
),
claims AS MATERIALIZED (
    SELECT x.resource_id, x.state_id, x.provider_source, x.provider_alias, x.type, x.identity_key, x.object_id
    FROM keys k CROSS JOIN LATERAL (
        SELECT * FROM resource_identities x
        WHERE (x.provider_source, x.type, x.identity_key) = (k.provider_source, k.type, k.identity_key)
          AND NOT x.gone AND x.mode = 'managed' OFFSET 0) x
    UNION
    SELECT x.resource_id, x.state_id, x.provider_source, x.provider_alias, x.type, x.identity_key, x.object_id
    FROM ids i CROSS JOIN LATERAL (
        SELECT * FROM resource_identities x
        WHERE (x.provider_source, x.type, x.object_id) = (i.provider_source, i.type, i.object_id)
          AND NOT x.gone AND x.mode = 'managed' OFFSET 0) x
),
configured AS (
    SELECT c.*, (SELECT p.config FROM provider_configs p
                 WHERE p.source = c.provider_source AND p.alias = c.provider_alias
                   AND (p.state_id = c.state_id OR p.state_id IS NULL)
                 ORDER BY p.state_id IS NULL LIMIT 1) AS config
    FROM claims c WHERE c.object_id IS NOT NULL
),
groups AS (
    SELECT 'certain' AS confidence, 'identity' AS evidence, provider_source, type, identity_key AS key,
           array_agg(resource_id) AS ids
    FROM claims WHERE identity_key IS NOT NULL GROUP BY provider_source, type, identity_key HAVING count(*) > 1
    UNION ALL
    SELECT 'likely', 'id', provider_source, type, object_id, array_agg(resource_id)
    FROM configured GROUP BY provider_source, type, object_id, config HAVING count(*) > 1 AND bool_or(identity_key IS NULL)
)
SELECT g.confidence, g.evidence, g.provider_source AS provider, g.type, g.key,
       (array_agg(x.state_id::text ORDER BY s.name, r.address, r.deposed))[1] AS first_state_id,
       (array_agg(s.name ORDER BY s.name, r.address, r.deposed))[1] AS first_state,
       jsonb_agg(jsonb_build_object('state', s.name, 'address', r.address, 'deposed', NULLIF(r.deposed, ''),
                                    'provider_alias', NULLIF(x.provider_alias, ''), 'id', x.object_id,
                                    'identity', x.identity, 'identity_schema_version', x.identity_schema_version)
                 ORDER BY s.name, r.address, r.deposed) AS claims
FROM groups g
CROSS JOIN LATERAL unnest(g.ids) AS u(rid)
JOIN resource_identities x ON x.resource_id = u.rid
JOIN resources r ON r.id = u.rid
JOIN states s ON s.id = x.state_id
GROUP BY g.confidence, g.evidence, g.provider_source, g.type, g.key
HAVING %(state_ids)s::uuid[] IS NULL OR bool_or(x.state_id = ANY(%(state_ids)s::uuid[]))
ORDER BY g.provider_source, g.type, min(s.name), g.confidence, g.key
"""


# A page of them, for the API: in an order a cursor can resume (DUPLICATE_KEY of kilolock.inventory),
# not the CLI's (by its first claim's state, which may be one the caller may not read).
_DUPLICATES_PAGE = f"""
SELECT d.confidence, d.evidence, d.provider, d.type, d.key, d.claims, md5(d.claims::text) AS claims_hash
FROM ({DUPLICATES}) d
WHERE %(after)s::text[] IS NULL
   OR (d.provider, d.type, d.confidence, d.key, md5(d.claims::text))
      > (%(after)s[1], %(after)s[2], %(after)s[3], %(after)s[4], %(after)s[5])
ORDER BY d.provider, d.type, d.confidence, d.key, md5(d.claims::text)
LIMIT %(limit)s
"""


def duplicates_page(conn: psycopg.Connection, state_ids: Sequence[str] | None, limit: int,
                    after: Sequence[str] | None = None) -> list[DuplicatesPageRow]:
    """Up to LIMIT groups of duplicates() (with ``claims_hash``, their place in the pages), after the
    one whose DUPLICATE_KEY is AFTER."""
    with conn.transaction():
        _read_settings(conn)
        return conn.cursor(row_factory=class_row(DuplicatesPageRow)).execute(_DUPLICATES_PAGE, {
            "state_ids": None if state_ids is None else list(state_ids), "after": None if after is None else list(after), "limit": limit}).fetchall()


def duplicates(conn: psycopg.Connection, state_ids: Sequence[str] | None = None) -> list[Duplicate]:
    """Each object claimed more than once (DUPLICATES) with one of its claims in STATE_IDS (None:
    any): ``confidence``, ``evidence``, ``provider``, ``type``, ``key`` (the identity key or the id)
    and ``claims`` (``state``, ``address``, ``deposed``, ``provider_alias``, ``id``, ``identity``,
    ``identity_schema_version`` each)."""
    with conn.transaction():
        _read_settings(conn)
        rows = conn.cursor(row_factory=dict_row).execute(
            DUPLICATES, {"state_ids": None if state_ids is None else list(state_ids)}).fetchall()
    return [Duplicate(confidence=r["confidence"], evidence=r["evidence"], provider=r["provider"], type=r["type"],
                      key=r["key"], claims=r["claims"]) for r in rows]
