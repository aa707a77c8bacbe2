"""Invariant checks shared by the database-fault, concurrency and chaos tests (and the chaos runner).

What must hold after any fault, checked against the database and the process table only:
- versions: serials strictly increase and every stored version parses as Terraform state;
- lifecycles: the `resources` rows, and the drift records, equal what a re-index of the stored
  versions from scratch gives (replayed through kl's own write path inside a transaction that is
  rolled back);
- audit: no refresh_runs row is left `running` by a finished process;
- locks: no state lock is left behind by a refresh;
- processes: no provider (or kl) process carrying our mark outlives the run (kit.procs).
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import psycopg

# What the lifecycle index holds, minus row ids: the same history gives the same rows.
_LIFECYCLE_COLS = ("address", "deposed", "mode", "type", "name", "module", "index_key", "provider", "schema_version",
                   "status", "attributes", "sensitive_attributes", "content_hash", "create_serial", "delete_serial")


def _lifecycle_rows(conn: psycopg.Connection, state_id: str) -> list[tuple]:
    cols = ", ".join(f"r.{c}" for c in _LIFECYCLE_COLS)
    # The version links must agree with the serials they stand for.
    return conn.execute(
        f"""SELECT {cols}, o.serial = r.create_serial, (c.serial IS NOT DISTINCT FROM r.delete_serial)
            FROM resources r JOIN state_versions o ON o.id = r.opened_by_version_id
            LEFT JOIN state_versions c ON c.id = r.closed_by_version_id
            WHERE r.state_id = %s ORDER BY r.address, r.deposed, r.create_serial""",
        (state_id,),
    ).fetchall()


# What a drift record holds, minus ids: the same history gives the same records.
_DRIFT_COLS = ("address", "deposed", "kind", "changed_attributes", "first_detected_serial", "detected_serial",
               "resolved_serial", "resolved_how")


def _drift_rows(conn: psycopg.Connection, state_id: str) -> list[tuple]:
    return conn.execute(
        f"""SELECT {", ".join(f"d.{c}" for c in _DRIFT_COLS)}, b.create_serial, cur.create_serial
            FROM drift_records d JOIN resources b ON b.id = d.baseline_resource_id
            LEFT JOIN resources cur ON cur.id = d.current_resource_id
            WHERE d.state_id = %s ORDER BY d.address, d.deposed, d.first_detected_serial""",
        (state_id,),
    ).fetchall()


def reindex_mismatches(db_url: str, state: str) -> list[str]:
    """Differences between the stored lifecycle rows of STATE and a re-index from scratch: every
    stored version replayed in serial order into a scratch state by kl's own writes.store_document (the full,
    unscoped index), in a transaction that is rolled back. [] when they agree."""
    from kilolock import tfstate
    from kilolock.store import states, writes

    with psycopg.connect(db_url) as conn:  # not autocommit: everything below is one transaction
        sid = states.state_id(conn, state)
        stored = _lifecycle_rows(conn, sid)
        rows = conn.execute(
            "SELECT serial, source, actor, kl_version_document(id)::text, encrypted FROM state_versions WHERE state_id = %s ORDER BY serial",
            (sid,),
        ).fetchall()
        scratch = f"kl-reindex-{uuid.uuid4().hex}"
        for serial, source, actor, text, encrypted in rows:
            if encrypted:
                continue
            writes.store_document(conn, scratch, tfstate.parse_state(text, origin=f"v{serial}"), text.encode(),
                                  source=source, actor=actor, force=True)
        rebuilt = _lifecycle_rows(conn, states.state_id(conn, scratch))
        drift_stored, drift_rebuilt = _drift_rows(conn, sid), _drift_rows(conn, states.state_id(conn, scratch))
        conn.rollback()
    out = []
    stored_set, rebuilt_set = set(map(repr, stored)), set(map(repr, rebuilt))
    for r in stored:
        if repr(r) not in rebuilt_set:
            out.append(f"stored lifecycle row not in a re-index: {r[0]} create={r[13]} delete={r[14]} links_ok={r[-2:]}")
    for r in rebuilt:
        if repr(r) not in stored_set:
            out.append(f"re-index has a lifecycle row the store lacks: {r[0]} create={r[13]} delete={r[14]}")
    if drift_stored != drift_rebuilt:
        out.append(f"drift records differ from a re-index: stored {drift_stored}, re-indexed {drift_rebuilt}")
    return out


def version_problems(db_url: str, state: str) -> list[str]:
    """Serials strictly increasing (by creation order), and every version parsing as a state."""
    from kilolock import tfstate

    out = []
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            """SELECT v.serial, kl_version_document(v.id)::text, v.encrypted FROM state_versions v JOIN states s ON s.id = v.state_id
               WHERE s.name = %s ORDER BY v.created_at, v.serial""",
            (state,),
        ).fetchall()
    last = None
    for serial, text, encrypted in rows:
        if last is not None and serial <= last:
            out.append(f"serial {serial} stored after serial {last}")
        last = serial
        if encrypted:
            continue
        try:
            parsed = tfstate.parse_state(text, origin=f"v{serial}")
        except Exception as exc:  # noqa: BLE001 - any failure to parse is the finding
            out.append(f"v{serial} does not parse: {exc}")
            continue
        if parsed.serial != serial:
            out.append(f"v{serial} holds serial {parsed.serial}")
    return out


def running_runs(db_url: str) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT id, started_at FROM refresh_runs WHERE status = 'running' OR finished_at IS NULL").fetchall()


def state_locks(db_url: str) -> list[tuple]:
    with psycopg.connect(db_url) as conn:
        return conn.execute("SELECT s.name, l.operation, l.who FROM state_locks l JOIN states s ON s.id = l.state_id").fetchall()


def kl_backends(db_url: str) -> list[int]:
    """Server pids of kl's own connections (application_name 'kilolock') to this database."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        return [r[0] for r in conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND application_name = 'kilolock'"
            " AND pid <> pg_backend_pid()")]


def terminate_kl_backends(db_url: str) -> int:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return sum(1 for (ok,) in conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'kilolock' AND pid <> pg_backend_pid()") if ok)


def wait_for(predicate, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(every)


def event_count(events: Path, name: str) -> int:
    return sum(1 for line in events.read_text().splitlines() if line == name)
