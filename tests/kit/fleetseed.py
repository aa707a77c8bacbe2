"""A fleet of states in seconds, for the fleet-scale benches (benches/test_fleet_views.py): a few template states written through
kl's own write path (an import, an apply, refresh runs that each record an observation, some of
them finding drift), then cloned set-based, table by table, into as many states as asked.

Sizes are drawn like real fleets (most states under 50 instances, a few over 5,000): SIZES gives
each template's instance count and its share of the fleet; 10,000 states hold about 1,000,000
instances. A tenth of the states have open drift (one instance), as the templates marked `drift`.

The clone keeps every row kl wrote, with its ids remapped per copy (a uuid through md5, a bigint by
an offset above every id used), so each copy is a state as kl would have written it: versions
stored as pieces, the lifecycle index, observations, drift records and refresh runs.

The states hold null_resources by default; DOCUMENT (seed(), templates()) makes them of another
provider (fake_document: the fault-injecting fake's, for the fleet simulation), and SEARCH_PATHS
is stored in every state's settings (cloned with it), where a refresh finds that provider."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import psycopg

# (instances, share of the fleet's states); the shares sum to 1.
SIZES: tuple[tuple[int, float], ...] = (
    (3, 0.202), (8, 0.20), (15, 0.20), (30, 0.15), (45, 0.10),
    (100, 0.07), (300, 0.045), (1_000, 0.025), (6_000, 0.008),
)
DRIFTING = 0.1  # share of the states with open drift
RUNS = 6  # refresh runs per template state: the last one found the drift (drifting templates)

# The tables that hold a state's rows, in an order their foreign keys allow.
TABLES = ("states", "state_settings", "version_pieces", "version_lists", "state_versions", "resources",
          "observed_objects", "drift_records", "refresh_runs", "refresh_run_last", "refresh_run_durations")
NULL = 'provider["registry.terraform.io/hashicorp/null"]'


def _document(serial: int, instances: int, rev: int, drifted: int | None = None) -> bytes:
    resources = [{"mode": "managed", "type": "null_resource", "name": f"n{i}", "provider": NULL,
                  "instances": [{"schema_version": 0, "sensitive_attributes": [],
                                 "attributes": {"id": f"{i:08d}", "triggers": {
                                     "rev": str(rev if i == 0 else 1),
                                     "drift": "changed" if i == drifted else "no"}}}]}
                 for i in range(instances)]
    return json.dumps({"version": 4, "terraform_version": "1.8.5", "serial": serial, "lineage": "fleet",
                       "outputs": {}, "resources": resources}).encode()


# (serial, instances, rev, the instance drifted or None) -> a state document
Document = Callable[[int, int, int, "int | None"], bytes]
FAKE_PRIVATE = "a2VwdA=="  # what the fake's reads keep (FAKE_READ_PRIVATE=keep): a refresh finds nothing new


def fake_document(serial: int, instances: int, rev: int, drifted: int | None = None) -> bytes:
    """Instances of the fake provider's fake_slow (kit.faults), as its reads answer them with
    FAKE_READ_PRIVATE=keep: a refresh against the fake observes what Terraform's version holds."""
    from kit.faults import FAKE_SOURCE

    sensitive = [[{"type": "get_attr", "value": "secret"}]]
    resources = [{"mode": "managed", "type": "fake_slow", "name": f"r{i}", "provider": f'provider["{FAKE_SOURCE}"]',
                  "instances": [{"schema_version": 2, "sensitive_attributes": sensitive, "private": FAKE_PRIVATE,
                                 "attributes": {"id": f"id{i}", "secret": "hunter2", "rule": [],
                                                "value": "changed" if i == drifted else str(rev if i == 0 else 1)}}]}
                 for i in range(instances)]
    return json.dumps({"version": 4, "terraform_version": "1.8.5", "serial": serial, "lineage": "fleet",
                       "outputs": {}, "resources": resources}).encode()


def _template(conn: psycopg.Connection, name: str, instances: int, drift: bool, document: Document,
              search_paths: list[str] | None) -> None:
    """Import v1, apply v2 (one instance changed), then RUNS refreshes: all confirm v2 but the
    last one of a drifting state, which observes one instance changed."""
    from kilolock import tfstate
    from kilolock.store import refresh_runs, settings, states, versions, writes

    v1 = document(1, instances, 1, None)
    writes.store_document(conn, name, tfstate.parse_state(v1), v1, source="import", actor="seed")
    v2 = document(2, instances, 2, None)
    writes.store_document(conn, name, tfstate.parse_state(v2), v2, source="apply", actor="seed")
    sid = states.state_id(conn, name)
    if search_paths is not None:
        settings.update(conn, sid, settings.Changes({"provider_search_paths": search_paths}), "seed")
    last = json.loads(v2)["resources"][-1]
    drifted_address = f"{last['type']}.{last['name']}"
    base = versions.current_version(conn, sid)
    assert base is not None
    for n in range(RUNS):
        found = drift and n == RUNS - 1
        run = refresh_runs.begin(conn, sid, base.id, "seed")
        raw = document(2, instances, 2, instances - 1 if found else None)
        seen = writes.record_observation(conn, name, tfstate.parse_state(raw), raw, base=base,
                                         touched={(drifted_address, "")} if found else set(),
                                         same_as_base=not found, actor="seed")
        refresh_runs.finish(conn, run, status="succeeded", checked=instances, changed=int(found), failed=0,
                            error_summary=None, to_version_id=seen.version.id)


