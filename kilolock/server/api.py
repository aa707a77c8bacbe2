"""The read-only JSON API for tools: states, versions, drift (sensitive values masked), health."""
from __future__ import annotations

from collections.abc import Callable, Mapping

import psycopg

from kilolock.server.backend import Response, json_body, text
from kilolock.store import db, summary
from kilolock.store import drift as drift_store
from kilolock.store import versions as versions_store
from kilolock.store.errors import StateNotFound


def states(conn: psycopg.Connection, may_read: Callable[[str], bool] | None = None) -> Response:
    """Every state, or with ``may_read`` (a principal's grants) those it may read."""
    rows = summary.states_as_json(conn)
    listed = ", ".join(obj for name, obj in rows if may_read is None or may_read(name))
    return Response(200, f'{{"version": 1, "states": [{listed}]}}\n'.encode(), "application/json")


def _no_such_state(name: str) -> Response:
    # Not StateNotFound's own message: that one suggests a kl command, and an HTTP client gets
    # what the API offers instead.
    return text(404, f"no state named {name!r} (GET /api/v1/states lists them)")


def versions(conn: psycopg.Connection, name: str) -> Response:
    try:
        found = versions_store.list_versions(conn, name)
    except StateNotFound:
        return _no_such_state(name)
    rows = [{"serial": v.serial, "lineage": v.lineage, "source": v.source, "terraform_version": v.terraform_version,
             "actor": v.actor, "created_at": v.created_at, "content_hash": v.content_hash, "encrypted": v.encrypted}
            for v in found]
    return json_body(200, {"version": 1, "state": name, "versions": rows})


def drift_report(conn: psycopg.Connection, name: str, include_resolved: bool = False) -> Response:
    """The drift document of `kl drift --format json [--all]`, sensitive values masked."""
    try:
        return json_body(200, drift_store.document(conn, name, include_resolved=include_resolved))
    except StateNotFound:
        return _no_such_state(name)


MAX_RESOURCES_PAGE = 1000


def resources(conn: psycopg.Connection, params: Mapping[str, list[str]], may_read: Callable[[str], bool]) -> Response:
    """`kl resources --format json` of the states the caller may read, a page at a time:
    ``states``, ``type``, ``provider``, ``address`` (globs and a source as the CLI's options),
    ``where`` (repeatable PATH=VALUE), ``drifted=1``, ``limit`` (default 100, at most
    MAX_RESOURCES_PAGE) and ``cursor`` (the previous page's ``next_cursor``). ``duplicates=1``:
    `kl resources --duplicates` instead (see _duplicates)."""
    from kilolock import globs, inventory
    from kilolock.errors import UsageError
    from kilolock.store import inventory as inventory_store

    def one(key: str) -> str | None:
        values = params.get(key) or []
        return values[-1] if values and values[-1] != "" else None

    if one("duplicates") in ("1", "true"):
        return _duplicates(conn, params, one, may_read)
    try:
        glob = one("states") or "**"
        globs.compile_glob(glob)
        type_glob = inventory.type_glob(t) if (t := one("type")) else None
        provider = inventory.provider_source(p) if (p := one("provider")) else None
        address = globs.check_address_glob(a) if (a := one("address")) else None
        wheres = [inventory.where(w) for w in params.get("where") or [] if w]
        limit = _page_limit(one)
        after = inventory.read_cursor(c) if (c := one("cursor")) else None
    except UsageError as exc:
        return text(400, str(exc))
    with conn.transaction():
        f = inventory_store.filters(conn, _readable_state_ids(conn, glob, may_read), type_glob, provider, address, wheres,
                              one("drifted") in ("1", "true"))
        rows = inventory_store.instances(conn, f, limit=limit + 1, after=after)
    more = len(rows) > limit
    rows = rows[:limit]
    return json_body(200, {"version": 1, "resources": [dict(r) for r in rows],  # COLUMNS, in order
                           "next_cursor": inventory.cursor_after(rows[-1]) if more else None})


def _readable_state_ids(conn: psycopg.Connection, glob: str, may_read: Callable[[str], bool]) -> list[str] | None:
    """The ids of the states GLOB matches that the caller may read: what a resources page lists
    (None: every state, which the store reads by its indexes rather than as a list of 10,000 ids)."""
    from kilolock import globs
    from kilolock.store import ui_queries

    every = ui_queries.state_names(conn)
    names = [n for n in globs.select(glob, every) if may_read(n)]
    return None if len(names) == len(every) else ui_queries.state_ids(conn, names)


def _page_limit(one: Callable[[str], str | None]) -> int:
    from kilolock.errors import UsageError

    limit_text = one("limit") or "100"
    if not limit_text.isdigit() or not 1 <= int(limit_text) <= MAX_RESOURCES_PAGE:
        raise UsageError(f"limit {limit_text!r} is not a whole number from 1 to {MAX_RESOURCES_PAGE}")
    return int(limit_text)


def _duplicates(conn: psycopg.Connection, params: Mapping[str, list[str]], one: Callable[[str], str | None],
                may_read: Callable[[str], bool]) -> Response:
    """`kl resources --duplicates --format json` a page at a time: the objects claimed more than
    once with a claim in a state (of ``states``) the caller may read. A claim in a state it may not
    read is counted (``hidden_claims``), not named, as the web UI's discovery page does."""
    from kilolock import globs, inventory
    from kilolock.errors import UsageError
    from kilolock.store import inventory as inventory_store

    try:
        other = next((k for k in ("type", "provider", "address", "where", "drifted") if one(k) is not None), None)
        if other is not None:
            raise UsageError(f"duplicates=1 takes states, limit and cursor only, not {other}")
        glob = one("states") or "**"
        globs.compile_glob(glob)
        limit = _page_limit(one)
        after = inventory.read_duplicates_cursor(c) if (c := one("cursor")) else None
    except UsageError as exc:
        return text(400, str(exc))
    with conn.transaction():
        groups = inventory_store.duplicates_page(conn, _readable_state_ids(conn, glob, may_read), limit + 1, after)
    more = len(groups) > limit
    groups = groups[:limit]
    shown = [{"confidence": g["confidence"], "evidence": g["evidence"], "provider": g["provider"], "type": g["type"],
              "key": g["key"], "claims": [c for c in g["claims"] if may_read(c["state"])],
              "hidden_claims": sum(1 for c in g["claims"] if not may_read(c["state"]))} for g in groups]
    return json_body(200, {"version": 1, "duplicates": shown,
                           "next_cursor": inventory.duplicates_cursor_after(groups[-1]) if more else None})


def health(conn: psycopg.Connection) -> Response:
    db.ping(conn)
    return json_body(200, {"status": "ok"})