def _columns(conn: psycopg.Connection, table: str) -> list[tuple[str, str]]:
    return [(str(r[0]), str(r[1])) for r in conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %s::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (table,)).fetchall()]


def _remapped(conn: psycopg.Connection, table: str) -> set[str]:
    """Columns of TABLE holding the id of a row that is cloned with it: its own key and every
    reference to a cloned table (by foreign key, or attributes_of, a reference without one)."""
    rows = conn.execute("""
        SELECT a.attname FROM pg_constraint c
        JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY(c.conkey)
        WHERE c.conrelid = %s::regclass AND (c.contype = 'p' OR (c.contype = 'f' AND c.confrelid::regclass::text = ANY(%s)))
    """, (table, list(TABLES))).fetchall()
    return {str(r[0]) for r in rows} | ({"attributes_of"} if table == "version_pieces" else set())


def _clone_sql(conn: psycopg.Connection, table: str) -> str:
    keep = _remapped(conn, table)
    exprs = []
    for col, typ in _columns(conn, table):
        q = f'"{col}"'
        if table == "states" and col == "name":
            exprs.append("t.name || '/' || lpad(c.n::text, 5, '0')")
        elif table == "version_lists" and col == "items":
            exprs.append("ARRAY(SELECT sign(x) * (abs(x) + c.n * %(offset)s) FROM unnest(t.items) x)::bigint[]")
        elif col in keep and typ == "uuid":
            exprs.append(f"md5(t.{q}::text || '/' || c.n)::uuid")
        elif col in keep and typ == "bigint":
            exprs.append(f"t.{q} + c.n * %(offset)s")
        else:
            exprs.append(f"t.{q}")
    key = "id" if table == "states" else "state_id"
    names = ", ".join(f'"{c}"' for c, _ in _columns(conn, table))
    return (f"INSERT INTO {table} ({names}) SELECT {', '.join(exprs)} FROM {table} t "
            f"JOIN kl_seed_copies c ON c.template = t.{key}")


def _plan(states: int, prefix: str) -> list[tuple[str, int, bool, int]]:
    """(template name, instances, drifting, copies) for a fleet of STATES states."""
    plan = []
    for size, share in SIZES:
        for drift, part in ((True, DRIFTING), (False, 1 - DRIFTING)):
            plan.append((f"{prefix}/{size}-{'drift' if drift else 'clean'}", size, drift, max(1, round(states * share * part))))
    biggest = max(range(len(plan)), key=lambda i: plan[i][3])
    plan[biggest] = (*plan[biggest][:3], plan[biggest][3] + states - sum(p[3] for p in plan))  # exactly STATES
    return plan


def templates(url: str, prefix: str = "fleet", document: Document = _document,
              search_paths: list[str] | None = None) -> None:
    """The template states (one per size, drifting and not), written through kl's write path: a
    database to clone (CREATE DATABASE ... TEMPLATE) before seed()."""
    with psycopg.connect(url, autocommit=True) as conn:
        for name, size, drift, _ in _plan(len(SIZES) * 2, prefix):
            _template(conn, name, size, drift, document, search_paths)


def seed(url: str, states: int, prefix: str = "fleet", document: Document = _document,
         search_paths: list[str] | None = None) -> dict[str, Any]:
    """STATES states named PREFIX/<size>-<drift|clean>/NNNNN, cloned from the templates (written
    first by templates() unless the database holds them), as the module says; returns what it made."""
    started = time.perf_counter()
    plan = _plan(states, prefix)
    with psycopg.connect(url, autocommit=True) as conn:
        if conn.execute("SELECT count(*) FROM states").fetchone() == (0,):
            templates(url, prefix, document, search_paths)
        templated = time.perf_counter()
        with conn.transaction():
            # Triggers off (foreign keys included) while rows whose references are already right go in.
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute("CREATE TEMP TABLE kl_seed_copies (template uuid, n int) ON COMMIT DROP")
            conn.execute("""
                INSERT INTO kl_seed_copies SELECT s.id, g FROM states s
                JOIN unnest(%s::text[], %s::int[]) p(name, copies) ON p.name = s.name, generate_series(1, p.copies - 1) g
            """, ([p[0] for p in plan], [p[3] for p in plan]))
            offset = max(int(conn.execute(f"SELECT COALESCE(max(id), 0) FROM {t}").fetchone()[0])  # type: ignore[index]
                         for t in ("version_pieces", "version_lists")) + 1
            for table in TABLES:
                conn.execute(_clone_sql(conn, table).replace("%(offset)s", str(offset)))
            for table in ("version_pieces", "version_lists"):
                conn.execute(f"SELECT setval(pg_get_serial_sequence('{table}', 'id'), (SELECT max(id) FROM {table}))")
            # Each template is its own copy 0: every state is named alike.
            conn.execute("UPDATE states SET name = name || '/00000' WHERE name = ANY(%s)", ([p[0] for p in plan],))
        conn.execute("VACUUM ANALYZE")
        counts = conn.execute("""
            SELECT (SELECT count(*) FROM states), (SELECT count(*) FROM resources WHERE delete_serial IS NULL),
                   (SELECT count(*) FROM current_resource_drift), (SELECT count(*) FROM refresh_runs)
        """).fetchone()
    assert counts is not None
    return {"states": counts[0], "instances": counts[1], "open_drift": counts[2], "runs": counts[3],
            "templates_s": templated - started, "clone_s": time.perf_counter() - templated}
